"""Conditions that pick kinds of submissions (unevaluated, held by a worker, failed for the
platform's reason), shared by the store's modules; the agent's own is ``Submission.by_agent``."""

from __future__ import annotations

from sqlalchemy import ColumnElement, ColumnExpressionArgument, Select, and_, func, or_, select

from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.store.models import Experiment, FailureReason, Submission, SubmissionStatus


def of_experiment(experiment: Experiment, *conditions: ColumnExpressionArgument[bool]) -> Select[Submission]:
    """The experiment's submissions that meet every one of ``conditions``."""
    return select(Submission).where(Submission.experiment_id == experiment.id, *conditions)


def unevaluated() -> ColumnElement[bool]:
    """Queued or running: no result yet."""
    return Submission.status.in_([SubmissionStatus.QUEUED, SubmissionStatus.RUNNING])


def held_by(worker: str) -> ColumnElement[bool]:
    """Running under ``worker``: only the worker that holds a submission renews, records or releases it."""
    return and_(Submission.status == SubmissionStatus.RUNNING, Submission.worker == worker)


def evaluator_fault() -> ColumnElement[bool]:
    """A submission that failed for the evaluator's own fault (its error says so). Compared byte
    for byte, as :func:`failed_for_the_platform` does: SQLite's LIKE ignores case."""
    prefix = func.substr(func.coalesce(Submission.error, ""), 1, len(EVALUATOR_FAULT_PREFIX))
    return and_(Submission.status == SubmissionStatus.FAILED, prefix == EVALUATOR_FAULT_PREFIX)


#: nothing of the checkpoint ran on the split.
_BEFORE_THE_SPLIT = (FailureReason.SETUP, FailureReason.CANCELLED)


def failed_without_a_test_evaluation() -> ColumnElement[bool]:
    """A submission that failed with no score of its own computed on its split for a reason of the
    platform's: before the split was loaded (set-up: the snapshot, its config, the backend; a
    checkpoint that reaches an evaluator has passed every submit check), cancelled, or for the
    evaluator's own fault (:func:`evaluator_fault`). A sealed final that failed so is made again;
    none of them is a test evaluation (:func:`test_evaluations`)."""
    return and_(
        Submission.status == SubmissionStatus.FAILED,
        # Null-safe (a row without a reason is none of these), so that its negation counts it.
        or_(
            and_(Submission.failure_reason.is_not(None), Submission.failure_reason.in_(_BEFORE_THE_SPLIT)),
            evaluator_fault(),
        ),
    )


def failed_for_the_platform(submission: Submission) -> bool:
    """:func:`failed_without_a_test_evaluation` for a loaded row."""
    return submission.status == SubmissionStatus.FAILED and (
        submission.failure_reason in _BEFORE_THE_SPLIT
        or (submission.error or "").startswith(EVALUATOR_FAULT_PREFIX)
    )
