"""The evaluation settings an experiment records per split, the key its scores are computed
under, and the facts an evaluator measures that complete them."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from autorl.errors import ConflictError
from autorl.eval_config import MEASURED_FIELDS, EvalConfig
from autorl.store.experiments import lock_experiment_of
from autorl.store.models import Experiment, Split, Submission, SubmissionStatus
from autorl.store.submission_filters import held_by, unevaluated


def experiment_key(experiment: Experiment, split: Split) -> str:
    """The evaluation key under which ``experiment`` scores ``split``."""
    if split == Split.VALIDATION:
        if experiment.validation_eval_key is None:
            raise ConflictError(
                f"experiment {experiment.name!r} has no validation split (its feedback is test)"
            )
        return experiment.validation_eval_key
    return experiment.eval_key


def recorded_config(submission: Submission) -> dict[str, Any]:
    """The evaluation config recorded for ``submission``'s split, as stored (a sealed experiment's
    validation evaluations: its validation config); autorl.eval_config.EvalConfig reads it."""
    experiment = submission.experiment
    if submission.split == Split.VALIDATION:
        return dict(experiment.validation_eval_config or {})
    return dict(experiment.eval_config)


def evaluation_timeout_s(session: Session, submission_id: int, own_timeout_s: int) -> int:
    """The hard limit of ``submission_id``'s evaluation in seconds: its recorded config's, else (a
    config recorded before it was, or one this code cannot read, which the evaluation itself then
    refuses) ``own_timeout_s``, the caller's own ``eval_timeout_s``."""
    submission = session.get(Submission, submission_id)
    if submission is None:
        return own_timeout_s
    try:
        config = EvalConfig.model_validate(recorded_config(submission))
    except ValidationError:
        return own_timeout_s
    return config.timeout_in_force_s(own_timeout_s)


def record_evaluation_key(
    session: Session, submission_id: int, *, worker: str, evaluated: dict[str, object], key: str
) -> bool:
    """Record the evaluation key a submission's score is computed under (call before
    `record_score`, in its transaction): the experiment's recorded config with the split's hash
    and the package versions the worker measured (``evaluated``, keyed ``key``). An experiment
    recorded before any evaluator had measured them takes them from its first evaluation: its key
    and that of its submissions not yet evaluated become ``key``. A score computed under another
    key than its experiment's keeps its own, so it is never reused under the experiment's."""
    lock_experiment_of(session, submission_id)
    submission = session.scalar(select(Submission).where(Submission.id == submission_id, held_by(worker)))
    if submission is None:
        return False
    experiment = submission.experiment
    validation = submission.split == Split.VALIDATION
    recorded_key = experiment_key(experiment, submission.split)
    recorded = recorded_config(submission)
    if recorded_key != key and _completes(recorded, evaluated):
        session.execute(
            update(Submission)
            .where(
                Submission.experiment_id == experiment.id,
                Submission.eval_key == recorded_key,
                Submission.split == submission.split,
                unevaluated(),
            )
            .values(eval_key=key)
            .execution_options(synchronize_session=False)
        )
        if validation:
            experiment.validation_eval_config, experiment.validation_eval_key = dict(evaluated), key
        else:
            experiment.eval_config, experiment.eval_key = dict(evaluated), key
    submission.eval_key = key
    session.flush()
    return True


def _completes(recorded: dict[str, object], evaluated: dict[str, object]) -> bool:
    """``evaluated`` is ``recorded`` with only the evaluator's facts ``recorded`` left unset filled in."""
    unset = {name for name in MEASURED_FIELDS if recorded.get(name) is None}
    return bool(unset) and all(
        recorded.get(name) == evaluated.get(name)
        for name in set(recorded) | set(evaluated)
        if name not in unset
    )


def last_measured(
    session: Session, *, task: str, backend: str, split: Split = Split.TEST
) -> dict[str, object]:
    """The split's hash and package versions of the newest evaluation of ``task``'s ``split`` on
    ``backend`` (a worker records them in the score's ``details["eval_config"]``); empty when
    there is none."""
    recorded_split = None if split == Split.TEST else split.value
    recent = session.scalars(
        select(Submission)
        .join(Experiment, Submission.experiment_id == Experiment.id)
        .where(
            Experiment.task == task,
            Submission.status == SubmissionStatus.SCORED,
            Submission.reused_from.is_(None),
        )
        .order_by(Submission.finished_at.desc(), Submission.id.desc())
        .limit(200)
    )
    for submission in recent:
        config = (submission.details or {}).get("eval_config")
        if (
            isinstance(config, dict)
            and config.get("backend") == backend
            and config.get("split") == recorded_split
            and all(config.get(name) is not None for name in MEASURED_FIELDS)
        ):
            return {name: config[name] for name in MEASURED_FIELDS}
    return {}
