"""What the dashboard shows, as typed JSON: the experiments table, one experiment's submissions,
its score-over-time chart for each scoring protocol, and its run metrics. Read-only.

A sealed experiment's agent submissions are scored on validation: its chart plots them against the
baseline on validation, and its one final evaluation on the test split apart, against the baseline
on test (docs/PROTOCOL.md)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field
from sqlalchemy.orm import Session

from autorl.api.answers import Comparison, FinalResult
from autorl.runs.reports import RunRecord, compute_metrics
from autorl.store import Experiment, Split, Submission, SubmissionStatus
from autorl.store import experiments as experiment_store
from autorl.store import submissions as submission_store
from autorl.tasks.gsm8k import PROTOCOLS
from autorl.untrusted_text import Printable, printable
from autorl_grader.views import Availability, experiment_view, submission_view, totals_by_split

#: Free text as the dashboard shows it: a character that would not show as itself (a control
#: character, a bidi override reversing a path, a zero-width space) escaped, whoever wrote it;
#: once, as every answer escapes it (a text the API escaped already shows as the API gives it).
Shown = Printable
#: The agent's log: its lines kept, everything else escaped as in :data:`Shown`.
ShownLines = Annotated[str, AfterValidator(lambda text: printable(text, multiline=True))]

_SCORE_COLUMNS = {"opencompass": "score_opencompass", "flexible": "score_flexible", "strict": "score_strict"}


class ShownFinal(FinalResult):
    """The experiment's result on the test split, its error shown as text."""

    error: Shown | None = None


class ExperimentRow(BaseModel):
    name: str
    phase: str = Field(description="pending, baseline, running, finishing, or how it ended")
    status: str
    task: Shown
    model: Shown
    agent: Shown | None
    driver_model: Shown | None
    protocol: str = Field(description="the scoring protocol of the headline score")
    baseline_score: float | None
    baseline_status: str | None
    best_score: float | None
    best_submission: int | None
    improvement: float | None
    submissions: int = Field(description="scored submissions of the agent")
    total_submissions: int
    failed_submissions: int
    refused_submissions: int = Field(
        0, description="submits refused after their weights were read, counted against the limit"
    )
    counted_submissions: int = Field(0, description="what counts against max_submissions")
    max_submissions: int
    queued: int
    running: int
    queue_position: int | None = Field(
        description="the position of its first waiting submission in the queue"
    )
    remaining_s: float | None
    timeout_s: int
    start_time: float | None
    end_time: float | None
    created_at: float | None
    message: Shown | None
    evaluators: int | None = Field(None, description="evaluators alive for its backend")
    waiting_reason: str | None = Field(None, description="why its baseline waits (autorl.wait_reasons)")
    waiting_message: Shown | None = Field(None, description="what it waits for and what to do")
    feedback: str = Field("test", description="test or sealed (docs/PROTOCOL.md)")
    validation_baseline_score: float | None = Field(
        None, description="sealed: the baseline on validation, which best_score and improvement are against"
    )
    final: ShownFinal | None = Field(None, description="the result on the test split (null while none)")
    test_evaluations: int = Field(0, description="evaluations of the agent's checkpoints on the test split")
    test_overlap: int | None = Field(None, description="test problems in the agent's files (null: not read)")
    twin_score: float | None = Field(None, description="the final on the twin split")
    twin_p_value: float | None = Field(None, description="its gap against the base model's, paired test")
    lineage: Shown | None = Field(None, description="the registered checkpoint it is nearer than the base")


class SubmissionRow(BaseModel):
    submission_id: int
    is_baseline: bool
    status: str
    score: float | None
    scores: dict[str, float | None]
    queue_position: int | None = None
    eval_seconds: float | None
    reused: bool
    reused_from: int | None
    error: Shown | None
    model_path: Shown
    created_at: float | None
    finished_at: float | None
    t_s: float | None = Field(description="seconds from the start of the budget to the submission")
    interval: list[float] | None = Field(None, description="95 % Wilson interval of the score, percent")
    comparison: Comparison | None = Field(None, description="against the baseline on the same problems")
    split: str = Field(description="the split it was scored on: test, or validation (sealed)")
    final_of: int | None = Field(
        None, description="sealed: this is the final test evaluation of the agent's submission final_of"
    )


class ChartPoint(BaseModel):
    submission_id: int
    t_s: float
    score: float
    reused: bool


class ChartFinal(BaseModel):
    """A sealed experiment's one evaluation on the test split, apart from the validation points."""

    submission_id: int
    of: int | None = Field(description="the agent's submission it evaluated")
    t_s: float
    score: float
    baseline: float | None = Field(description="the baseline on the test split")


class ChartSeries(BaseModel):
    split: str = Field(description="the split of the points and the baseline: test, or validation (sealed)")
    baseline: float | None
    best_submission: int | None
    points: list[ChartPoint]
    final: ChartFinal | None = Field(None, description="sealed: the final evaluation on test, once scored")


class Chart(BaseModel):
    headline: str
    origin: float = Field(description="epoch seconds of t_s = 0: the budget's start (or the registration)")
    protocols: dict[str, ChartSeries]


class ExperimentDetail(BaseModel):
    experiment: ExperimentRow
    submissions: list[SubmissionRow]
    chart: Chart
    metrics: dict[str, Any] = Field(description="the run's report metrics so far (see docs/LOCAL.md)")
    now: float


class ExperimentList(BaseModel):
    experiments: list[ExperimentRow]
    now: float


class LogTailView(BaseModel):
    available: bool
    text: ShownLines
    size_bytes: int
    truncated: bool
    reason: str | None


def _phase(view: dict[str, Any]) -> str:
    status = view["status"]
    if status == "pending":
        return "baseline" if view["baseline_status"] in ("queued", "running") else "pending"
    if status == "running":
        return "finishing" if view["remaining_s"] == 0 else "running"
    return str(status)


def experiment_row(
    session: Session, experiment: Experiment, availability: Availability | None = None
) -> ExperimentRow:
    view = experiment_view(session, experiment, availability).model_dump()
    waiting = view.pop("waiting", None) or {}
    unfinished = [
        s for s in submission_store.experiment_submissions(session, experiment) if not s.status.final
    ]
    queued = [s for s in unfinished if s.status == SubmissionStatus.QUEUED]
    # Merged over the admin view, so that a field it gains later never clashes with these.
    return ExperimentRow.model_validate(
        {
            **view,
            "phase": _phase(view),
            "protocol": str(experiment.eval_config.get("protocol", "opencompass")),
            "queued": len(queued),
            "running": len(unfinished) - len(queued),
            "queue_position": submission_store.queue_position(session, queued[0]) if queued else None,
            "waiting_reason": waiting.get("reason"),
            "waiting_message": waiting.get("message"),
        }
    )


def experiment_list(session: Session, availability: Availability | None = None) -> ExperimentList:
    return ExperimentList(
        experiments=[
            experiment_row(session, e, availability) for e in experiment_store.list_experiments(session)
        ],
        now=time.time(),
    )


def _origin(experiment: Experiment) -> float:
    return (experiment.start_time or experiment.created_at).timestamp()


def _score(rows: list[Submission], submission_id: int | None, column: str) -> float | None:
    row = next((s for s in rows if s.id == submission_id), None)
    return getattr(row, column) if row is not None else None


def _since(row: Submission, origin: float) -> float:
    return round(row.created_at.timestamp() - origin, 1)


def _series(experiment: Experiment, rows: list[Submission], protocol: str, origin: float) -> ChartSeries:
    """The agent's submissions on the split it is scored on, against the baseline there; a sealed
    experiment's final evaluation on test apart, against the baseline on test."""
    column = _SCORE_COLUMNS[protocol]
    split = experiment_store.feedback_split(experiment)
    baseline_id = (
        experiment.validation_baseline_submission_id
        if split == Split.VALIDATION
        else experiment.baseline_submission_id
    )
    points = [
        ChartPoint(
            submission_id=s.id,
            t_s=_since(s, origin),
            score=getattr(s, column),
            reused=s.reused_from is not None,
        )
        for s in rows
        if s.by_agent
        and s.split == split
        and s.status == SubmissionStatus.SCORED
        and getattr(s, column) is not None
    ]
    best = max(points, key=lambda p: (p.score, -p.submission_id), default=None)
    final_row = next((s for s in rows if s.id == experiment.final_submission_id), None)
    final = None
    if (
        final_row is not None
        and final_row.status == SubmissionStatus.SCORED
        and getattr(final_row, column) is not None
    ):
        final = ChartFinal(
            submission_id=final_row.id,
            of=final_row.final_of,
            t_s=_since(final_row, origin),
            score=getattr(final_row, column),
            baseline=_score(rows, experiment.baseline_submission_id, column),
        )
    return ChartSeries(
        split=split.value,
        baseline=_score(rows, baseline_id, column),
        best_submission=best.submission_id if best else None,
        points=points,
        final=final,
    )


def experiment_detail(
    session: Session, name: str, availability: Availability | None = None
) -> ExperimentDetail:
    experiment = experiment_store.get_experiment(session, name)
    rows = list(submission_store.experiment_submissions(session, experiment))
    totals = totals_by_split(session, experiment, rows)
    origin = _origin(experiment)
    submissions = []
    for row in rows:
        view = submission_view(session, experiment, row, totals[row.split]).model_dump(exclude_unset=True)
        submissions.append(
            SubmissionRow.model_validate(
                {
                    **view,
                    "reused": row.reused_from is not None,
                    "t_s": _since(row, origin),
                    "final_of": row.final_of,
                }
            )
        )
    now = time.time()
    return ExperimentDetail(
        experiment=experiment_row(session, experiment, availability),
        submissions=submissions,
        chart=Chart(
            headline=str(experiment.eval_config.get("protocol", "opencompass")),
            origin=origin,
            protocols={p: _series(experiment, rows, p, origin) for p in PROTOCOLS},
        ),
        metrics=compute_metrics(RunRecord.read(session, experiment), now),
        now=now,
    )
