"""Operations: liveness, readiness, Prometheus metrics (admin token: they describe every experiment)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from autorl.api.answers import LiveAnswer, ReadyAnswer
from autorl.errors import ServiceUnavailableError
from autorl_grader.api.deps import AdminDep, StateDep
from autorl_grader.api.refusals import refusals
from autorl_grader.metrics import render

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> LiveAnswer:
    return LiveAnswer(status="ok")


@router.get("/readyz", response_model=ReadyAnswer, responses=refusals(503))
def readyz(state: StateDep) -> Any:
    try:
        state.db.ping()
        state.dispatcher.ping()
    except ServiceUnavailableError as exc:
        # A refusal as every other (detail, error), with the probe's status beside it.
        message = str(exc)
        return JSONResponse({"status": "unavailable", "detail": message, "error": message}, status_code=503)
    return ReadyAnswer(status="ready", queue=state.dispatcher.kind)


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[AdminDep],
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"},
        **refusals(401, 503),
    },
)
def metrics(state: StateDep) -> Response:
    """Prometheus text exposition (docs/OPERATIONS.md lists every metric)."""
    return Response(render(state.metrics), media_type=CONTENT_TYPE_PLAIN_0_0_4)
