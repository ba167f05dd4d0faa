"""Store rows as the grader's answer models (autorl.api.answers): a view that produced a field its
model does not declare would fail here, so what is sent is what the OpenAPI document says. Times
are epoch seconds, as in the workspace's run_meta.json.

Two audiences see submissions. Operators (the admin API, the dashboard) see the global ids the
database keeps. An agent sees its own numbers (``Submission.number``: 1, 2, ... per experiment, 0
its baseline), as the reference's one server per run counts them, so no id it is shown counts
another experiment's submissions; and of a baseline, the platform's work before its budget, it is
shown no time (:func:`agent_submission_view`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from autorl.api.answers import (
    Best,
    ExperimentAnswer,
    PendingAnswer,
    PendingStatusName,
    ProtocolScores,
    ScoresAnswer,
    SubmissionAnswer,
    SubmissionStatusName,
    TimeAnswer,
    WaitingAnswer,
)
from autorl.protocol.final import final_result, uncertainty_view
from autorl.protocol.statistics import Evaluated
from autorl.provenance.lineage import experiment_lineage, submission_lineage
from autorl.store import (
    Experiment,
    Feedback,
    Split,
    Submission,
    SubmissionStatus,
    claims,
    evaluator_presence,
    experiments,
    sealed_final,
    submissions,
)
from autorl.store.models import utcnow
from autorl.wait_reasons import baseline_wait
from autorl_grader.settings import GraderSettings


def epoch(dt: datetime | None) -> float | None:
    return None if dt is None else round(dt.timestamp(), 3)


def iso_utc(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="seconds")


def _elapsed_seconds(submission: Submission) -> float | None:
    """From receipt to the final answer, as the reference's ``elapsed_seconds`` (queue wait included)."""
    if submission.finished_at is None or not submission.status.final:
        return None
    return round(max(0.0, (submission.finished_at - submission.created_at).total_seconds()), 2)


def _improvement(score: float | None, baseline: float | None) -> float | None:
    return None if score is None or baseline is None else score - baseline


def display_path(experiment: Experiment, path: str) -> str:
    """A submission's path as the agent knows it: relative to its workspace when inside it."""
    try:
        return str(Path(path).relative_to(experiment.workspace))
    except ValueError:
        return path


def baseline_score(session: Session, experiment: Experiment, split: Split = Split.TEST) -> float | None:
    baseline = submissions.baseline_submission(session, experiment, split)
    return baseline.score if baseline is not None and baseline.status == SubmissionStatus.SCORED else None


def best_view(
    experiment: Experiment, best: Submission | None, baseline: float | None, *, agent: bool = False
) -> Best:
    """The best scored submission ``best`` as the reference's ``best`` carries it: the whole entry
    that scores.json holds for it (every field null while none is scored); ``agent``: under the
    agent's number of it."""
    if best is None:
        return Best(**dict.fromkeys(Best.model_fields))
    return Best(
        submission_id=best.number if agent else best.id,
        score=best.score,
        timestamp=iso_utc(best.created_at),
        model_path=display_path(experiment, best.model_path),
        baseline_score=baseline,
        improvement=_improvement(best.score, baseline),
        elapsed_seconds=_elapsed_seconds(best),
    )


def own_reused_from(session: Session, experiment: Experiment, submission: Submission) -> int | None:
    """The submission whose score was reused, only when it is this experiment's own: another
    experiment's ids are never shown (the reuse itself shows as 0 evaluation seconds)."""
    if submission.reused_from is None:
        return None
    source = session.get(Submission, submission.reused_from)
    return submission.reused_from if source is not None and source.experiment_id == experiment.id else None


def agent_number(experiment: Experiment, submission: Submission) -> int | None:
    """The agent's number of ``submission``: its own submissions' (1, 2, ...), or
    :data:`submissions.BASELINE_NUMBER` for the baseline on the split it is scored on; None for what the
    agent never sees (a sealed experiment's evaluations on the test split)."""
    if submission.number is not None:
        return submission.number
    if submission.is_baseline and submission.split == experiments.feedback_split(experiment):
        return submissions.BASELINE_NUMBER
    return None


def agent_reused_from(session: Session, experiment: Experiment, submission: Submission) -> int | None:
    """:func:`own_reused_from` as the agent numbers it: its own submission's number, 0 for its baseline."""
    if submission.reused_from is None:
        return None
    source = session.get(Submission, submission.reused_from)
    if source is None or source.experiment_id != experiment.id:
        return None
    return agent_number(experiment, source)


@dataclass(frozen=True)
class ExperimentTotals:
    """What every submission view of one experiment repeats: read once per request, not per row."""

    baseline_score: float | None
    #: The best, under its global id (operators) and under the agent's number of it.
    best: Best
    agent_best: Best
    total_submissions: int
    #: The scored baseline's evaluation, which every score is compared with.
    baseline: Evaluated | None = None

    @classmethod
    def read(cls, session: Session, experiment: Experiment, split: Split | None = None) -> ExperimentTotals:
        """The totals as the agent is shown them: against the baseline on the split its
        submissions are scored on (sealed: validation), or on ``split`` (an operator's view of
        a sealed experiment's test evaluations)."""
        split = split or experiments.feedback_split(experiment)
        baseline = baseline_score(session, experiment, split)
        baseline_row = submissions.baseline_submission(session, experiment, split)
        best = submissions.best_submission(session, experiment)
        return cls(
            baseline_score=baseline,
            best=best_view(experiment, best, baseline),
            total_submissions=submissions.agent_submissions_count(session, experiment),
            baseline=Evaluated.of(baseline_row) if baseline is not None and baseline_row else None,
            agent_best=best_view(experiment, best, baseline, agent=True),
        )


def _status(submission: Submission) -> SubmissionStatusName:
    return submission.status.value


def submission_view(
    session: Session, experiment: Experiment, submission: Submission, totals: ExperimentTotals | None = None
) -> SubmissionAnswer:
    """The operator's view (global ids, and ``number``, the agent's of it). Every field set, so
    that an answer dumped with ``exclude_unset`` keeps the nulls the contract shows; only
    ``queue_position`` is left unset (and out) once the submission is final."""
    fields = _submission_fields(session, experiment, submission, totals)
    return SubmissionAnswer(**fields, number=submission.number, lineage=submission_lineage(submission))


#: A submission's times: a baseline's are never the agent's to see (:func:`agent_submission_view`).
TIME_FIELDS = ("timestamp", "elapsed_seconds", "eval_seconds", "created_at", "finished_at")


def agent_submission_view(
    session: Session, experiment: Experiment, submission: Submission, totals: ExperimentTotals | None = None
) -> SubmissionAnswer:
    """The agent's view: :func:`submission_view` under the agent's numbers (``submission_id``,
    ``best.submission_id``, ``reused_from``: :func:`agent_number`). A baseline is the platform's
    work before the agent's budget: its times are null. They would tell what the agent cannot
    otherwise observe: how long the evaluators took for other work then (a sealed experiment's
    test evaluation of the base model, other experiments' baselines queued ahead), or that another
    experiment had measured the base model before (a score reused at once). Nor are its
    ``attempts`` (0 where its score was another experiment's, 1 or more where it was evaluated
    for this one): shown as 0."""
    totals = totals or ExperimentTotals.read(session, experiment)
    fields = _submission_fields(session, experiment, submission, totals)
    number = agent_number(experiment, submission)
    if number is None:
        raise ValueError(f"submission {submission.id} is not one its experiment's agent sees")
    fields.update(
        submission_id=number,
        best=totals.agent_best,
        reused_from=agent_reused_from(session, experiment, submission),
    )
    if submission.is_baseline:
        fields.update(dict.fromkeys(TIME_FIELDS), attempts=0)
    return SubmissionAnswer(**fields)


def totals_by_split(
    session: Session, experiment: Experiment, rows: Iterable[Submission]
) -> dict[Split, ExperimentTotals]:
    """The totals each of ``rows`` is shown with, on its own split: each row compared with the
    baseline there (a sealed experiment's final evaluation: the one on test)."""
    return {split: ExperimentTotals.read(session, experiment, split) for split in {row.split for row in rows}}


def _submission_fields(
    session: Session, experiment: Experiment, submission: Submission, totals: ExperimentTotals | None
) -> dict[str, Any]:
    totals = totals or ExperimentTotals.read(session, experiment)
    baseline = totals.baseline_score
    pending: dict[str, Any] = {}
    if not submission.status.final:
        pending["queue_position"] = submissions.queue_position(session, submission)
    return dict(
        submission_id=submission.id,
        status=_status(submission),
        score=submission.score,
        split=submission.split.value,
        scores=ProtocolScores(
            opencompass=submission.score_opencompass,
            flexible=submission.score_flexible,
            strict=submission.score_strict,
        ),
        baseline_score=baseline,
        improvement=_improvement(submission.score, baseline),
        best=totals.best,
        total_submissions=totals.total_submissions,
        model_path=display_path(experiment, submission.model_path),
        # The reference's two fields: when the submission was received (ISO 8601) and how long
        # it took to answer; created_at / finished_at give the same in epoch seconds.
        timestamp=iso_utc(submission.created_at),
        elapsed_seconds=_elapsed_seconds(submission),
        is_baseline=submission.is_baseline,
        reused_from=own_reused_from(session, experiment, submission),
        n_samples=submission.n_samples,
        eval_seconds=submission.eval_seconds,
        attempts=submission.attempts,
        error=submission.error,
        ignored_files=submission.ignored_files or [],
        created_at=epoch(submission.created_at),
        finished_at=epoch(submission.finished_at),
        **uncertainty_view(submission, totals.baseline),
        **pending,
    )


def scores_view(session: Session, experiment: Experiment, *, after: int, limit: int) -> ScoresAnswer:
    """``GET /scores``: the agent's submissions numbered above ``after``, at most ``limit``, each as
    :func:`agent_submission_view` shows it; ``next_after`` set while more follow."""
    rows, more = submissions.agent_submissions_page(session, experiment, after=after, limit=limit)
    totals = ExperimentTotals.read(session, experiment)
    return ScoresAnswer(
        experiment=experiment.name,
        baseline_score=totals.baseline_score,
        best=totals.agent_best,
        total_submissions=totals.total_submissions,
        submissions=[agent_submission_view(session, experiment, row, totals) for row in rows],
        next_after=rows[-1].number if more and rows else None,
    )


def pending_view(session: Session, submission: Submission, *, agent: bool = False) -> PendingAnswer:
    """The answer to a submit not scored yet; ``agent``: under the agent's number of it."""
    shown = submission.number if agent else submission.id
    if shown is None:
        raise ValueError(f"submission {submission.id} is not one its experiment's agent sees")
    return PendingAnswer(
        submission_id=shown,
        status=cast(PendingStatusName, submission.status.value),
        queue_position=submissions.queue_position(session, submission),
        ignored_files=submission.ignored_files or [],
        split=submission.split,
        interval=None,
        comparison=None,
    )


#: The answers of :func:`answer_response`, as a route's OpenAPI ``responses`` declare them.
ANSWER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SubmissionAnswer, "description": "scored or failed"},
    202: {"model": PendingAnswer, "description": "accepted; the evaluation is still running"},
}
#: ``POST /submit``'s: with ``?wait=false`` 202 whatever the submission is.
SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ANSWER_RESPONSES,
    202: {
        "model": SubmissionAnswer | PendingAnswer,
        "description": "accepted: the evaluation is still to come, or ?wait=false (then the whole "
        "answer where its score was known at once: identical files reused one)",
    },
}


def answer_response(answer: SubmissionAnswer | PendingAnswer, *, accepted: bool = False) -> JSONResponse:
    """A submission's answer where the route chooses its status code: 200 once it is final (scored
    or failed), else 202 with the pending answer; ``accepted`` (``?wait=false``): 202 whatever it
    is. Dumped as a ``response_model`` route dumps it: every null the contract shows stays, and an
    unset optional field is left out."""
    status_code = 200 if isinstance(answer, SubmissionAnswer) and not accepted else 202
    return JSONResponse(answer.model_dump(mode="json", exclude_unset=True), status_code=status_code)


def time_view(experiment: Experiment, last_submit: datetime | None) -> TimeAnswer:
    now = time.time()
    end = epoch(experiment.end_time)
    remaining = None if end is None else max(0.0, round(end - now, 3))
    return TimeAnswer(
        start_time=epoch(experiment.start_time),
        timeout_s=experiment.timeout_s,
        end_time=end,
        deadline=end,
        remaining=remaining,
        remaining_s=remaining,
        last_submit_time=epoch(last_submit),
        now=round(now, 3),
    )


@dataclass(frozen=True)
class Availability:
    """How the grader judges whether evaluators take an experiment's work (from its settings)."""

    queue: str
    alive_s: float
    unavailable_after_s: float

    @classmethod
    def of(cls, settings: GraderSettings) -> Availability:
        """From the grader's settings (``work_queue``, ``evaluator_alive_s``, ``baseline_unavailable_s``)."""
        return cls(settings.work_queue, settings.evaluator_alive_s, settings.baseline_unavailable_s)


def availability_view(session: Session, experiment: Experiment, availability: Availability) -> dict[str, Any]:
    """How many evaluators take this experiment's work and, while its baseline waits for one, why."""
    backend = str(experiment.eval_config.get("backend", "hf"))
    evaluators = evaluator_presence.live_evaluators(
        session, queue=availability.queue, backend=backend, alive_s=availability.alive_s
    )
    baseline = submissions.baseline_submission(session, experiment)
    waiting = None
    if baseline is not None and baseline.status == SubmissionStatus.QUEUED and not experiment.status.finished:
        waited_s = max(0.0, (utcnow() - baseline.created_at).total_seconds())
        position = claims.evaluation_order_position(session, baseline.waits_for or baseline.id)
        reason, message = baseline_wait(
            position=position,
            evaluators=evaluators,
            backend=backend,
            waited_s=waited_s,
            unavailable_after_s=availability.unavailable_after_s,
        )
        waiting = WaitingAnswer(
            reason=reason.value, message=message, queue_position=position, waited_s=round(waited_s, 1)
        )
    return {"evaluators": evaluators, "waiting": waiting}


def _baseline_status(
    test: Submission | None, validation: Submission | None, sealed: bool
) -> SubmissionStatusName | None:
    """The baseline's status; sealed, of both evaluations together: failed if either failed,
    scored once both are, else the one still waiting's."""
    if not sealed or test is None:
        return _status(test) if test is not None else None
    statuses = [test.status, validation.status if validation is not None else SubmissionStatus.QUEUED]
    if SubmissionStatus.FAILED in statuses:
        return "failed"
    waiting = [status for status in statuses if status != SubmissionStatus.SCORED]
    return (waiting[0] if waiting else SubmissionStatus.SCORED).value


def experiment_view(
    session: Session, experiment: Experiment, availability: Availability | None = None
) -> ExperimentAnswer:
    sealed = experiment.feedback == Feedback.SEALED
    baseline_row = submissions.baseline_submission(session, experiment)
    validation_row = (
        submissions.baseline_submission(session, experiment, Split.VALIDATION) if sealed else None
    )
    baseline = baseline_score(session, experiment)
    best = submissions.best_submission(session, experiment)
    agent_rows = [s for s in submissions.experiment_submissions(session, experiment) if s.by_agent]
    timing = time_view(experiment, submissions.last_submit_time(session, experiment))
    final = final_result(session, experiment)
    fields: dict[str, Any] = {
        "name": experiment.name,
        "task": experiment.task,
        "model": experiment.model,
        "agent": experiment.agent,
        "driver_model": experiment.driver_model,
        "status": experiment.status.value,
        "message": experiment.message,
        "baseline_score": baseline,
        "baseline_status": _baseline_status(baseline_row, validation_row, sealed),
        "baseline_submission": baseline_row.id if baseline_row else None,
        "baseline_error": (baseline_row.error if baseline_row else None)
        or (validation_row.error if validation_row else None),
        "feedback": experiment.feedback.value,
        "validation_baseline_score": baseline_score(session, experiment, Split.VALIDATION)
        if sealed
        else None,
        "validation_baseline_status": _status(validation_row) if validation_row else None,
        "final": final,
        "test_evaluations": sealed_final.test_evaluations(session, experiment),
        "test_overlap": experiment.test_overlap,
        "twin_score": experiment.twin_score,
        "twin_p_value": experiment.twin_p_value,
        "lineage": experiment_lineage(agent_rows, final.of if final is not None else None),
        "best_score": best.score if best else None,
        "best_submission": best.id if best else None,
        # Against the baseline on the split the best was scored on (sealed: validation).
        "improvement": _improvement(
            best.score if best else None,
            baseline_score(session, experiment, experiments.feedback_split(experiment)),
        ),
        "submissions": sum(1 for s in agent_rows if s.status == SubmissionStatus.SCORED),
        "total_submissions": len(agent_rows),
        "failed_submissions": sum(1 for s in agent_rows if s.status == SubmissionStatus.FAILED),
        "refused_submissions": experiment.costly_refusals or 0,
        "counted_submissions": submissions.limited_submissions_count(session, experiment),
        "in_flight": submissions.in_flight_count(session, experiment),
        "max_submissions": experiment.max_submissions,
        "timeout_s": experiment.timeout_s,
        "start_time": timing.start_time,
        "end_time": timing.end_time,
        "remaining_s": timing.remaining_s,
        "last_submit_time": timing.last_submit_time,
        "created_at": epoch(experiment.created_at),
        "finished_at": epoch(experiment.finished_at),
        "workspace": experiment.workspace,
        "eval_config": experiment.eval_config,
        **(availability_view(session, experiment, availability) if availability is not None else {}),
    }
    return ExperimentAnswer(**fields)
