"""A sealed experiment's final (docs/PROTOCOL.md): the agent's nomination (``POST /final``), inside
its budget, once, and the one evaluation on the test split after the budget, of the nominated
submission or else the best on validation."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from autorl.api.answers import MAX_FINAL_ATTEMPTS
from autorl.errors import (
    CheckpointError,
    ConflictError,
    CostlyCheckpointError,
    DeadlineExceededError,
    UnreadableCheckpointError,
)
from autorl.store import (
    Experiment,
    Feedback,
    Split,
    Submission,
    experiments,
    sealed_final,
    submission_filters,
    submissions,
)
from autorl.store.models import utcnow
from autorl_grader.state import GraderState
from autorl_grader.submissions import (
    dispatch_committed,
    forget_released,
    held_until_committed,
    remove_released,
    snapshot_root,
    take_snapshot,
    under_lease,
)
from autorl_grader.views import display_path

log = logging.getLogger("autorl.grader")


def nominate(state: GraderState, experiment: Experiment, number: int) -> Submission:
    """The agent's ``POST /final``: inside its budget, once, one of its scored submissions (``number``,
    the agent's number of it: ``Submission.number``). Called
    in the experiment's turn (autorl_grader.snapshot_slots), as a submit is.

    A running sealed experiment keeps only the snapshot its final would take now (the best on
    validation, :func:`sealed_final.snapshot_holders`). A submission whose snapshot was let go is nominated
    from its folder, which must still hold the files that were scored (:func:`_nominate_from_folder`)."""
    with state.db.session() as session:
        locked = experiments.get_experiment(session, experiment.name, for_update=True)
        if locked.feedback == Feedback.SEALED:
            _check_budget_open(locked)
        candidate = sealed_final.nomination_candidate(session, locked, number)
        nominated = None
        if _has_its_snapshot(state, session, candidate):
            nominated = sealed_final.nominate(session, locked, number)
            released = forget_released(session, locked)  # the best on validation, when not this one
            session.flush()
            session.expunge(nominated)
    if nominated is None:
        return _nominate_from_folder(state, experiment, number)
    remove_released(state, released)
    log.info(
        "event=final_nominated experiment=%s submission=%d number=%d", experiment.name, nominated.id, number
    )
    return nominated


def _has_its_snapshot(state: GraderState, session: Session, chosen: Submission) -> bool:
    """Whether a final of ``chosen`` has its files: the snapshot it would evaluate is kept, or it
    needs none (the base model's files, whose score on test is the baseline's)."""
    source = sealed_final.final_source(session, chosen)
    if source is None:
        return True
    return source.snapshot is not None and (snapshot_root(state) / source.snapshot / "config.json").is_file()


def _nominate_from_folder(state: GraderState, experiment: Experiment, number: int) -> Submission:
    """Nominate a scored submission whose snapshot was let go: the grader takes its folder again,
    with every check of a submit, and accepts it only if the fingerprint is the one that was scored;
    the new snapshot becomes the submission's, kept for the final. The copy is one more snapshot of
    the experiment, so it is held to the share (:func:`check_share`) and to the submission limit:
    a refusal once the weights were being read (the files changed, or are not the scored ones)
    counts against the limit as a costly submit does (:func:`count_refusal`)."""
    model_path = ""

    def checks(session: Session, locked: Experiment) -> None:
        nonlocal model_path
        _check_budget_open(locked)
        candidate = sealed_final.nomination_candidate(session, locked, number)
        model_path = candidate.model_path
        if submissions.limited_submissions_count(session, locked) >= locked.max_submissions:
            # Reading the folder again may cost a submission (a costly refusal): none is left.
            raise CheckpointError(
                f"submission {number}'s files are no longer kept (only the best on validation's "
                f"are) and would be read again from its folder {display_path(locked, model_path)}, "
                f"which your reached limit of {locked.max_submissions} submissions no longer allows; "
                "nominate the best submission on validation, whose files are kept, or leave the choice "
                "to the platform, which takes it"
            )

    return under_lease(
        state,
        experiment,
        lambda holder: _snapshot_and_nominate(state, experiment, number, model_path, holder),
        checks,
    )


def _snapshot_and_nominate(
    state: GraderState, experiment: Experiment, number: int, model_path: str, holder: str
) -> Submission:
    shown = display_path(experiment, model_path)
    unchanged_fix = (
        "nominate a submission whose folder is unchanged, or leave the choice to the platform, which "
        "takes the best on validation, whose files are kept"
    )
    try:
        # The path as the agent knows it (relative to the workspace): its reasons name it.
        snapshot = take_snapshot(state, experiment, shown)
    except UnreadableCheckpointError:
        raise  # tried again in the experiment's turn; it names the file and the fix
    except CheckpointError as exc:
        refused = CostlyCheckpointError if isinstance(exc, CostlyCheckpointError) else CheckpointError
        raise refused(
            f"submission {number}'s folder {shown} no longer holds the files that were scored "
            f"({exc}); {unchanged_fix}"
        ) from exc
    with held_until_committed(snapshot) as held:
        with state.db.session() as session:
            scored = submissions.agent_submission(session, experiment, number).fingerprint
        # Outside the experiment's lock: where the fingerprints differ, ``holds`` reads the whole
        # snapshot again (the scheme before), which must not stall the experiment's other requests.
        unchanged = snapshot.holds(scored)
        with state.db.session() as session:
            locked = experiments.get_experiment(session, experiment.name, for_update=True)
            _check_budget_open(locked)
            chosen = sealed_final.nomination_candidate(session, locked, number)
            if not unchanged or chosen.fingerprint != scored:
                # Known only once every weight was read and hashed: a costly refusal.
                raise CostlyCheckpointError(
                    f"submission {number}'s folder {shown} no longer holds the files that were "
                    f"scored; {unchanged_fix}"
                )
            nominated = sealed_final.nominate(session, locked, number)
            nominated.snapshot = snapshot.name
            held.keep()
            experiments.release_snapshot_lease(session, locked.id, holder)
            released = forget_released(session, locked)
            session.flush()
            session.expunge(nominated)
    remove_released(state, released)
    log.info(
        "event=final_nominated experiment=%s submission=%d number=%d snapshot=taken_again",
        experiment.name,
        nominated.id,
        number,
    )
    return nominated


def _check_budget_open(experiment: Experiment) -> None:
    """A nomination is the agent's act, so only inside its budget (403 otherwise, as /submit)."""
    if experiment.start_time is None or experiment.end_time is None:
        raise DeadlineExceededError(
            "your time budget has not started yet; nominate once GET /time shows a start_time"
        )
    if experiment.status.finished or utcnow() > experiment.end_time:
        raise DeadlineExceededError(
            "your time budget is over; a nomination is accepted only before GET /time's end_time "
            "(without one, the best submission on validation is evaluated on the test split)"
        )


def begin_final(state: GraderState, name: str) -> int | None:
    """Create (once) a sealed experiment's one evaluation on the test split, after the agent's
    budget: of the nominated submission, else the best on validation (ties: the earliest). It
    evaluates that submission's snapshot, kept for this (:func:`prune_orphan_snapshots`). A final
    that failed for a reason of the platform's computed no score (before the test split was loaded,
    or for the evaluator's own fault:
    :func:`autorl.store.submission_filters.failed_without_a_test_evaluation`): asked again, this makes
    a new one of the same submission, up to ``MAX_FINAL_ATTEMPTS`` in all. Returns the
    final's id, or None when the experiment is not sealed or nothing was scored."""
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        if experiment.feedback != Feedback.SEALED:
            return None
        previous = sealed_final.final_submission(session, experiment)
        if previous is not None and not (
            submission_filters.failed_for_the_platform(previous)
            and not experiment.status.finished
            and sealed_final.final_attempts(session, experiment) < MAX_FINAL_ATTEMPTS
        ):
            return previous.id
        if experiment.status.finished:
            raise ConflictError(
                f"experiment {name!r} is {experiment.status.value}; its final evaluation is made before "
                "it finishes"
            )
        selection: str  # how it was chosen, as the log says it
        if previous is None:
            chosen, selection = sealed_final.final_choice(session, experiment)
            if chosen is None:
                return None
            source = chosen
            if source.snapshot is None and source.reused_from is not None:
                source = session.get(Submission, source.reused_from) or chosen
            snapshot = source.snapshot
        else:
            # Again, of the same submission and from the same snapshot (kept for this).
            chosen = session.get(Submission, previous.final_of)
            assert chosen is not None
            selection = "again after a failure of the platform's"
            snapshot = previous.snapshot
            previous.snapshot = None
        final = submissions.create_submission(
            session,
            experiment,
            model_path=chosen.model_path,
            fingerprint=chosen.fingerprint,
            snapshot=snapshot,
            ignored_files=chosen.ignored_files,
            split=Split.TEST,
            final_of=chosen.id,
        )
        if final.status.final:
            final.snapshot = None
        experiment.final_submission_id = final.id
        final_id, queued = final.id, not final.status.final
    log.info(
        "event=final_evaluation experiment=%s submission=%d of=%d selection=%s",
        name,
        final_id,
        chosen.id,
        selection,
    )
    if queued:
        dispatch_committed(state)
    return final_id
