"""Repository functions: every read and write of the store goes through here, each taking a session."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, and_, case, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autorl.errors import EVALUATOR_FAULT_PREFIX, ConflictError, InvalidRequestError, NotFoundError
from autorl.eval_config import MEASURED_FIELDS, EvalConfig
from autorl.store.models import (
    BaselineCache,
    EvaluationCache,
    Evaluator,
    Experiment,
    ExperimentStatus,
    FailureReason,
    Feedback,
    Split,
    Submission,
    SubmissionStatus,
    utcnow,
)

TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# -- experiments -------------------------------------------------------------------------------


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
        .where(Submission.experiment_id == experiment.id, _unevaluated())
        .values(
            status=SubmissionStatus.FAILED,
            error=CANCELLED_ERROR,
            failure_reason=FailureReason.CANCELLED,
            finished_at=experiment.finished_at,
            lease_expires_at=None,
        )
        .execution_options(synchronize_session=False)
    )


def _unevaluated() -> ColumnElement[bool]:
    return Submission.status.in_([SubmissionStatus.QUEUED, SubmissionStatus.RUNNING])


# -- submissions -------------------------------------------------------------------------------


def _agents() -> ColumnElement[bool]:
    """The agent's own submissions: neither a baseline nor a sealed experiment's final evaluation."""
    return and_(Submission.is_baseline.is_(False), Submission.final_of.is_(None))


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


def feedback_split(experiment: Experiment) -> Split:
    """The split the agent's submissions are scored on during its budget."""
    return Split.VALIDATION if experiment.feedback == Feedback.SEALED else Split.TEST


def agent_submissions_count(session: Session, experiment: Experiment) -> int:
    return (
        session.scalar(
            select(func.count(Submission.id)).where(Submission.experiment_id == experiment.id, _agents())
        )
        or 0
    )


def evaluator_fault() -> ColumnElement[bool]:
    """A submission that failed for the evaluator's own fault (its error says so). Compared byte
    for byte, as :func:`failed_for_the_platform` does: SQLite's LIKE ignores case."""
    prefix = func.substr(func.coalesce(Submission.error, ""), 1, len(EVALUATOR_FAULT_PREFIX))
    return and_(Submission.status == SubmissionStatus.FAILED, prefix == EVALUATOR_FAULT_PREFIX)


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


#: Failures that end an evaluation before the test split was loaded, or without an evaluation:
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


def limited_submissions_count(session: Session, experiment: Experiment) -> int:
    """What counts against the agent's limit: its submissions, all but those that failed for a
    reason of the platform's (:func:`failed_without_a_test_evaluation`: the evaluator's own fault,
    before the test split was loaded, cancelled), and its submits refused after the grader began
    reading the checkpoint's weights (``experiment.costly_refusals``, which have no row). Read it
    on the experiment's row locked for update (``get_experiment(..., for_update=True)``) to decide
    on it."""
    submissions = (
        session.scalar(
            select(func.count(Submission.id)).where(
                Submission.experiment_id == experiment.id,
                _agents(),
                ~failed_without_a_test_evaluation(),
            )
        )
        or 0
    )
    return submissions + (experiment.costly_refusals or 0)


def count_costly_refusal(session: Session, experiment: Experiment) -> int:
    """Count a submit refused after its checkpoint's weights were read against ``experiment``'s
    limit (a row locked for update, as when a submission is created), unless the limit is already
    reached (only a submit whose lease another grader took over can get there): what counts never
    exceeds ``max_submissions``. Returns how many submissions are left."""
    count = limited_submissions_count(session, experiment)
    if count < experiment.max_submissions:
        experiment.costly_refusals = (experiment.costly_refusals or 0) + 1
        count += 1
        session.flush()
    return max(0, experiment.max_submissions - count)


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


def final_submission_ids(session: Session, submission_ids: Sequence[int]) -> list[int]:
    """Which of these submissions are final (scored or failed)."""
    final = [status for status in SubmissionStatus if status.final]
    return list(
        session.scalars(
            select(Submission.id).where(Submission.id.in_(submission_ids), Submission.status.in_(final))
        )
    )


def last_submit_time(session: Session, experiment: Experiment) -> datetime | None:
    """When the agent last submitted (baseline evaluations excluded)."""
    return session.scalar(
        select(func.max(Submission.created_at)).where(Submission.experiment_id == experiment.id, _agents())
    )


def reusable_result(
    session: Session,
    experiment: Experiment,
    fingerprint: str,
    split: Split = Split.TEST,
    *,
    for_baseline: bool = False,
) -> Submission | None:
    """A scored evaluation of identical files on ``split`` under the experiment's evaluation
    settings whose score the experiment may take: its own (the earliest), else, for its baseline
    (``for_baseline``), a baseline of its base model. Another experiment's checkpoints are never
    reused: a score at once would tell an agent that someone else had submitted exactly these
    files. Nor is another experiment's baseline reused for the agent's own submission (a copy of
    the base model): scored at once while the experiment's own baseline is still being evaluated,
    it would tell the agent that another experiment's evaluation of the base model had just ended.
    A baseline tells nothing when it is the experiment's: it measures the base model every
    experiment on that model is given, before the agent's budget, and its times are not shown."""
    base_model_baseline = and_(
        Submission.is_baseline.is_(True),
        Submission.experiment_id.in_(select(Experiment.id).where(Experiment.model == experiment.model)),
    )
    return session.scalar(
        select(Submission)
        .where(
            Submission.eval_key == experiment_key(experiment, split),
            Submission.split == split,
            Submission.fingerprint == fingerprint,
            Submission.status == SubmissionStatus.SCORED,
            or_(Submission.experiment_id == experiment.id, base_model_baseline)
            if for_baseline
            else Submission.experiment_id == experiment.id,
        )
        .order_by(Submission.experiment_id != experiment.id, Submission.id)
        .limit(1)
    )


def evaluation_in_flight(
    session: Session, experiment: Experiment, fingerprint: str, split: Split = Split.TEST
) -> Submission | None:
    """The experiment's own evaluation of identical files that is queued or running now (not one
    that itself waits). Only the same experiment: another's would tell an agent, by the time its
    score takes, that someone else submitted these files."""
    return session.scalar(
        select(Submission)
        .where(
            Submission.experiment_id == experiment.id,
            Submission.eval_key == experiment_key(experiment, split),
            Submission.split == split,
            Submission.fingerprint == fingerprint,
            _unevaluated(),
            Submission.waits_for.is_(None),
        )
        .order_by(Submission.id)
        .limit(1)
    )


def take_score(submission: Submission, earlier: Submission) -> None:
    """Make ``submission`` scored with the score of ``earlier`` (identical files): reused, 0 s.
    ``reused_from`` names ``earlier`` itself, so a copy of the base model names its own
    experiment's baseline even when that baseline's score came from another experiment's."""
    now = utcnow()
    submission.status = SubmissionStatus.SCORED
    submission.score = earlier.score
    submission.score_opencompass = earlier.score_opencompass
    submission.score_flexible = earlier.score_flexible
    submission.score_strict = earlier.score_strict
    submission.n_samples = earlier.n_samples
    submission.correctness = earlier.correctness
    submission.problems_digest = earlier.problems_digest
    submission.reused_from = earlier.id
    submission.eval_key = earlier.eval_key  # the key the score was computed under
    submission.waits_for = None
    submission.eval_seconds = 0.0
    submission.started_at = submission.finished_at = now


def create_submission(
    session: Session,
    experiment: Experiment,
    *,
    model_path: str,
    fingerprint: str,
    snapshot: str | None = None,
    ignored_files: list[str] | None = None,
    is_baseline: bool = False,
    reuse_from: int | None = None,
    split: Split = Split.TEST,
    final_of: int | None = None,
) -> Submission:
    """Insert a submission. Identical files the experiment already had scored under the same
    settings, or a baseline of its base model, reuse that score (`reusable_result`; `reuse_from`
    names the scored submission to take it from, e.g. a cached baseline); identical files of the
    same experiment being evaluated now are not evaluated again: the new submission waits for that
    result (`settle_waiting`). Call with the experiment's row locked
    (`get_experiment(for_update=True)`), so that this check and the evaluation's end are ordered,
    and so that an agent's submission takes the experiment's next number (`Submission.number`)."""
    submission = Submission(
        experiment_id=experiment.id,
        is_baseline=is_baseline,
        model_path=model_path,
        fingerprint=fingerprint,
        snapshot=snapshot,
        ignored_files=ignored_files,
        eval_key=experiment_key(experiment, split),
        split=split,
        final_of=final_of,
        status=SubmissionStatus.QUEUED,
        number=None if is_baseline or final_of is not None else _next_number(session, experiment),
    )
    earlier = session.get(Submission, reuse_from) if reuse_from is not None else None
    if earlier is None or earlier.status != SubmissionStatus.SCORED or earlier.split != split:
        earlier = reusable_result(session, experiment, fingerprint, split, for_baseline=is_baseline)
    if earlier is not None:
        take_score(submission, earlier)
    else:
        twin = evaluation_in_flight(session, experiment, fingerprint, split)
        submission.waits_for = twin.id if twin is not None else None
    session.add(submission)
    session.flush()
    return submission


def _next_number(session: Session, experiment: Experiment) -> int:
    """The number the experiment's next agent submission takes: one past its last (under the
    experiment's row lock, which every insert of a submission holds; the unique constraint on
    (experiment, number) stands behind it)."""
    last = session.scalar(
        select(func.max(Submission.number)).where(Submission.experiment_id == experiment.id)
    )
    return int(last or 0) + 1


#: The agent's number of the baseline it is compared with (its own submissions count from 1).
BASELINE_NUMBER = 0


def agent_submission(session: Session, experiment: Experiment, number: int) -> Submission:
    """The submission the experiment's agent numbers ``number`` (``Submission.number``), or, for
    :data:`BASELINE_NUMBER`, the baseline on the split its submissions are scored on. Anything else,
    another experiment's numbers included, is missing (NotFoundError): no probing across tenants."""
    if number == BASELINE_NUMBER:
        found = baseline_submission(session, experiment, feedback_split(experiment))
    else:
        found = session.scalar(
            select(Submission).where(Submission.experiment_id == experiment.id, Submission.number == number)
        )
    if found is None:
        raise NotFoundError(f"no submission {number} in this experiment; list yours with GET /scores")
    return found


def agent_submissions_page(
    session: Session, experiment: Experiment, *, after: int, limit: int
) -> tuple[list[Submission], bool]:
    """The agent's submissions numbered above ``after``, at most ``limit`` of them in their order,
    and whether more follow."""
    rows = list(
        session.scalars(
            select(Submission)
            .where(
                Submission.experiment_id == experiment.id,
                Submission.number.is_not(None),
                Submission.number > after,
            )
            .order_by(Submission.number)
            .limit(limit + 1)
        )
    )
    return rows[:limit], len(rows) > limit


def submissions_version(session: Session, experiment: Experiment) -> tuple[int, int]:
    """A version of everything stored about the experiment's submissions: their count and the sum
    of their revisions (``Submission.revision``). Every insert raises the first and every update the
    second, and neither ever falls, so a version is never seen twice: an answer built from the
    submissions may be kept while their version stays the same (autorl_grader.answer_cache)."""
    count, revisions = session.execute(
        select(func.count(Submission.id), func.coalesce(func.sum(Submission.revision), 0)).where(
            Submission.experiment_id == experiment.id
        )
    ).one()
    return int(count), int(revisions)


def get_submission(session: Session, submission_id: int, experiment: Experiment | None = None) -> Submission:
    submission = session.get(Submission, submission_id)
    if submission is None or (experiment is not None and submission.experiment_id != experiment.id):
        # Another experiment's submission looks exactly like a missing one: no cross-experiment probing.
        raise NotFoundError(f"no submission {submission_id} in this experiment; list yours with GET /scores")
    return submission


def experiment_submissions(session: Session, experiment: Experiment) -> Sequence[Submission]:
    return session.scalars(
        select(Submission).where(Submission.experiment_id == experiment.id).order_by(Submission.id)
    ).all()


def best_submission(session: Session, experiment: Experiment) -> Submission | None:
    return session.scalar(
        select(Submission)
        .where(
            Submission.experiment_id == experiment.id,
            _agents(),
            Submission.status == SubmissionStatus.SCORED,
        )
        .order_by(Submission.score.desc(), Submission.id)
        .limit(1)
    )


def baseline_submission(
    session: Session, experiment: Experiment, split: Split = Split.TEST
) -> Submission | None:
    """The experiment's baseline evaluation on ``split`` (a sealed experiment has one on each)."""
    wanted = (
        experiment.validation_baseline_submission_id
        if split == Split.VALIDATION
        else experiment.baseline_submission_id
    )
    return None if wanted is None else session.get(Submission, wanted)


# -- sealed mode: the nomination and the one final test evaluation ------------------------------


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
    submission = session.scalar(
        select(Submission).where(Submission.experiment_id == experiment.id, Submission.number == number)
    )
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


def final_choice(session: Session, experiment: Experiment) -> tuple[Submission | None, str]:
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
            select(Submission)
            .where(
                Submission.experiment_id == experiment.id,
                Submission.snapshot.is_not(None),
                _unevaluated(),
            )
            .order_by(Submission.id)
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


def queue_position(session: Session, submission: Submission) -> int:
    """1-based position among its own experiment's queued agent submissions (oldest first): the
    agent's submissions waiting ahead of it, plus one; 0 when it is not waiting. Nothing else is
    counted: not other experiments' queues (not the caller's to see), nor the platform's own work
    for the experiment (its baselines, a sealed experiment's evaluations on the test split), so the
    number derives from the agent's own acts only. A submission waiting for an identical one's
    evaluation has that one's position (0 once it runs)."""
    if submission.status != SubmissionStatus.QUEUED:
        return 0
    if submission.waits_for is not None:
        evaluated = session.get(Submission, submission.waits_for)
        return queue_position(session, evaluated) if evaluated is not None else 0
    ahead = session.scalar(
        select(func.count(Submission.id)).where(
            Submission.experiment_id == submission.experiment_id,
            _agents(),
            Submission.status == SubmissionStatus.QUEUED,
            Submission.waits_for.is_(None),
            Submission.id < submission.id,
        )
    )
    return int(ahead or 0) + 1


def in_flight_count(session: Session, experiment: Experiment | None = None) -> int:
    stmt = select(func.count(Submission.id)).where(
        Submission.status.in_([SubmissionStatus.QUEUED, SubmissionStatus.RUNNING])
    )
    if experiment is not None:
        stmt = stmt.where(Submission.experiment_id == experiment.id)
    return int(session.scalar(stmt) or 0)


# -- evaluation lifecycle ----------------------------------------------------------------------


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
        .where(Submission.id == submission_id, _held_by(worker))
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


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
    (autorl.uncertainty). The submissions waiting for this evaluation take the same result."""
    lock_experiment_of(session, submission_id)
    result = session.execute(
        update(Submission)
        .where(Submission.id == submission_id, _held_by(worker))
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
    submission = session.scalar(select(Submission).where(Submission.id == submission_id, _held_by(worker)))
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
                _unevaluated(),
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


def release(session: Session, submission_id: int, *, worker: str, error: str) -> None:
    """Give a submission back to the queue after a transient failure (the worker is shutting down)."""
    session.execute(
        update(Submission)
        .where(Submission.id == submission_id, _held_by(worker))
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


def _held_by(worker: str) -> ColumnElement[bool]:
    """Running under ``worker``: only the worker that holds a submission renews, records or releases it."""
    return and_(Submission.status == SubmissionStatus.RUNNING, Submission.worker == worker)


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


def claimable_in_fair_order(session: Session, *, limit: int | None = None) -> list[Claimable]:
    """Submissions waiting for an evaluator, in the order evaluators should take them.

    Baselines first (every experiment waits for its own), then sealed experiments' final
    evaluations (made once, after the agent: no agent's queue may starve them); then round robin
    across experiments:
    the experiment with the fewest evaluations running, then the one whose last evaluation started
    longest ago (never comes first), then the oldest submission. A flooding experiment therefore
    gets one evaluator turn per round, like every other, however many submissions it queued."""
    now = utcnow()
    rank = case((Submission.is_baseline, 0), (Submission.final_of.is_not(None), 1), else_=AGENT_RANK)
    served = (
        select(
            Submission.experiment_id.label("experiment_id"),
            func.count(Submission.id)
            .filter(Submission.status == SubmissionStatus.RUNNING, Submission.lease_expires_at >= now)
            .label("running"),
            func.max(Submission.started_at).label("last_started"),
        )
        .where(Submission.started_at.is_not(None), Submission.reused_from.is_(None))
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


# -- baseline cache ----------------------------------------------------------------------------


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
            score=submission.score,
            score_opencompass=submission.score_opencompass,
            score_flexible=submission.score_flexible,
            score_strict=submission.score_strict,
        )
    )


# -- results of `autorl evaluate` --------------------------------------------------------------


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


# -- evaluators that report themselves alive --------------------------------------------------


def report_evaluator(session: Session, *, name: str, queue: str, backends: Sequence[str]) -> None:
    """An evaluator says it is alive and takes work from ``queue`` for ``backends``."""
    now = utcnow()
    row = session.get(Evaluator, name)
    if row is None:
        session.add(Evaluator(name=name, queue=queue, backends=list(backends), started_at=now, last_seen=now))
    else:
        row.queue, row.backends, row.last_seen = queue, list(backends), now


def forget_evaluator(session: Session, name: str) -> None:
    """An evaluator stops: it takes no more work."""
    row = session.get(Evaluator, name)
    if row is not None:
        session.delete(row)


def live_evaluators(session: Session, *, queue: str, backend: str, alive_s: float) -> int:
    """Evaluators that reported within ``alive_s`` seconds, take work from ``queue`` and run ``backend``."""
    since = utcnow() - timedelta(seconds=alive_s)
    rows = session.scalars(select(Evaluator).where(Evaluator.queue == queue, Evaluator.last_seen >= since))
    return sum(1 for row in rows if backend in (row.backends or []))


def evaluation_order_position(session: Session, submission_id: int) -> int:
    """1-based place of a waiting submission in the order evaluators take work (all experiments,
    baselines first); 0 when it does not wait for an evaluator."""
    order = [c.submission_id for c in claimable_in_fair_order(session)]
    return order.index(submission_id) + 1 if submission_id in order else 0
