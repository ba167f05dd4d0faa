"""The agent API. Mounted twice: at the root (bearer token) and under the capability URL `/a/{token}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from autorl.store import repository as repo
from autorl_grader.api.deps import AgentExperimentDep, DbDep, StateDep
from autorl_grader.submissions import accept, wait_for_result
from autorl_grader.views import ExperimentTotals, submission_view, time_view

router = APIRouter(tags=["agent"])


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_path: str = Field(
        min_length=1, description="Checkpoint folder inside your workspace's output/ (relative or absolute)."
    )
    gpu: Any = Field(None, description="Accepted for compatibility with reference clients and ignored.")


@router.post("/submit", responses={202: {"description": "accepted; the evaluation is still running"}})
async def submit(
    body: SubmitRequest,
    experiment: AgentExperimentDep,
    state: StateDep,
    wait: bool = Query(True, description="Wait for the score (at most the server's wait time, then 202)."),
) -> JSONResponse:
    submission_id = await run_in_threadpool(accept, state, experiment, body.model_path)
    timeout = state.settings.submit_wait_s if wait else 0.0
    final, view = await wait_for_result(state, experiment.name, submission_id, timeout)
    return JSONResponse(view, status_code=200 if final else 202)


@router.get("/submissions/{submission_id}")
def get_submission(submission_id: int, experiment: AgentExperimentDep, db: DbDep) -> dict[str, Any]:
    with db.session() as session:
        submission = repo.get_submission(session, submission_id, experiment)
        return submission_view(session, experiment, submission)


@router.get("/scores")
def scores(experiment: AgentExperimentDep, db: DbDep) -> dict[str, Any]:
    with db.session() as session:
        rows = [s for s in repo.experiment_submissions(session, experiment) if not s.is_baseline]
        totals = ExperimentTotals.read(session, experiment)
        return {
            "experiment": experiment.name,
            "baseline_score": totals.baseline_score,
            "best": totals.best,
            "total_submissions": totals.total_submissions,
            "submissions": [submission_view(session, experiment, s, totals) for s in rows],
        }


@router.get("/time")
def time_left(experiment: AgentExperimentDep, db: DbDep) -> dict[str, Any]:
    with db.session() as session:
        return time_view(experiment, session)


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}
