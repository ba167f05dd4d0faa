"""A sealed experiment's final: the nomination, the choice of the final test evaluation, the
snapshots kept for it, and the count of test evaluations."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autorl.errors import ConflictError, InvalidRequestError
from autorl.protocol.result import Selection
from autorl.store.models import Experiment, Feedback, Split, Submission, SubmissionStatus
from autorl.store.submission_filters import (
    failed_for_the_platform,
    failed_without_a_test_evaluation,
    of_experiment,
    unevaluated,
)
from autorl.store.submissions import best_submission


def nominate(session: Session, experiment: Experiment, number: int) -> Submission:
    """Record the agent's nomination of its scored submission ``number`` (the agent's number of
    it) for the final test evaluation. Call with the experiment's row locked. Refusals: those of
    :func:`nomination_candidate`."""
    submission = nomination_candidate(session, experiment, number)
    experiment.nominated_submission_id = submission.id
    return submission


def nomination_candidate(session: Session, experiment: Experiment, number: int) -> Submission:
    """The submission a nomination of the agent's submission ``number`` would record, nothing
    recorded. Refusals: not sealed or nominated already (ConflictError), not this experiment's
    scored submission (InvalidRequestError)."""
    if experiment.feedback != Feedback.SEALED:
        raise ConflictError(
            f"experiment {experiment.name!r} scores every submission on the test split (feedback: test); "
            "there is no final evaluation to nominate for"
        )
    if experiment.nominated_submission_id is not None or experiment.final_submission_id is not None:
        nominated = experiment.nominated_submission_id
        chosen = session.get(Submission, nominated) if nominated is not None else None
        raise ConflictError(
            "the final evaluation is already chosen"
            + (f" (submission {chosen.number} was nominated)" if chosen is not None else "")
            + "; a nomination is made once"
        )
    if number == 0:  # the baseline's number in every answer
        raise InvalidRequestError(
            "submission 0 is the baseline, not one of your submissions; nominate an id from GET /scores "
            "(1, 2, ...)"
        )
    submission = session.scalar(of_experiment(experiment, Submission.number == number))
    if submission is None:
        raise InvalidRequestError(
            f"no submission {number} in this experiment; nominate an id from GET /scores"
        )
    if submission.status != SubmissionStatus.SCORED:
        raise InvalidRequestError(
            f"submission {number} is {submission.status.value}, not scored; nominate a scored "
            "submission (GET /scores shows each one's status)"
        )
    return submission


def final_choice(session: Session, experiment: Experiment) -> tuple[Submission | None, Selection]:
    """The submission a sealed experiment's final test evaluation takes and how it was selected:
    the nominated one, else the best on validation (ties: the earliest)."""
    if experiment.nominated_submission_id is not None:
        return session.get(Submission, experiment.nominated_submission_id), "nominated"
    return best_submission(session, experiment), "best_on_validation"


def final_source(session: Session, chosen: Submission) -> Submission | None:
    """The submission whose snapshot a final test evaluation of ``chosen`` evaluates: ``chosen``
    itself, or, when it took an identical evaluation's score and holds no snapshot, that
    evaluation. None when that is a baseline's: the files are the base model's, and the final
    takes the baseline's score on test without an evaluation."""
    if chosen.snapshot is not None or chosen.reused_from is None:
        return chosen
    earlier = session.get(Submission, chosen.reused_from)
    if earlier is None:
        return chosen
    return None if earlier.is_baseline else earlier


def snapshot_holders(session: Session, experiment: Experiment) -> list[Submission]:
    """The experiment's submissions whose snapshots must stay in the evaluator storage: each queued
    or running one that names a snapshot (an evaluator will read it; a copy waiting for an identical
    evaluation names none of its own), and the one :func:`kept_for_final`. Read it with the
    experiment's row locked to act on it (a nomination and the release of snapshots are ordered by
    that lock)."""
    holders = list(
        session.scalars(
            of_experiment(
                experiment,
                Submission.snapshot.is_not(None),
                unevaluated(),
            ).order_by(Submission.id)
        )
    )
    kept = kept_for_final(session, experiment)
    if kept is not None and kept not in holders:
        holders.append(kept)
    return holders


def kept_for_final(session: Session, experiment: Experiment) -> Submission | None:
    """The finished evaluation whose snapshot a running sealed experiment keeps for its final test
    evaluation, if it names one:

    - before the final is chosen, the one the final would take now, :func:`final_choice`'s answer
      (the nominated submission, else the best on validation, ties: the earliest) through
      :func:`final_source`. Every other scored validation snapshot is let go: a nomination of one
      is accepted only if its folder still holds the scored files;
    - after, the final, when it failed for a reason of the platform's (it may be made again from
      the same snapshot)."""
    if experiment.status.finished or experiment.feedback != Feedback.SEALED:
        return None
    kept: Submission | None = None
    if experiment.final_submission_id is None:
        chosen, _ = final_choice(session, experiment)
        kept = final_source(session, chosen) if chosen is not None else None
    else:
        final = session.get(Submission, experiment.final_submission_id)
        kept = final if final is not None and failed_for_the_platform(final) else None
    return kept if kept is not None and kept.snapshot is not None else None


def held_snapshots(session: Session, experiment: Experiment) -> int:
    """How many snapshots the experiment's agent holds in the evaluator storage now (its share,
    ``snapshots_per_experiment``): :func:`snapshot_holders`, baselines (the platform's) left out,
    a snapshot that two rows name (a final and the submission it evaluates) counted once."""
    return len(
        {
            row.snapshot
            for row in snapshot_holders(session, experiment)
            if not row.is_baseline and row.snapshot
        }
    )


def snapshot_in_use(session: Session, submission_id: int, snapshot: str) -> bool:
    """Whether one of :func:`snapshot_holders` of ``submission_id``'s experiment names ``snapshot``
    (an evaluator asks before it removes the snapshot of a submission it has just finished with)."""
    submission = session.get(Submission, submission_id)
    if submission is None:
        return False
    return any(row.snapshot == snapshot for row in snapshot_holders(session, submission.experiment))


def final_submission(session: Session, experiment: Experiment) -> Submission | None:
    final_id = experiment.final_submission_id
    return None if final_id is None else session.get(Submission, final_id)


def final_attempts(session: Session, experiment: Experiment) -> int:
    """How many final test evaluations a sealed experiment has made (more than one only after
    failures that were the evaluator's own)."""
    return int(
        session.scalar(
            select(func.count(Submission.id)).where(
                Submission.experiment_id == experiment.id,
                Submission.split == Split.TEST,
                Submission.final_of.is_not(None),
            )
        )
        or 0
    )


def test_evaluations(session: Session, experiment: Experiment) -> int:
    """Evaluations of the agent's checkpoints on the test split this experiment caused: its
    agent's submissions (test mode) or its final evaluation (sealed) that an evaluator ran;
    baselines, reused scores, and failures before the split was loaded, cancelled or for the
    evaluator's own fault (no score was computed: :func:`failed_without_a_test_evaluation`) are not
    counted."""
    return int(
        session.scalar(
            select(func.count(Submission.id)).where(
                Submission.experiment_id == experiment.id,
                Submission.is_baseline.is_(False),
                Submission.split == Split.TEST,
                Submission.reused_from.is_(None),
                Submission.started_at.is_not(None),
                Submission.status.in_([SubmissionStatus.SCORED, SubmissionStatus.FAILED]),
                ~failed_without_a_test_evaluation(),
            )
        )
        or 0
    )
