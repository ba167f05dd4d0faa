"""Accepting submissions: snapshot (check, copy, fingerprint), commit, enqueue; waiting for results."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from autorl.api.answers import PendingAnswer, SubmissionAnswer
from autorl.checkpoints.snapshot import (
    Snapshot,
    prune_snapshots,
    remove_snapshot,
    snapshot_base_model,
    snapshot_submission,
)
from autorl.checkpoints.snapshot import submission_readable as files_readable
from autorl.errors import (
    CheckpointError,
    ConflictError,
    CostlyCheckpointError,
    DeadlineExceededError,
    MalformedCheckpointError,
    ServiceUnavailableError,
    SubmissionLimitError,
)
from autorl.store import (
    Experiment,
    Feedback,
    Split,
    Submission,
    SubmissionStatus,
    caches,
    eval_keys,
    experiments,
    sealed_final,
    submissions,
)
from autorl.store.models import utcnow
from autorl_grader.snapshot_slots import LeaseHeldError
from autorl_grader.state import GraderState
from autorl_grader.thread_pools import in_agent_threads
from autorl_grader.views import agent_submission_view, pending_view, submission_view

log = logging.getLogger("autorl.grader")
#: The Retry-After of a submit refused for the experiment's share of the evaluator storage: about
#: the time in which an evaluation of a small model ends.
SHARE_RETRY_AFTER_S = 30
T = TypeVar("T")


def rebase_agent_path(experiment: Experiment, model_path: str) -> str:
    """Map a path in the agent's view (e.g. /workspace/output/x in a pod) onto the grader's view."""
    if experiment.agent_workspace and Path(model_path).is_absolute():
        try:
            relative = Path(model_path).relative_to(experiment.agent_workspace)
        except ValueError:
            return model_path
        return str(Path(experiment.workspace) / relative)
    return model_path


def check_open(experiment: Experiment) -> None:
    """Submissions are accepted only inside the budget: after it started, before it ended."""
    if experiment.status.finished:
        raise ConflictError(
            f"experiment {experiment.name!r} is {experiment.status.value}; it accepts no more submissions"
        )
    if experiment.start_time is None or experiment.end_time is None:
        raise DeadlineExceededError(
            f"the time budget of experiment {experiment.name!r} has not started yet; submissions are "
            "accepted once GET /time shows a start_time (the platform starts it when your agent starts)"
        )
    if utcnow() > experiment.end_time:
        raise DeadlineExceededError(
            f"the time budget of experiment {experiment.name!r} ended at {experiment.end_time.isoformat()}; "
            "submissions are accepted only before GET /time's end_time"
        )
    if experiment.final_submission_id is not None:
        raise ConflictError(
            f"experiment {experiment.name!r} has begun its final evaluation; it accepts no more submissions"
        )


def check_limit(count: int, experiment: Experiment) -> None:
    """``count``: :func:`submissions.limited_submissions_count` of ``experiment``, locked for update."""
    if count >= experiment.max_submissions:
        # GET /scores lists submissions only: say what else took part of the limit.
        refused = experiment.costly_refusals or 0
        counted = (
            f" ({refused} of them refused after the grader had read the checkpoint's weights, which "
            "counts as a submission but is not listed in GET /scores)"
            if refused
            else ""
        )
        raise SubmissionLimitError(
            f"experiment {experiment.name!r} reached its limit of {experiment.max_submissions} "
            f"submissions{counted}; submit only your best checkpoints (GET /scores shows what you have)"
        )


def snapshot_root(state: GraderState) -> Path:
    return state.settings.snapshot_dir


def submission_readable(experiment: Experiment, model_path: str) -> bool:
    """Whether ``model_path``'s files can be opened now (autorl.checkpoints.snapshot.submission_readable)."""
    return files_readable(
        rebase_agent_path(experiment, model_path),
        workspace=Path(experiment.workspace),
        output_dir=Path(experiment.output_dir),
    )


def take_snapshot(state: GraderState, experiment: Experiment, agent_path: str) -> Snapshot:
    """Check the folder ``agent_path`` (as the agent names it: relative to its workspace, or
    absolute) and copy its weights beside the base model's other files
    (autorl.checkpoints.snapshot). Files that broke a check in a way no rule names are refused as
    any bad checkpoint is, and the failure is logged with its traceback for the platform."""
    try:
        return snapshot_submission(
            agent_path,
            workspace=Path(experiment.workspace),
            output_dir=Path(experiment.output_dir),
            base_model_dir=Path(experiment.base_model_dir),
            snapshot_root=snapshot_root(state),
        )
    except MalformedCheckpointError as exc:
        log.warning(
            "event=submission_malformed experiment=%s reason=%s",
            experiment.name,
            exc,
            exc_info=exc.__cause__ or exc,
        )
        raise


class HeldSnapshot:
    """Whether the submission being committed keeps its snapshot (see :func:`held_until_committed`)."""

    queued = False
    kept = False

    def attach(self, submission: Submission) -> int:
        """The new submission's id. One that is final at once (it reuses a score) lets go of the
        snapshot, and so does a copy that waits for an identical evaluation of its experiment (it
        takes that one's result; should that fail, it takes that one's snapshot,
        :func:`outcomes.settle_waiting`); one to evaluate keeps it for the evaluator."""
        self.queued = not submission.status.final
        self.kept = self.queued and submission.waits_for is None
        if not self.kept:
            submission.snapshot = None
        return submission.id

    def keep(self) -> None:
        """The snapshot is committed as a submission's (a nomination's copy of its folder)."""
        self.kept = True


@contextmanager
def held_until_committed(snapshot: Snapshot) -> Iterator[HeldSnapshot]:
    """Remove ``snapshot`` when the block fails, or when it ends without a submission keeping it
    (one reusing a score, one waiting for an identical evaluation, or none committed)."""
    held = HeldSnapshot()
    try:
        yield held
    except BaseException:
        remove_snapshot(snapshot.path)
        raise
    if not held.kept:
        remove_snapshot(snapshot.path)


def check_share(
    state: GraderState, session: Session, experiment: Experiment, *, replacing_kept: bool = False
) -> None:
    """Refuse one more snapshot of ``experiment`` (a row locked for update) when it holds its share
    of the evaluator storage already (``snapshots_per_experiment``): 503 with a Retry-After, before
    any file is read, not counted against the limit. The storage is shared by every experiment, so
    one experiment's queue must not fill it for the others. Counted is what its submissions hold
    (:func:`sealed_final.held_snapshots`); :func:`reserve_snapshot` has removed what they let go.
    ``replacing_kept``: the new snapshot, once committed, replaces the one kept for the final (a
    nomination's), which is then not counted: an experiment exceeds its share by that one copy at
    most, while it is taken (one copy of an experiment at a time)."""
    share = state.settings.snapshots_per_experiment
    held = sealed_final.held_snapshots(session, experiment)
    kept = sealed_final.kept_for_final(session, experiment) if replacing_kept else None
    if kept is not None and not kept.is_baseline:
        held -= 1
    if held >= share:
        raise ServiceUnavailableError(
            f"this experiment already holds {held} checkpoints in the evaluator storage, waiting for "
            f"evaluation or kept for its final (at most {share} at once); retry once one has been "
            "scored (GET /scores shows each one's status). This refusal does not count against your "
            "submission limit",
            retry_after_s=SHARE_RETRY_AFTER_S,
        )


def reserve_snapshot(
    state: GraderState,
    experiment: Experiment,
    holder: str,
    checks: Callable[[Session, Experiment], None] | None = None,
) -> None:
    """Take the experiment's snapshot lease once the budget is open, a submission is left and the
    experiment's share of the evaluator storage has room (autorl_grader.snapshot_slots): a submit
    refused here has read no file. ``checks`` replaces the budget and limit checks: a nomination's,
    whose snapshot replaces the one kept for the final (:func:`check_share`). Another grader
    replica's lease refuses it with :class:`LeaseHeldError`, which the experiment's turn tries again
    (``snapshot_wait_s``)."""
    # What the experiment let go (a validation snapshot no longer the best) leaves the storage
    # before its share is counted, so the count is what the storage holds.
    release_snapshots(state, experiment.name)
    with state.db.session() as session:
        locked = experiments.get_experiment(session, experiment.name, for_update=True)
        if checks is None:
            check_open(locked)
            check_limit(submissions.limited_submissions_count(session, locked), locked)
        else:
            checks(session, locked)
        check_share(state, session, locked, replacing_kept=checks is not None)
        if experiments.take_snapshot_lease(locked, holder, state.settings.snapshot_lease_s):
            return
    raise LeaseHeldError(
        f"another checkpoint of experiment {experiment.name!r} is being copied; try again "
        "once its /submit has answered (one checkpoint of an experiment is taken at a time)"
    )


def accept(state: GraderState, experiment: Experiment, model_path: str) -> int:
    """Blocking: reserves, snapshots and commits a submission, then enqueues it. Returns its id.
    Called in the experiment's turn (autorl_grader.snapshot_slots)."""
    check_open(experiment)
    # A queue that does not answer refuses the submit before any file is read, at no cost.
    state.dispatcher.ping()
    submission_id, queued = under_lease(
        state, experiment, lambda holder: _snapshot_and_commit(state, experiment, model_path, holder)
    )
    state.last_submits.forget(experiment.id)
    log.info(
        "event=submission_accepted experiment=%s submission=%d reused=%s",
        experiment.name,
        submission_id,
        not queued,
    )
    if queued:
        dispatch_committed(state)
    return submission_id


def under_lease(
    state: GraderState,
    experiment: Experiment,
    copy: Callable[[str], T],
    checks: Callable[[Session, Experiment], None] | None = None,
) -> T:
    """Run ``copy(holder)`` (it takes a snapshot and commits it, letting go of the lease in that
    transaction) under the experiment's snapshot lease (:func:`reserve_snapshot`, with
    ``checks``). A refusal once the weights were being read is counted (:func:`count_refusal`);
    any other lets go of the lease here."""
    holder = uuid.uuid4().hex
    reserve_snapshot(state, experiment, holder, checks)
    try:
        return copy(holder)
    except CostlyCheckpointError as exc:
        raise count_refusal(state, experiment, holder, exc) from exc
    except BaseException:
        with state.db.session() as session:
            experiments.release_snapshot_lease(session, experiment.id, holder)
        raise


def count_refusal(
    state: GraderState, experiment: Experiment, holder: str, refusal: CostlyCheckpointError
) -> CheckpointError:
    """A submit refused after the grader began reading the checkpoint's weights cost what an
    accepted one costs, so it counts against the limit as one does (``costly_refusals``): under the
    experiment's row lock, with the lease let go, in one transaction. Returns the refusal the agent
    gets (still a 400): the reason, that it counted, how many submissions are left and the fix.
    Refusals found before any weight data is read are not counted (:func:`reserve_snapshot`)."""
    with state.db.session() as session:
        locked = experiments.get_experiment(session, experiment.name, for_update=True)
        left = submissions.count_costly_refusal(session, locked)
        limit = locked.max_submissions
        experiments.release_snapshot_lease(session, locked.id, holder)
    log.warning(
        "event=submission_refused_after_read experiment=%s submissions_left=%d", experiment.name, left
    )
    # The reason names the fix (a CheckpointError does; for files that changed: stop writing a
    # checkpoint before submitting it, save it to a new folder and submit that folder).
    return CheckpointError(
        f"{refusal}. This refusal counts against your limit of {limit} submissions, as a submission "
        f"does, because the grader had already read and copied the checkpoint's weights: {left} left"
    )


def _snapshot_and_commit(
    state: GraderState, experiment: Experiment, model_path: str, holder: str
) -> tuple[int, bool]:
    """The new submission's id and whether it is queued (not a reused score). Files that broke a
    check in a way no rule names are refused (400, before any weight data is read: not counted) and
    the failure is logged with its traceback; any other failure (the database, the snapshot
    storage) stays the platform's."""
    agent_path = rebase_agent_path(experiment, model_path)
    snapshot = take_snapshot(state, experiment, agent_path)
    shown_path = os.path.normpath(Path(experiment.workspace) / agent_path)
    with held_until_committed(snapshot) as held:
        # Refuse before writing anything when the queue is down: no half-accepted submission.
        state.dispatcher.ping()
        with state.db.session() as session:
            locked = experiments.get_experiment(session, experiment.name, for_update=True)
            check_open(locked)
            check_limit(submissions.limited_submissions_count(session, locked), locked)
            submission = submissions.create_submission(
                session,
                locked,
                model_path=shown_path,
                fingerprint=snapshot.fingerprint,
                snapshot=snapshot.name,
                ignored_files=list(snapshot.ignored_files),
                split=experiments.feedback_split(locked),
            )
            experiments.release_snapshot_lease(session, locked.id, holder)
            submission_id = held.attach(submission)
    return submission_id, held.queued


def dispatch_committed(state: GraderState) -> None:
    """The rows are committed: a queue failure now only delays them (the reconciler dispatches them
    later). The dispatcher picks what to hand to evaluators in fair order."""
    try:
        state.dispatcher.dispatch(state.db)
    except ServiceUnavailableError as exc:
        log.warning("event=dispatch_deferred reason=%s", exc)


def request_baseline(state: GraderState, name: str) -> int:
    """Create (once) the experiment's baseline evaluation on the test split, and a sealed
    experiment's on the validation split too; returns the test one's id. The cache, keyed by task,
    model and evaluation key (which names the split), is trusted only while the base model's
    fingerprint still matches it (a rebuilt or re-downloaded model is measured again).

    Sealed, the validation baseline is created first, so evaluators take it first (the fair order
    takes an experiment's baselines oldest first): it never waits behind the test evaluation, and
    nothing the agent is shown of it (a copy of the base model waiting for its result, too) takes
    the test evaluation's time."""
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name)
        sealed = experiment.feedback == Feedback.SEALED
    if sealed:
        _request_baseline_on(state, name, Split.VALIDATION)
    return _request_baseline_on(state, name, Split.TEST)


def _baseline_id(experiment: Experiment, split: Split) -> int | None:
    if split == Split.VALIDATION:
        return experiment.validation_baseline_submission_id
    return experiment.baseline_submission_id


def _request_baseline_on(state: GraderState, name: str, split: Split) -> int:
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name)
        existing = _baseline_id(experiment, split)
        if existing is not None:
            return existing
        base_dir = experiment.base_model_dir
    snapshot = snapshot_base_model(Path(base_dir), snapshot_root(state))
    with held_until_committed(snapshot) as held, state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        existing = _baseline_id(experiment, split)
        if existing is not None:
            return existing
        cached = caches.cached_baseline(
            session,
            task=experiment.task,
            model=experiment.model,
            eval_key=eval_keys.experiment_key(experiment, split),
        )
        reusable = cached is not None and cached.fingerprint == snapshot.fingerprint
        submission = submissions.create_submission(
            session,
            experiment,
            model_path=base_dir,
            fingerprint=snapshot.fingerprint,
            snapshot=snapshot.name,
            is_baseline=True,
            reuse_from=cached.submission_id if cached is not None and reusable else None,
            split=split,
        )
        if split == Split.VALIDATION:
            experiment.validation_baseline_submission_id = submission.id
        else:
            experiment.baseline_submission_id = submission.id
        submission_id = held.attach(submission)
    if held.queued:
        dispatch_committed(state)
    return submission_id


def forget_released(session: Session, experiment: Experiment) -> list[str]:
    """Let go of the snapshots of ``experiment`` (a row locked for update) that no submission holds
    any more (:func:`sealed_final.snapshot_holders`): their rows forget them in this transaction. Returns
    the names to remove from the storage once it is committed (:func:`remove_released`): until
    then a nomination still finds the row naming its files, after it takes them again."""
    holders = sealed_final.snapshot_holders(session, experiment)
    kept_rows = {row.id for row in holders}
    kept = {row.snapshot for row in holders}
    released = set()
    named = session.scalars(
        select(Submission).where(Submission.experiment_id == experiment.id, Submission.snapshot.is_not(None))
    ).all()
    for submission in named:
        if submission.id in kept_rows or submission.snapshot is None:
            continue
        if submission.snapshot not in kept:
            released.add(submission.snapshot)
        submission.snapshot = None
    return sorted(released)


def remove_released(state: GraderState, names: list[str]) -> list[str]:
    root = snapshot_root(state)
    for name in names:
        remove_snapshot(root / name)
    return names


def release_snapshots(state: GraderState, name: str) -> list[str]:
    """Remove the snapshots experiment ``name`` no longer holds (:func:`forget_released`), in a
    transaction of its own under its row lock. Returns their names."""
    with state.db.session() as session:
        released = forget_released(session, experiments.get_experiment(session, name, for_update=True))
    return remove_released(state, released)


def prune_orphan_snapshots(state: GraderState) -> list[str]:
    """Remove the snapshots no evaluation needs any more, experiment by experiment under its row
    lock (:func:`release_snapshots`): at once those of final submissions (the evaluators may mount
    the snapshots read-only and then cannot remove them themselves), a sealed experiment's
    validation snapshots but the one its final would take, and those no submission names once they
    are old (a crash between copying and committing)."""
    with state.db.session() as session:
        names = session.scalars(
            select(Experiment.name)
            .where(
                Experiment.id.in_(
                    select(Submission.experiment_id).where(
                        Submission.snapshot.is_not(None),
                        Submission.status.not_in([SubmissionStatus.QUEUED, SubmissionStatus.RUNNING]),
                    )
                )
            )
            .order_by(Experiment.id)
        ).all()
    removed: list[str] = []
    for name in names:
        removed += release_snapshots(state, name)
    with state.db.session() as session:
        keep = {
            name
            for name in session.scalars(select(Submission.snapshot).where(Submission.snapshot.is_not(None)))
            if name is not None
        }
    return removed + prune_snapshots(snapshot_root(state), keep)


def _load(
    state: GraderState, experiment_name: str, submission_id: int, agent: bool
) -> tuple[Submission, SubmissionAnswer | PendingAnswer]:
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, experiment_name)
        submission = submissions.get_submission(session, submission_id, experiment)
        if not submission.status.final:
            return submission, pending_view(session, submission, agent=agent)
        view = agent_submission_view if agent else submission_view
        return submission, view(session, experiment, submission)


async def wait_for_result(
    state: GraderState, experiment_name: str, submission_id: int, timeout_s: float, *, agent: bool = False
) -> SubmissionAnswer | PendingAnswer:
    """Wait until the submission (``submission_id``: its global id) is final or the wait ends (the
    process's one poller wakes the waiter: autorl_grader.result_waits). Returns its answer: the
    whole one once final, else the pending one; ``agent``: as its agent is shown it (under its
    numbers, autorl_grader.views), else as an operator is. Loaded on the threads of the route's
    API (an agent's on the agent API's)."""
    submission, view = await in_agent_threads(_load, state, experiment_name, submission_id, agent)
    if submission.status.final or timeout_s <= 0:
        return view
    await state.waits.wait(submission_id, timeout_s)
    _, view = await in_agent_threads(_load, state, experiment_name, submission_id, agent)
    return view
