"""Evaluators' claims on submissions: the atomic claim with a worker lease, its renewal and
release, stale leases, and the fair order in which evaluators take work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from autorl.store.models import Submission, SubmissionStatus, utcnow
from autorl.store.outcomes import stored_error
from autorl.store.submission_filters import held_by


def claim(session: Session, submission_id: int, *, worker: str, lease_s: float) -> bool:
    """Atomically take a queued submission (or one whose worker's lease expired). True if ours now."""
    now = utcnow()
    result = session.execute(
        update(Submission)
        .where(Submission.id == submission_id, _claimable(now))
        .values(
            status=SubmissionStatus.RUNNING,
            attempts=Submission.attempts + 1,
            worker=worker,
            started_at=now,
            lease_expires_at=now + timedelta(seconds=lease_s),
            error=None,
        )
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def renew_lease(session: Session, submission_id: int, *, worker: str, lease_s: float) -> bool:
    result = session.execute(
        update(Submission)
        .where(Submission.id == submission_id, held_by(worker))
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def release(session: Session, submission_id: int, *, worker: str, error: str) -> None:
    """Give a submission back to the queue after a transient failure (the worker is shutting down)."""
    session.execute(
        update(Submission)
        .where(Submission.id == submission_id, held_by(worker))
        .values(status=SubmissionStatus.QUEUED, error=stored_error(error), lease_expires_at=None, worker=None)
        .execution_options(synchronize_session=False)
    )


def stale_submissions(session: Session, *, now: datetime | None = None) -> Sequence[Submission]:
    """Running submissions whose worker stopped renewing its lease (crashed, killed, lost)."""
    now = now or utcnow()
    return session.scalars(
        select(Submission).where(
            Submission.status == SubmissionStatus.RUNNING, Submission.lease_expires_at < now
        )
    ).all()


@dataclass(frozen=True)
class Claimable:
    submission_id: int
    experiment_id: int
    is_baseline: bool
    #: Platform work, taken before any agent's submission: a baseline, or a sealed experiment's one
    #: final evaluation (its agent has ended; queued validation work must not starve it).
    ahead: bool = False


def _claimable(now: datetime) -> ColumnElement[bool]:
    """Queued, or running under a lease that expired (its worker is gone); never one that waits
    for an identical submission's evaluation."""
    return and_(
        Submission.waits_for.is_(None),
        or_(
            Submission.status == SubmissionStatus.QUEUED,
            and_(Submission.status == SubmissionStatus.RUNNING, Submission.lease_expires_at < now),
        ),
    )


#: The fair order's rank of an agent's submission (baselines are 0, final evaluations 1).
AGENT_RANK = 2


def claimable_in_fair_order(
    session: Session, *, limit: int | None = None, taken: Sequence[int] = ()
) -> list[Claimable]:
    """Submissions waiting for an evaluator, in the order evaluators should take them.

    Baselines first (every experiment waits for its own), then sealed experiments' final
    evaluations (made once, after the agent: no agent's queue may starve them); then round robin
    across experiments:
    the experiment with the fewest evaluations running, then the one whose last evaluation started
    longest ago (never comes first), then the oldest submission. A flooding experiment therefore
    gets one evaluator turn per round, like every other, however many submissions it queued.
    ``taken``: submissions whose jobs a worker has taken; those not claimed yet count as running,
    started now (their claims come a moment later)."""
    now = utcnow()
    rank = case((Submission.is_baseline, 0), (Submission.final_of.is_not(None), 1), else_=AGENT_RANK)
    is_taken = and_(Submission.id.in_(list(taken)), _claimable(now))
    served = (
        select(
            Submission.experiment_id.label("experiment_id"),
            func.count(Submission.id)
            .filter(
                or_(
                    and_(Submission.status == SubmissionStatus.RUNNING, Submission.lease_expires_at >= now),
                    is_taken,
                )
            )
            .label("running"),
            func.max(case((is_taken, now), else_=Submission.started_at)).label("last_started"),
        )
        .where(or_(Submission.started_at.is_not(None), is_taken), Submission.reused_from.is_(None))
        .group_by(Submission.experiment_id)
        .subquery()
    )
    stmt = (
        select(Submission.id, Submission.experiment_id, Submission.is_baseline, rank.label("rank"))
        .outerjoin(served, served.c.experiment_id == Submission.experiment_id)
        .where(_claimable(now))
        .order_by(
            rank,
            func.coalesce(served.c.running, 0),
            served.c.last_started.asc().nulls_first(),
            Submission.id,
        )
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    return [
        Claimable(row.id, row.experiment_id, row.is_baseline, ahead=row.rank < AGENT_RANK)
        for row in session.execute(stmt)
    ]


def next_claimable_id(session: Session) -> int | None:
    first = claimable_in_fair_order(session, limit=1)
    return first[0].submission_id if first else None


def evaluation_order_position(session: Session, submission_id: int) -> int:
    """1-based place of a waiting submission in the order evaluators take work (all experiments,
    baselines first); 0 when it does not wait for an evaluator."""
    order = [c.submission_id for c in claimable_in_fair_order(session)]
    return order.index(submission_id) + 1 if submission_id in order else 0
