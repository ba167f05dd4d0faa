"""The dashboard's agent summary: the grader's experiments grouped by task, agent, base model and
feedback mode (autorl.runs.summary), as typed JSON. Read-only."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from autorl.protocol.final import results_columns
from autorl.runs.results import ROW_STATUS, succeeded
from autorl.runs.summary import RunOutcome, summarize
from autorl.store import Experiment, Submission, SubmissionStatus, experiments
from autorl.store import submissions as submission_store
from autorl_grader.dashboard.data import Shown
from autorl_grader.views import baseline_score

#: The agent of an experiment registered without one.
NO_AGENT = "–"


class AgentSummaryRow(BaseModel):
    """One group (autorl.runs.summary.AgentSummary), its names shown as text."""

    task: Shown
    agent: Shown
    model: Shown = Field(description="the base model")
    feedback: str = Field(description="test or sealed (docs/PROTOCOL.md)")
    runs: int = Field(
        description="experiments of this task, agent, model and feedback mode, running ones included"
    )
    succeeded: int = Field(description="completed (or out of budget) with at least one scored submission")
    scored_runs: int = Field(description="experiments with a best score: what the means are taken over")
    submissions: int = Field(description="scored submissions of the agent in all of them")
    baseline: float | None = Field(description="mean baseline on the test split")
    best_score: float | None = Field(
        description="the highest result on the test split: the best (test), the final score (sealed)"
    )
    mean_best_score: float | None
    best_improvement: float | None
    mean_improvement: float | None


class AgentSummaryList(BaseModel):
    groups: list[AgentSummaryRow]
    now: float


def outcome(session: Session, experiment: Experiment) -> RunOutcome:
    """What the summary reads of one experiment, as `autorl results` reads it of one run: every
    number on the test split (a sealed experiment's result is its final evaluation there)."""
    baseline = baseline_score(session, experiment)
    best_score = results_columns(session, experiment)["final_score"]
    scored = submission_store.agent_submissions_count(
        session, experiment, Submission.status == SubmissionStatus.SCORED
    )
    status = ROW_STATUS.get(experiment.status)  # as its results row records it; None: not finished
    return RunOutcome(
        task=experiment.task,
        agent=experiment.agent or NO_AGENT,
        model=experiment.model,
        feedback=experiment.feedback.value,
        baseline=baseline,
        best_score=best_score,
        improvement=None if best_score is None or baseline is None else best_score - baseline,
        submissions=scored,
        success=status is not None and succeeded(status, scored),
    )


def agent_summary(session: Session) -> AgentSummaryList:
    summaries = summarize(outcome(session, e) for e in experiments.list_experiments(session))
    return AgentSummaryList(groups=[AgentSummaryRow(**s.to_json()) for s in summaries], now=time.time())
