"""The dashboard's agent summary page (``/ui/summary``) and the JSON it polls, under the same
sign-in, refusals and headers as the rest of the dashboard (:mod:`autorl_grader.api.routes.ui`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from autorl_grader.api.deps import DbDep
from autorl_grader.api.refusals import refusals
from autorl_grader.api.routes.ui import (
    SECURITY_HEADERS,
    SessionDep,
    SignerDep,
    _page,
    _signed_in,
    _to_sign_in,
    refuse_bearer,
)
from autorl_grader.dashboard.agent_summary import AgentSummaryList, agent_summary

router = APIRouter(prefix="/ui", tags=["dashboard"], dependencies=[Depends(refuse_bearer)])


@router.get("/summary", include_in_schema=False)
def summary_page(request: Request, signer: SignerDep) -> Response:
    return _page("summary.html") if _signed_in(request, signer) else _to_sign_in()


@router.get("/api/summary", dependencies=[SessionDep], responses=refusals(401, 403))
async def summary_data(db: DbDep, response: Response) -> AgentSummaryList:
    response.headers.update(SECURITY_HEADERS)

    def read() -> AgentSummaryList:
        with db.read_session() as session:
            return agent_summary(session)

    return await run_in_threadpool(read)
