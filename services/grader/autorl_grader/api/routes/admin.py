"""The admin API used by the controller and `autorl run` (admin bearer token)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from autorl.api.answers import (
    ExperimentAnswer,
    RegisteredAnswer,
    SubmissionAnswer,
    TokenAnswer,
)
from autorl.api.request_bodies import FinishExperiment, RecordProvenance, RegisterExperiment, StartBudget
from autorl.errors import ConflictError
from autorl.eval_config import EvalConfig
from autorl.layout import OUTPUT_DIR
from autorl.store import eval_keys, experiments
from autorl.store import submissions as submission_store
from autorl.store.models import ExperimentStatus, Feedback, Split
from autorl.tasks import get_task
from autorl_grader.api.deps import AdminDep, DbDep, SettingsDep, StateDep
from autorl_grader.api.refusals import refusals
from autorl_grader.final import begin_final
from autorl_grader.submissions import dispatch_committed, request_baseline, wait_for_result
from autorl_grader.views import (
    ANSWER_RESPONSES,
    Availability,
    answer_response,
    experiment_view,
    submission_view,
    totals_by_split,
)

router = APIRouter(
    prefix="/v1/experiments", tags=["admin"], dependencies=[AdminDep], responses=refusals(401, 503)
)


@router.post("", status_code=201, response_model=RegisteredAnswer, responses=refusals(400, 409))
def register(body: RegisterExperiment, state: StateDep, settings: SettingsDep) -> RegisteredAnswer:
    task = get_task(body.task)
    token = experiments.new_token()
    with state.db.session() as session:
        # The split's hash and package versions as the evaluators last measured them: the baseline
        # cache hits only under the same; none yet, and the first evaluation completes the key.
        measured = eval_keys.last_measured(session, task=task.name, backend=settings.eval_backend)
        config = EvalConfig.record(task.name, settings, protocol=body.protocol, measured=measured)
        validation = None
        if body.feedback == Feedback.SEALED:
            validation = EvalConfig.record(
                task.name,
                settings,
                protocol=body.protocol,
                measured=eval_keys.last_measured(
                    session, task=task.name, backend=settings.eval_backend, split=Split.VALIDATION
                ),
                split="validation",
            )
        experiment = experiments.create_experiment(
            session,
            token=token,
            name=body.name,
            task=task.name,
            model=body.model,
            base_model_dir=str(Path(body.base_model_dir).resolve()),
            workspace=str(Path(body.workspace).resolve()),
            output_dir=str(Path(body.output_dir or Path(body.workspace) / OUTPUT_DIR).resolve()),
            agent_workspace=body.agent_workspace,
            agent=body.agent,
            driver_model=body.driver_model,
            known_checkpoints=body.known_checkpoints or None,
            timeout_s=body.timeout_s,
            max_submissions=body.max_submissions or settings.max_submissions,
            eval_config=config.stored(),
            eval_key=config.key,
            feedback=body.feedback,
            validation_eval_config=validation.stored() if validation is not None else None,
            validation_eval_key=validation.key if validation is not None else None,
        )
        view = experiment_view(session, experiment)
    state.fair_share.know(
        experiments.hash_token(token)
    )  # its agent's requests are its experiment's from the first
    return RegisteredAnswer(
        **view.model_dump(exclude_unset=True),
        token=token,
        grading_server_url=f"{settings.public_url.rstrip('/')}/a/{token}",
    )


@router.get("", response_model=list[ExperimentAnswer])
def list_all(db: DbDep, settings: SettingsDep) -> list[ExperimentAnswer]:
    availability = Availability.of(settings)
    with db.read_session() as session:
        return [experiment_view(session, e, availability) for e in experiments.list_experiments(session)]


@router.get("/{name}", response_model=ExperimentAnswer, responses=refusals(404))
def get_one(name: str, db: DbDep, settings: SettingsDep) -> ExperimentAnswer:
    with db.read_session() as session:
        return experiment_view(session, experiments.get_experiment(session, name), Availability.of(settings))


@router.post("/{name}/token", response_model=TokenAnswer, responses=refusals(404))
def new_token(name: str, state: StateDep, settings: SettingsDep) -> TokenAnswer:
    with state.db.session() as session:
        token = experiments.rotate_token(session, experiments.get_experiment(session, name, for_update=True))
    state.forget_experiment(name)
    state.fair_share.know(experiments.hash_token(token))
    return TokenAnswer(
        name=name, token=token, grading_server_url=f"{settings.public_url.rstrip('/')}/a/{token}"
    )


@router.post(
    "/{name}/baseline",
    responses={
        **ANSWER_RESPONSES,
        **refusals(400, 404),
    },
)
async def baseline(
    name: str, state: StateDep, wait: bool = Query(False), timeout_s: float | None = Query(None, gt=0)
) -> JSONResponse:
    submission_id = await run_in_threadpool(request_baseline, state, name)
    limit = (timeout_s or state.settings.submit_wait_s) if wait else 0.0
    return answer_response(await wait_for_result(state, name, submission_id, limit))


@router.post("/{name}/start", response_model=ExperimentAnswer, responses=refusals(400, 404, 409))
def start(name: str, body: StartBudget, state: StateDep) -> ExperimentAnswer:
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        if experiment.status.finished:
            raise ConflictError(
                f"experiment {name!r} is already {experiment.status.value}; register a new one"
            )
        started = None if body.start_time is None else datetime.fromtimestamp(body.start_time, UTC)
        experiments.start_budget(session, experiment, timeout_s=body.timeout_s, started_at=started)
        view = experiment_view(session, experiment)
    state.forget_experiment(name)
    return view


@router.post("/{name}/final", response_model=ExperimentAnswer, responses=refusals(404, 409))
def final(name: str, state: StateDep) -> ExperimentAnswer:
    """After a sealed experiment's agent has ended: create its one evaluation on the test split
    (of the nominated submission, else the best on validation; once; nothing when nothing was
    scored). The answer's ``final`` follows it; ``in_flight`` counts it until it is scored. A test
    experiment's answer is unchanged (its ``final`` is its best submission)."""
    begin_final(state, name)
    with state.db.session() as session:
        view = experiment_view(session, experiments.get_experiment(session, name))
    state.forget_experiment(name)
    return view


@router.post("/{name}/provenance", response_model=ExperimentAnswer, responses=refusals(404))
def provenance(name: str, body: RecordProvenance, state: StateDep) -> ExperimentAnswer:
    """Record what was found after the agent ended: the test problems its files hold (the files
    and counts stay in evaluator storage), the final's twin score and its paired test."""
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        for field in body.model_fields_set:
            setattr(experiment, field, getattr(body, field))
        view = experiment_view(session, experiment)
    state.forget_experiment(name)
    return view


@router.post("/{name}/finish", response_model=ExperimentAnswer, responses=refusals(400, 404))
def finish(name: str, body: FinishExperiment, state: StateDep) -> ExperimentAnswer:
    with state.db.session() as session:
        experiment = experiments.get_experiment(session, name, for_update=True)
        experiments.finish_experiment(session, experiment, ExperimentStatus(body.status), body.message)
        view = experiment_view(session, experiment)
    state.forget_experiment(name)
    # Its cancelled jobs leave the queue now, and other experiments' next jobs take their place.
    dispatch_committed(state)
    return view


@router.get(
    "/{name}/submissions",
    response_model=list[SubmissionAnswer],
    response_model_exclude_unset=True,
    responses=refusals(404),
)
def submissions(name: str, db: DbDep) -> list[SubmissionAnswer]:
    with db.read_session() as session:
        experiment = experiments.get_experiment(session, name)
        rows = list(submission_store.experiment_submissions(session, experiment))
        totals = totals_by_split(session, experiment, rows)
        return [submission_view(session, experiment, s, totals[s.split]) for s in rows]
