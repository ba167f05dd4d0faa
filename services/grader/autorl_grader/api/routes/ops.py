"""Operations: liveness, readiness, Prometheus metrics (admin token: they describe every experiment)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from autorl.errors import ServiceUnavailableError
from autorl.store import repository as repo
from autorl_grader.api.deps import AdminDep, StateDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(state: StateDep) -> Any:
    try:
        state.db.ping()
        state.dispatcher.ping()
    except ServiceUnavailableError as exc:
        return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
    return {"status": "ready", "queue": state.dispatcher.kind}


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[AdminDep])
def metrics(state: StateDep) -> str:
    gauges: dict[str, float] = {}
    try:
        with state.db.session() as session:
            gauges["autorl_submissions_in_flight"] = repo.in_flight_count(session)
            gauges["autorl_experiments"] = len(repo.list_experiments(session))
    except ServiceUnavailableError:
        gauges["autorl_database_up"] = 0
    else:
        gauges["autorl_database_up"] = 1
    return state.metrics.render(gauges)
