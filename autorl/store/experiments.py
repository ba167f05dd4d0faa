"""Experiments: registration, tokens, the budget, the verdict, and the row locks taken on them."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from autorl.errors import ConflictError, NotFoundError
from autorl.store.models import (
    Experiment,
    ExperimentStatus,
    FailureReason,
    Feedback,
    Split,
    Submission,
    SubmissionStatus,
    utcnow,
)
from autorl.store.submission_filters import unevaluated

TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_experiment(session: Session, *, token: str, **fields: object) -> Experiment:
    name = str(fields["name"])
    if session.scalar(select(Experiment.id).where(Experiment.name == name)) is not None:
        raise ConflictError(
            f"an experiment named {name!r} already exists; choose another name, or call "
            f"POST /v1/experiments/{name}/token for a new token"
        )
    experiment = Experiment(token_hash=hash_token(token), **fields)
    session.add(experiment)
    session.flush()
    return experiment


def get_experiment(session: Session, name: str, *, for_update: bool = False) -> Experiment:
    stmt = select(Experiment).where(Experiment.name == name)
    if for_update:
        stmt = stmt.with_for_update()
    experiment = session.scalar(stmt)
    if experiment is None:
        raise NotFoundError(f"no experiment named {name!r}; list them with GET /v1/experiments")
    return experiment


def experiment_by_token(session: Session, token: str) -> Experiment | None:
    return session.scalar(select(Experiment).where(Experiment.token_hash == hash_token(token)))


def recent_token_hashes(session: Session, limit: int) -> list[str]:
    """The token hashes of the ``limit`` experiments registered last, oldest first."""
    stmt = select(Experiment.token_hash).order_by(Experiment.id.desc()).limit(limit)
    return list(reversed(session.scalars(stmt).all()))


def list_experiments(session: Session) -> Sequence[Experiment]:
    return session.scalars(select(Experiment).order_by(Experiment.id)).all()


def rotate_token(session: Session, experiment: Experiment) -> str:
    token = new_token()
    experiment.token_hash = hash_token(token)
    return token


def start_budget(
    session: Session,
    experiment: Experiment,
    *,
    timeout_s: int | None = None,
    started_at: datetime | None = None,
) -> None:
    """Start the budget now, or at ``started_at`` when it began earlier (clamped between the
    experiment's registration and now: a budget never starts in the future nor before it existed)."""
    now = utcnow()
    start = now if started_at is None else min(now, max(started_at, experiment.created_at))
    if timeout_s is not None:
        experiment.timeout_s = timeout_s
    experiment.start_time = start
    experiment.end_time = start + timedelta(seconds=experiment.timeout_s)
    experiment.status = ExperimentStatus.RUNNING


#: The error of a submission that was still waiting or running when its experiment finished.
CANCELLED_ERROR = (
    "cancelled: the experiment finished before this submission was evaluated; submit earlier, "
    "or give evaluations time to finish before the budget ends"
)


def finish_experiment(
    session: Session, experiment: Experiment, status: ExperimentStatus, message: str | None = None
) -> None:
    """Record the verdict and cancel every unevaluated submission in the same transaction, so the
    experiment's numbers are final from this commit on (a late worker result no longer counts)."""
    if experiment.status.finished:
        return  # idempotent: the first verdict stands
    experiment.status = status
    experiment.message = message
    experiment.finished_at = utcnow()
    session.execute(
        update(Submission)
        .where(Submission.experiment_id == experiment.id, unevaluated())
        .values(
            status=SubmissionStatus.FAILED,
            error=CANCELLED_ERROR,
            failure_reason=FailureReason.CANCELLED,
            finished_at=experiment.finished_at,
            lease_expires_at=None,
        )
        .execution_options(synchronize_session=False)
    )


def feedback_split(experiment: Experiment) -> Split:
    """The split the agent's submissions are scored on during its budget."""
    return Feedback(experiment.feedback).scored_split


def lock_experiment_of(session: Session, submission_id: int) -> None:
    """Take the row lock of the submission's experiment (the lock `create_submission` runs under),
    so that a submission cannot start waiting for an evaluation while that evaluation ends."""
    session.execute(
        select(Experiment.id)
        .where(
            Experiment.id
            == select(Submission.experiment_id).where(Submission.id == submission_id).scalar_subquery()
        )
        .with_for_update()
    )


def take_snapshot_lease(experiment: Experiment, holder: str, lease_s: float) -> bool:
    """Make ``holder`` the one grader copying a submission of ``experiment`` (a row locked for
    update) for ``lease_s``; False while another holder's lease runs."""
    now = utcnow()
    until = experiment.snapshot_lease_until
    if experiment.snapshot_holder not in (None, holder) and until is not None and until > now:
        return False
    experiment.snapshot_holder = holder
    experiment.snapshot_lease_until = now + timedelta(seconds=lease_s)
    return True


def release_snapshot_lease(session: Session, experiment_id: int, holder: str) -> None:
    """Let go of the lease if ``holder`` still has it (a no-op once another holder took it over)."""
    session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id, Experiment.snapshot_holder == holder)
        .values(snapshot_holder=None, snapshot_lease_until=None)
    )


def record_provenance(
    session: Session,
    experiment: Experiment,
    *,
    test_overlap: int | None = None,
    twin_score: float | None = None,
    twin_p_value: float | None = None,
) -> None:
    """Record what was found after the agent ended (autorl.provenance); a field not given is kept."""
    found = {"test_overlap": test_overlap, "twin_score": twin_score, "twin_p_value": twin_p_value}
    for field, value in found.items():
        if value is not None:
            setattr(experiment, field, value)
