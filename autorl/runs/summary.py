"""The agent summary: runs grouped by task, agent, base model and feedback mode, with how many there
were, how many succeeded, and their best and mean scores. `autorl results --summary` computes it
from results.csv, the dashboard's summary page from the grader's experiments; both through
:func:`summarize`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from statistics import fmean
from typing import Any


@dataclass(frozen=True)
class RunOutcome:
    """What the summary reads of one run (a results.csv row, or one experiment of the grader)."""

    task: str
    agent: str
    model: str
    #: test or sealed: a test run's best (a maximum over its test scores) and a sealed run's one
    #: final evaluation are not the same measurement, so they are never grouped together.
    feedback: str
    baseline: float | None  # on the test split
    best_score: float | None  # on the test split: a test run's best, a sealed run's final score
    improvement: float | None
    submissions: int  # scored submissions
    success: bool  # completed with at least one scored submission


@dataclass(frozen=True)
class AgentSummary:
    """One group of runs of the same task, agent, base model and feedback mode."""

    task: str
    agent: str
    model: str
    feedback: str
    runs: int
    succeeded: int
    scored_runs: int  # runs with a best score: what the means are taken over
    submissions: int  # scored submissions of all its runs
    baseline: float | None  # mean baseline of its runs
    best_score: float | None  # the highest best score
    mean_best_score: float | None
    best_improvement: float | None
    mean_improvement: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(AgentSummary))


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def summarize(outcomes: Iterable[RunOutcome]) -> list[AgentSummary]:
    """One entry per (task, agent, model, feedback), by task, then highest best score first (groups
    with no score last), then agent, model and feedback mode."""
    groups: dict[tuple[str, str, str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.task, outcome.agent, outcome.model, outcome.feedback), []).append(outcome)
    summaries = []
    for (task, agent, model, feedback), runs in groups.items():
        baselines = [run.baseline for run in runs if run.baseline is not None]
        bests = [run.best_score for run in runs if run.best_score is not None]
        improvements = [run.improvement for run in runs if run.improvement is not None]
        summaries.append(
            AgentSummary(
                task=task,
                agent=agent,
                model=model,
                feedback=feedback,
                runs=len(runs),
                succeeded=sum(run.success for run in runs),
                scored_runs=len(bests),
                submissions=sum(run.submissions for run in runs),
                baseline=_mean(baselines),
                best_score=max(bests, default=None),
                mean_best_score=_mean(bests),
                best_improvement=max(improvements, default=None),
                mean_improvement=_mean(improvements),
            )
        )
    return sorted(
        summaries,
        key=lambda s: (s.task, s.best_score is None, -(s.best_score or 0.0), s.agent, s.model, s.feedback),
    )
