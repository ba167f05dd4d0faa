"""The grader's answers as typed models: what the routes declare in the OpenAPI document and
what clients can parse. Field names are the API contract (the agent API keeps the reference's
names); a view producing a field not declared here is a server error, so the document and the
answers cannot drift apart. Fields only some answers carry (``queue_position``) are optional and
left out of the answer when absent."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl.protocol.feedback import Feedback, FeedbackField, Split

# The protocol's result types, which these answers carry (and their callers import from here).
from autorl.protocol.result import Comparison as Comparison
from autorl.protocol.result import FinalResult as FinalResult
from autorl.protocol.result import Pair
from autorl.protocol.result import SubmissionStatusName as SubmissionStatusName
from autorl.untrusted_text import Printable

#: A submission not evaluated yet: what a pending (202) answer carries.
PendingStatusName = Literal["queued", "running"]

#: A submission in one of these is done: its score (or its error) will not change any more.
FINAL_STATUSES = frozenset({"scored", "failed"})


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Refusal(BaseModel):
    """Every 4xx/5xx body: ``detail`` (FastAPI's field) and ``error`` (what reference clients read),
    the same text naming the fix."""

    detail: str
    error: str


#: An agent's submission ids count its experiment's own submissions (1, 2, ...), as the
#: reference's one server per run does; 0 is the baseline its scores are compared with. Operators'
#: answers (the admin API) carry the database's global ids.
SUBMISSION_ID = "your experiment's own count: 1, 2, ... (0: the baseline); the admin API's are global"


class Best(Answer):
    """The best scored submission, as the reference's ``best`` carries it: its whole entry (all
    null while nothing is scored)."""

    submission_id: int | None = Field(description=SUBMISSION_ID)
    score: float | None
    timestamp: str | None = Field(None, description="when it was received, ISO 8601 UTC")
    model_path: Printable | None = None
    baseline_score: float | None = None
    improvement: float | None = None
    elapsed_seconds: float | None = None


class ProtocolScores(Answer):
    opencompass: float | None
    flexible: float | None
    strict: float | None


class SubmissionAnswer(Answer):
    """One submission (or the baseline) as the agent and the operator see it."""

    submission_id: int = Field(description=SUBMISSION_ID)
    status: SubmissionStatusName
    score: float | None = Field(description="the headline protocol's accuracy in percent")
    split: Split = Field(
        Split.TEST,
        description="the split scored: test, or validation (every submission of a sealed experiment)",
    )
    scores: ProtocolScores
    baseline_score: float | None
    improvement: float | None
    best: Best
    total_submissions: int
    model_path: Printable
    timestamp: str | None = Field(
        description="when it was received, ISO 8601 UTC; of the baseline, null to the agent (as every "
        "time of the baseline: the platform's work before the agent's budget)"
    )
    elapsed_seconds: float | None
    is_baseline: bool
    reused_from: int | None = Field(
        description="this experiment's earlier submission whose score was reused (0: the baseline)"
    )
    n_samples: int | None
    eval_seconds: float | None
    attempts: int
    error: Printable | None
    ignored_files: list[Printable]
    created_at: float | None
    finished_at: float | None
    queue_position: int | None = Field(
        None,
        description="only while queued or running: the experiment's own submissions waiting ahead of "
        "it, plus one (0: being evaluated)",
    )
    number: int | None = Field(
        None,
        description="admin API only: the agent's number of this submission (the submission_id its "
        "agent is shown); null for a baseline or a sealed experiment's final evaluation",
    )
    interval: Pair | None = Field(
        None, description="95 % Wilson interval of the score in percent, [low, high]; null unless scored"
    )
    comparison: Comparison | None = Field(
        None,
        description="against the baseline on the same problems; null for the baseline itself, "
        "unless scored, or while the baseline is not",
    )
    lineage: str | None = Field(
        None,
        description="admin API only: the registered public checkpoint this checkpoint is nearer than "
        "the base (docs/PROTOCOL.md); null when the base is nearest or none is registered",
    )

    @property
    def final(self) -> bool:
        """Scored or failed: polling it again changes nothing."""
        return self.status in FINAL_STATUSES


class NominatedAnswer(Answer):
    """``POST /final``: the nomination is recorded; its test score is never shown to the agent."""

    submission_id: int = Field(description=SUBMISSION_ID)
    split: Split = Field(description="the split of the score the agent was shown: validation")
    score: float | None = Field(description="the nominated submission's validation score")
    message: str


#: How many times a sealed experiment's final test evaluation is made when each one fails for a
#: reason of the platform's (it computed no score, so the test split has still scored nothing);
#: the grader decides, so a client asks again after any failed final.
MAX_FINAL_ATTEMPTS = 3


class PendingAnswer(Answer):
    """A submission accepted and not scored yet (``?wait=false``, or the wait ran out): its split,
    and no interval or comparison yet (null), as every submission answer carries them."""

    submission_id: int = Field(description=SUBMISSION_ID)
    status: PendingStatusName
    queue_position: int | None = Field(
        description="your submissions waiting ahead of this one, plus one (0: being evaluated)"
    )
    ignored_files: list[Printable]
    split: Split = Field(Split.TEST, description="the split it will be scored on")
    interval: None = Field(None, description="null until scored")
    comparison: None = Field(None, description="null until scored")

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


#: ``GET /scores`` without ``limit`` lists this many submissions, or the experiment's
#: ``max_submissions`` where that is more (up to :data:`MAX_SCORES_PAGE`): as the reference, every
#: submission in one answer.
DEFAULT_SCORES_PAGE = 100
#: The most submissions one ``GET /scores`` page lists.
MAX_SCORES_PAGE = 1000


class ScoresAnswer(Answer):
    """``GET /scores[?after=N&limit=M]``: the experiment's submissions numbered above ``after``
    (default 0: from the first), oldest first, at most ``limit``; ``next_after`` is the ``after`` of
    the next page, null on the last."""

    experiment: str
    baseline_score: float | None
    best: Best
    total_submissions: int
    submissions: list[SubmissionAnswer]
    next_after: int | None = Field(
        None, description="more follow: ask again with ?after=this (null: this page is the last)"
    )


class TimeAnswer(Answer):
    start_time: float | None
    timeout_s: int | None
    end_time: float | None = Field(description="the budget's end (run_meta.json's deadline)")
    deadline: float | None = Field(None, description="the budget's end, as run_meta.json names it")
    remaining: float | None
    remaining_s: float | None
    last_submit_time: float | None
    now: float


class LiveAnswer(Answer):
    """``GET /healthz``: the process answers."""

    status: Literal["ok"]


class ReadyAnswer(Answer):
    """``GET /readyz``: the database and the queue answer (503 otherwise, a refusal whose ``status``
    is ``unavailable``)."""

    status: Literal["ready"]
    queue: str = Field(description="how evaluations are dispatched: rq (Redis) or local (this process)")


class HealthAnswer(Answer):
    status: str
    task: str | None = Field(None, description="the caller's experiment's task (null without its token)")
    workspace: str | None = Field(
        None, description="the caller's workspace as it sees it (null without its token)"
    )
    available_gpus: list[str]


class WaitingAnswer(Answer):
    """What the experiment's baseline waits for while no evaluator has taken it."""

    reason: str = Field(description="WaitingForEvaluator or EvaluatorsUnavailable (autorl.wait_reasons)")
    message: str = Field(description="what it waits for and what to do, for a person")
    queue_position: int = Field(description="its place in the order evaluators take work (1: next)")
    waited_s: float = Field(description="seconds since it was queued")


class ExperimentAnswer(Answer):
    """An experiment as the admin API shows it."""

    name: str
    task: str
    model: str
    agent: str | None
    driver_model: str | None
    status: str
    message: str | None
    baseline_score: float | None
    baseline_status: SubmissionStatusName | None
    baseline_submission: int | None
    baseline_error: Printable | None
    best_score: float | None
    best_submission: int | None
    improvement: float | None
    submissions: int
    total_submissions: int
    failed_submissions: int
    refused_submissions: int = Field(
        0,
        description="submits refused after the grader had read their weights: not submissions (no "
        "id), but each counts against max_submissions as one does",
    )
    counted_submissions: int = Field(
        0,
        description="what counts against max_submissions: the agent's submissions but those that failed "
        "for the platform's reasons (docs/AGENTS.md), and the refused submits above",
    )
    in_flight: int
    max_submissions: int
    timeout_s: int | None
    start_time: float | None
    end_time: float | None
    remaining_s: float | None
    last_submit_time: float | None
    created_at: float | None
    finished_at: float | None
    workspace: str
    eval_config: dict[str, Any]
    feedback: FeedbackField = Field(Feedback.TEST, description="docs/PROTOCOL.md")
    validation_baseline_score: float | None = Field(None, description="sealed: the baseline on validation")
    validation_baseline_status: SubmissionStatusName | None = None
    final: FinalResult | None = Field(
        None, description="the result on the test split (null while there is none)"
    )
    test_evaluations: int = Field(
        0,
        description="evaluations of the agent's checkpoints on the test split (baselines and reused "
        "scores excluded)",
    )
    test_overlap: int | None = Field(
        None, description="test problems found in the agent's files after it ended; null: not read"
    )
    twin_score: float | None = Field(None, description="the final on the twin split (new numbers)")
    twin_p_value: float | None = Field(
        None, description="paired test: the final's test-minus-twin gap exceeds the base model's"
    )
    lineage: str | None = Field(
        None,
        description="the registered public checkpoint a scored submission is nearer than the base "
        "(the final's, else the first such submission's); null otherwise",
    )
    evaluators: int | None = Field(
        None, description="evaluators alive that take work for this experiment's backend"
    )
    waiting: WaitingAnswer | None = Field(
        None, description="set while the baseline waits for an evaluator to take it"
    )


class RegisteredAnswer(ExperimentAnswer):
    """A new experiment, with its agent's credentials (shown once)."""

    token: str
    grading_server_url: str


class TokenAnswer(Answer):
    name: str
    token: str
    grading_server_url: str
