"""What an evaluation ends with: a score or a failure, recorded only by the worker that holds
the submission, and handed on to the submissions waiting for it."""

from __future__ import annotations

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from autorl.store.caches import remember_baseline
from autorl.store.experiments import lock_experiment_of
from autorl.store.models import FailureReason, Submission, SubmissionStatus, utcnow
from autorl.store.submission_filters import held_by
from autorl.store.submissions import take_score

#: The most of an error a submission keeps.
MAX_ERROR_CHARS = 4000
#: Of a longer error, its beginning (which says whose fault it is) and then its end.
ERROR_HEAD_CHARS = 1000


def stored_error(error: str) -> str:
    """``error`` as a submission keeps it: whole up to MAX_ERROR_CHARS; past that its beginning,
    which carries the evaluator-fault prefix, and its end, which carries a log's last lines."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    cut = " … "
    return error[:ERROR_HEAD_CHARS] + cut + error[-(MAX_ERROR_CHARS - ERROR_HEAD_CHARS - len(cut)) :]


def record_score(
    session: Session,
    submission_id: int,
    *,
    worker: str,
    scores: dict[str, float],
    n_samples: int,
    seconds: float,
    details: dict[str, object] | None = None,
    protocol: str = "opencompass",
    correctness: str | None = None,
    problems_digest: str | None = None,
) -> bool:
    """Write a result, only if this worker still holds the submission (no double counting).
    The headline `score` is the experiment's protocol; the others are kept beside it, and so is
    the headline protocol's per-problem `correctness` on the problems `problems_digest` names
    (autorl.protocol.statistics). The submissions waiting for this evaluation take the same result."""
    lock_experiment_of(session, submission_id)
    result = session.execute(
        update(Submission)
        .where(Submission.id == submission_id, held_by(worker))
        .values(
            status=SubmissionStatus.SCORED,
            score=scores[protocol],
            score_opencompass=scores.get("opencompass"),
            score_flexible=scores.get("flexible"),
            score_strict=scores.get("strict"),
            n_samples=n_samples,
            correctness=correctness,
            problems_digest=problems_digest,
            eval_seconds=seconds,
            details=details,
            finished_at=utcnow(),
            lease_expires_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    submission = session.get(Submission, submission_id)
    assert submission is not None
    session.refresh(submission)
    if submission.is_baseline:
        remember_baseline(session, submission)
    settle_waiting(session, submission)
    return True


def record_failure(
    session: Session,
    submission_id: int,
    *,
    error: str,
    reason: FailureReason,
    worker: str | None = None,
    worker_prefix: str | None = None,
) -> bool:
    """Fail a submission that is not final yet: only while ``worker`` holds it, if given; with
    ``worker_prefix``, only while it waits for an evaluator or runs under a worker name that starts
    with it (every claim one process makes), never while another process holds it. The
    submissions waiting for it are not failed with it: the first of them is evaluated itself."""
    lock_experiment_of(session, submission_id)
    stmt = update(Submission).where(
        Submission.id == submission_id,
        Submission.status.in_([SubmissionStatus.QUEUED, SubmissionStatus.RUNNING]),
    )
    if worker is not None:
        stmt = stmt.where(Submission.worker == worker)
    if worker_prefix is not None:
        stmt = stmt.where(
            or_(
                and_(Submission.status == SubmissionStatus.QUEUED, Submission.waits_for.is_(None)),
                Submission.worker.startswith(worker_prefix, autoescape=True),
            )
        )
    result = session.execute(
        stmt.values(
            status=SubmissionStatus.FAILED,
            error=stored_error(error),
            failure_reason=reason,
            finished_at=utcnow(),
            lease_expires_at=None,
        ).execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    failed = session.get(Submission, submission_id)
    assert failed is not None
    session.refresh(failed)
    settle_waiting(session, failed)
    return True


def settle_waiting(session: Session, evaluated: Submission) -> int:
    """Hand a final evaluation's result to the submissions waiting for it: a score is theirs too
    (reused, 0 s); after a failure the first of them is evaluated itself and the others wait for
    that one. Returns how many took a score."""
    waiting = session.scalars(
        select(Submission)
        .where(Submission.waits_for == evaluated.id, Submission.status == SubmissionStatus.QUEUED)
        .order_by(Submission.id)
    ).all()
    if evaluated.status == SubmissionStatus.SCORED:
        for submission in waiting:
            take_score(submission, evaluated)
            if submission.is_baseline:
                session.flush()
                remember_baseline(session, submission)
        session.flush()
        return len(waiting)
    if evaluated.status == SubmissionStatus.FAILED and waiting:
        first, *rest = waiting
        first.waits_for = None
        if first.snapshot is None:
            # A copy that waited holds no snapshot of its own: it takes the failed evaluation's,
            # whose files are the same (the evaluator keeps what a queued submission names).
            first.snapshot = evaluated.snapshot
        for submission in rest:
            submission.waits_for = first.id
        session.flush()
    return 0


def settle_orphaned_waiting(session: Session) -> int:
    """Settle the waiting submissions whose evaluation is final (a safety net for the reconciler)."""
    evaluated = session.scalars(
        select(Submission).where(
            Submission.id.in_(
                select(Submission.waits_for).where(
                    Submission.waits_for.is_not(None), Submission.status == SubmissionStatus.QUEUED
                )
            ),
            Submission.status.in_([SubmissionStatus.SCORED, SubmissionStatus.FAILED]),
        )
    ).all()
    return sum(settle_waiting(session, submission) for submission in evaluated)
