"""Scores kept across experiments: the baseline of a task and base model, and the results of
`autorl evaluate` by the files' fingerprint."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autorl.store.models import (
    SCORE_COLUMNS,
    BaselineCache,
    EvaluationCache,
    Experiment,
    Submission,
    columns_of,
)


def cached_baseline(session: Session, *, task: str, model: str, eval_key: str) -> BaselineCache | None:
    return session.scalar(
        select(BaselineCache).where(
            BaselineCache.task == task, BaselineCache.model == model, BaselineCache.eval_key == eval_key
        )
    )


def remember_baseline(session: Session, submission: Submission) -> None:
    experiment = session.get(Experiment, submission.experiment_id)
    assert experiment is not None and submission.score is not None
    existing = cached_baseline(
        session, task=experiment.task, model=experiment.model, eval_key=submission.eval_key
    )
    if existing is not None:
        return
    session.add(
        BaselineCache(
            task=experiment.task,
            model=experiment.model,
            eval_key=submission.eval_key,
            fingerprint=submission.fingerprint,
            submission_id=submission.id,
            **columns_of(submission, SCORE_COLUMNS),
        )
    )


def cached_evaluation(session: Session, *, fingerprint: str, eval_key: str) -> EvaluationCache | None:
    """The earlier result of these files (a snapshot's fingerprint) under this evaluation key."""
    return session.scalar(
        select(EvaluationCache).where(
            EvaluationCache.fingerprint == fingerprint, EvaluationCache.eval_key == eval_key
        )
    )


def remember_evaluation(session: Session, result: EvaluationCache) -> EvaluationCache:
    """Keep ``result`` unless one of the same files and key is kept already (by a call that ran at
    the same time): the kept one is returned either way."""
    try:
        with session.begin_nested():
            session.add(result)
    except IntegrityError:
        kept = cached_evaluation(session, fingerprint=result.fingerprint, eval_key=result.eval_key)
        if kept is None:
            raise
        return kept
    return result
