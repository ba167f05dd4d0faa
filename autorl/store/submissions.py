"""Submissions: their creation (the experiment's numbers, a score reused from identical files, a
wait for an identical evaluation), what counts against the limit, and the reads of them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnExpressionArgument, and_, func, or_, select
from sqlalchemy.orm import Session

from autorl.errors import NotFoundError
from autorl.store.eval_keys import experiment_key
from autorl.store.experiments import feedback_split
from autorl.store.models import (
    RESULT_COLUMNS,
    Experiment,
    Split,
    Submission,
    SubmissionStatus,
    columns_of,
    utcnow,
)
from autorl.store.submission_filters import (
    failed_without_a_test_evaluation,
    of_experiment,
    unevaluated,
)


def agent_submissions_count(
    session: Session, experiment: Experiment, *conditions: ColumnExpressionArgument[bool]
) -> int:
    """The agent's own submissions to ``experiment`` that meet every one of ``conditions``."""
    return (
        session.scalar(
            select(func.count(Submission.id)).where(
                Submission.experiment_id == experiment.id, Submission.by_agent, *conditions
            )
        )
        or 0
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
                Submission.by_agent,
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
        select(func.max(Submission.created_at)).where(
            Submission.experiment_id == experiment.id, Submission.by_agent
        )
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
        of_experiment(
            experiment,
            Submission.eval_key == experiment_key(experiment, split),
            Submission.split == split,
            Submission.fingerprint == fingerprint,
            unevaluated(),
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
    for name, value in columns_of(earlier, RESULT_COLUMNS).items():
        setattr(submission, name, value)
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
        found = session.scalar(of_experiment(experiment, Submission.number == number))
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
            of_experiment(
                experiment,
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
    return session.scalars(of_experiment(experiment).order_by(Submission.id)).all()


def best_submission(session: Session, experiment: Experiment) -> Submission | None:
    return session.scalar(
        of_experiment(
            experiment,
            Submission.by_agent,
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
            Submission.by_agent,
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
