"""Store-wide counts for the operators' metrics: read at scrape time from the database, so every
grader process (and replica) reports the same numbers, whatever process served the requests."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autorl.store.models import Experiment, ExperimentStatus, Submission, SubmissionStatus

#: Upper bounds (seconds) of the evaluation-duration histograms, the grader's and the worker's:
#: from a tiny model on a CPU (seconds) to a large one on the full split (an hour and more).
EVALUATION_DURATION_BUCKETS: tuple[float, ...] = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
)


@dataclass(frozen=True)
class DurationHistogram:
    """Cumulative counts per bucket bound (``+Inf`` last), as Prometheus exposes them."""

    buckets: list[tuple[float, int]]
    count: int
    total_seconds: float


@dataclass(frozen=True)
class StoreStats:
    submissions_by_status: dict[str, int]
    experiments_by_status: dict[str, int]
    queue_depth: dict[str, int]  # experiment name -> submissions waiting for an evaluator
    waiting_for_identical: int
    failures_by_reason: dict[str, int]
    baseline_cache_hits: int
    score_reuses: int
    durations: DurationHistogram


def _count_by(session: Session, column: object, *where: object) -> dict[str, int]:
    rows = session.execute(select(column, func.count()).where(*where).group_by(column))  # type: ignore[call-overload]
    return {"unknown" if key is None else str(getattr(key, "value", key)): int(count) for key, count in rows}


def _durations(session: Session) -> DurationHistogram:
    evaluated = (Submission.status == SubmissionStatus.SCORED, Submission.reused_from.is_(None))
    seconds = Submission.eval_seconds
    columns = [func.count().filter(seconds <= bound) for bound in EVALUATION_DURATION_BUCKETS]
    row = session.execute(
        select(func.count(), func.coalesce(func.sum(seconds), 0.0), *columns).where(*evaluated)
    ).one()
    count, total, *cumulative = row
    buckets = [(bound, int(n)) for bound, n in zip(EVALUATION_DURATION_BUCKETS, cumulative, strict=True)]
    return DurationHistogram(
        buckets=[*buckets, (float("inf"), int(count))], count=int(count), total_seconds=float(total or 0.0)
    )


def store_stats(session: Session) -> StoreStats:
    submissions = {status.value: 0 for status in SubmissionStatus}
    submissions.update(_count_by(session, Submission.status))
    experiments = {status.value: 0 for status in ExperimentStatus}
    experiments.update(_count_by(session, Experiment.status))
    open_experiments = session.scalars(
        select(Experiment.name).where(
            Experiment.status.in_([ExperimentStatus.PENDING, ExperimentStatus.RUNNING])
        )
    ).all()
    depth = dict.fromkeys(open_experiments, 0)
    depth.update(
        _count_by(
            session,
            Experiment.name,
            Experiment.id == Submission.experiment_id,
            Submission.status == SubmissionStatus.QUEUED,
            Submission.waits_for.is_(None),
        )
    )
    waiting = session.scalar(
        select(func.count(Submission.id)).where(
            Submission.status == SubmissionStatus.QUEUED, Submission.waits_for.is_not(None)
        )
    )

    def reused(baseline: bool) -> int:
        where = (Submission.reused_from.is_not(None), Submission.is_baseline.is_(baseline))
        return int(session.scalar(select(func.count(Submission.id)).where(*where)) or 0)

    return StoreStats(
        submissions_by_status=submissions,
        experiments_by_status=experiments,
        queue_depth=depth,
        waiting_for_identical=int(waiting or 0),
        failures_by_reason=_count_by(
            session, Submission.failure_reason, Submission.status == SubmissionStatus.FAILED
        ),
        baseline_cache_hits=reused(True),
        score_reuses=reused(False),
        durations=_durations(session),
    )
