"""The agent API. Mounted twice: at the root (bearer token) and under the capability URL `/a/{token}`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from autorl.api.answers import (
    DEFAULT_SCORES_PAGE,
    MAX_SCORES_PAGE,
    HealthAnswer,
    NominatedAnswer,
    ScoresAnswer,
    SubmissionAnswer,
    TimeAnswer,
)
from autorl.api.request_bodies import NominateRequest, SubmitRequest
from autorl.errors import ForbiddenError
from autorl.store import Database, Experiment, submissions
from autorl_grader.api.deps import AgentExperimentDep, DbDep, OptionalAgentExperimentDep, StateDep
from autorl_grader.api.refusals import refusals
from autorl_grader.fair_share import leave_in_flight
from autorl_grader.final import nominate
from autorl_grader.state import LastSubmit
from autorl_grader.submissions import accept, submission_readable, wait_for_result
from autorl_grader.thread_pools import AgentRoute, in_agent_threads
from autorl_grader.views import (
    SUBMIT_RESPONSES,
    agent_submission_view,
    answer_response,
    scores_view,
    time_view,
)

router = APIRouter(tags=["agent"], responses=refusals(401, 413, 429, 503), route_class=AgentRoute)
#: Ids are the database's 32-bit integers: a larger one is a malformed request (422), not a lookup.
MAX_ID = 2**31 - 1

MISSING_MODEL_PATH = (
    'missing model_path: send a JSON body such as {"model_path": "output/v1"} naming a checkpoint '
    "folder under your OUTPUT_DIR, with the header Content-Type: application/json"
)


def lacks_model_path(errors: Sequence[Any]) -> bool:
    """Whether a /submit body failed only for want of ``model_path``: absent, null or empty, or no
    JSON body at all (none, or a form as ``curl -d`` sends without a JSON header). The reference
    answers those with 400, and so does this API; any other malformed body stays a 422."""

    def absent(error: Any) -> bool:
        loc, kind = tuple(error.get("loc", ())), error.get("type")
        if loc == ("body",):
            not_json = kind == "model_attributes_type" and isinstance(error.get("input"), bytes | str)
            return kind == "missing" or not_json
        if loc != ("body", "model_path"):
            return False
        null = kind == "string_type" and error.get("input") is None
        return kind in {"missing", "string_too_short"} or null

    return bool(errors) and all(absent(error) for error in errors)


@router.post(
    "/submit",
    responses={
        **SUBMIT_RESPONSES,
        **refusals(400, 403, 409, 429),
    },
)
async def submit(
    body: SubmitRequest,
    experiment: AgentExperimentDep,
    state: StateDep,
    request: Request,
    wait: bool = Query(True, description="Wait for the score (at most the server's wait time, then 202)."),
) -> JSONResponse:
    submission_id = await state.snapshot_slots.take(
        experiment.id,
        lambda: accept(state, experiment, body.model_path),
        ready=lambda: submission_readable(experiment, body.model_path),
    )
    timeout = state.settings.submit_wait_s if wait else 0.0
    leave_in_flight(request.scope)  # waiting for the score holds no place in the fair share
    answer = await wait_for_result(state, experiment.name, submission_id, timeout, agent=True)
    return answer_response(answer, accepted=not wait)


@router.get(
    "/submissions/{submission_id}",
    response_model=SubmissionAnswer,
    response_model_exclude_unset=True,
    responses=refusals(404),
)
def get_submission(
    submission_id: Annotated[
        int,
        Path(
            ge=0,
            le=MAX_ID,
            description="A number a /submit answer gave you (yours: 1, 2, ...; 0: the baseline).",
        ),
    ],
    experiment: AgentExperimentDep,
    db: DbDep,
) -> SubmissionAnswer:
    """One of your submissions by your number of it (``Submission.number``), or the baseline (0).
    Another experiment's submissions, and a sealed experiment's evaluations on the test split,
    have no number here: asked for, they are missing."""
    with db.read_session() as session:
        return agent_submission_view(
            session, experiment, submissions.agent_submission(session, experiment, submission_id)
        )


@router.post(
    "/final",
    response_model=NominatedAnswer,
    responses=refusals(400, 403, 409),
)
async def final(body: NominateRequest, experiment: AgentExperimentDep, state: StateDep) -> NominatedAnswer:
    """Sealed mode: nominate one of your scored submissions (by your number of it) for the one
    evaluation on the test split after your budget ends (once). Without a nomination the best on
    validation is taken. A submission whose files are no longer kept is taken again from its
    folder, in the experiment's turn as a submit is."""
    nominated = await state.snapshot_slots.take(
        experiment.id, lambda: nominate(state, experiment, body.submission_id)
    )
    return NominatedAnswer(
        submission_id=body.submission_id,
        split=nominated.split,
        score=nominated.score,
        message=f"submission {body.submission_id} will be evaluated once on the test split after your "
        "budget ends; its test score is not shown to you",
    )


def default_scores_page(experiment: Experiment) -> int:
    """Every submission the experiment may make, in one page (at least the reference's 100)."""
    return min(MAX_SCORES_PAGE, max(DEFAULT_SCORES_PAGE, experiment.max_submissions))


@router.get("/scores", response_model=ScoresAnswer, response_model_exclude_unset=True)
def scores(
    experiment: AgentExperimentDep,
    state: StateDep,
    db: DbDep,
    after: Annotated[
        int,
        Query(
            ge=0, le=MAX_ID, description="List your submissions numbered above this (a page's next_after)."
        ),
    ] = 0,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_SCORES_PAGE,
            description="At most this many (default: every one your limit allows, at least "
            f"{DEFAULT_SCORES_PAGE}).",
        ),
    ] = None,
) -> Response:
    """Your submissions, oldest first, a page at a time; ``next_after`` says where the next begins.
    The answer is built once per change of your submissions (autorl_grader.answer_cache)."""
    page = (after, limit or default_scores_page(experiment))
    with db.read_session() as session:
        version = submissions.submissions_version(session, experiment)
        body = state.answers.get(experiment.id, version, page)
        if body is None:
            # Built from what is read after the version (the experiment's row too: the token's may
            # be a moment old, without a baseline its version already counts), so an answer is
            # never older than the version it is kept under.
            current = session.get(Experiment, experiment.id) or experiment
            answer = scores_view(session, current, after=page[0], limit=page[1])
            body = answer.model_dump_json(exclude_unset=True).encode()
            state.answers.put(experiment.id, version, page, body)
    return Response(body, media_type="application/json")


@router.get("/time", response_model=TimeAnswer)
async def time_left(experiment: AgentExperimentDep, state: StateDep) -> TimeAnswer:
    last = state.last_submits.get(experiment.id)
    if last is None:
        last = LastSubmit(await in_agent_threads(_last_submit_time, state.db, experiment))
        state.last_submits.put(experiment.id, last)
    return time_view(experiment, last.at)


def _last_submit_time(db: Database, experiment: Experiment) -> datetime | None:
    with db.read_session() as session:
        return submissions.last_submit_time(session, experiment)


def available_gpus() -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` as the reference's ``/health`` lists it (numeric ids in order)."""
    ids = {part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()}
    return sorted(ids, key=lambda gpu: (not gpu.isdigit(), int(gpu) if gpu.isdigit() else 0, gpu))


@router.get("/health", response_model=HealthAnswer)
def health(experiment: OptionalAgentExperimentDep) -> HealthAnswer:
    """``available_gpus``: the GPU ids the reference's optional ``gpu`` field may name. Evaluators
    here choose their own GPUs, so ``gpu`` is accepted and ignored. ``task`` and ``workspace`` (as
    the agent sees it) are the caller's experiment's, as the reference answers them; without this
    experiment's token (the capability URL or a bearer token) they are null."""
    return HealthAnswer(
        status="ok",
        task=experiment.task if experiment else None,
        workspace=(experiment.agent_workspace or experiment.workspace) if experiment else None,
        available_gpus=available_gpus(),
    )


@router.post("/set_baseline", status_code=403, responses=refusals(403))
def set_baseline() -> None:
    """The reference's runner sets the baseline through this route; here the platform measures
    it itself before the agent starts, and an agent never sets it."""
    raise ForbiddenError(
        "the baseline is measured by the platform before your budget starts and cannot be set; "
        "read it as baseline_score in a /submit answer or GET /scores"
    )
