"""Only wiring: `create_app(settings)` builds the grader."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from autorl import __version__
from autorl.errors import (
    AutoRLError,
    CheckpointError,
    ConflictError,
    DeadlineExceededError,
    ForbiddenError,
    InvalidRequestError,
    ModelSourceError,
    NotFoundError,
    ServiceUnavailableError,
    SubmissionLimitError,
    UnknownTaskError,
)
from autorl.store import migrate
from autorl_grader.access_log import install_access_sampling
from autorl_grader.api.deps import capability_token
from autorl_grader.api.refusals import REFUSAL_RESPONSES
from autorl_grader.api.routes import admin, agent, ops, provenance, ui, ui_summary
from autorl_grader.body_limit import BodyLimit
from autorl_grader.fair_share import FairShareLayer
from autorl_grader.logging_setup import install_redaction
from autorl_grader.reconciler import Reconciler
from autorl_grader.settings import GraderSettings
from autorl_grader.state import GraderState
from autorl_grader.thread_pools import size_admin_threads

log = logging.getLogger("autorl.grader")

STATUS_BY_ERROR: list[tuple[type[AutoRLError], int]] = [
    (CheckpointError, 400),
    (UnknownTaskError, 400),
    (ModelSourceError, 400),
    (InvalidRequestError, 400),
    (DeadlineExceededError, 403),
    (ForbiddenError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (SubmissionLimitError, 429),
    (ServiceUnavailableError, 503),
]


def _status_for(exc: AutoRLError) -> int:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "invalid request: " + "; ".join(parts) + " (see the API schema at /docs)"


def refusal(status_code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Every refusal: ``detail`` (FastAPI's field) and ``error`` (what reference clients read)."""
    return JSONResponse({"detail": message, "error": message}, status_code=status_code, headers=headers)


def create_app(settings: GraderSettings, *, run_migrations: bool = True, reconcile: bool = True) -> FastAPI:
    settings.require_store_credentials()
    state = GraderState.build(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        install_redaction()
        install_access_sampling()
        size_admin_threads(settings.admin_threads)
        state.db.wait_until_ready()
        if run_migrations:
            migrate(state.db)
        state.know_experiment_tokens()
        reconciler = Reconciler(state, settings.reconcile_interval_s) if reconcile else None
        if reconciler:
            reconciler.start()
        log.info("event=grader_started queue=%s", state.dispatcher.kind)
        try:
            yield
        finally:
            if reconciler:
                reconciler.stop()
            state.db.dispose()

    app = FastAPI(title="AutoRL grader", version=__version__, lifespan=lifespan, responses=REFUSAL_RESPONSES)
    app.state.grader = state
    app.add_middleware(BodyLimit)
    # Outermost: an agent request past its experiment's fair share is refused before its body is read.
    agent_roots = {route.path.split("/")[1] for route in agent.router.routes if isinstance(route, APIRoute)}
    app.add_middleware(FairShareLayer, fair_share=state.fair_share, agent_roots=agent_roots)

    @app.exception_handler(AutoRLError)
    async def _autorl_error(_: Request, exc: AutoRLError) -> JSONResponse:
        retry_after = exc.retry_after_s if isinstance(exc, ServiceUnavailableError) else None
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return refusal(_status_for(exc), str(exc), headers)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return refusal(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.scope.get("endpoint") is agent.submit and agent.lacks_model_path(exc.errors()):
            return refusal(400, agent.MISSING_MODEL_PATH)
        return refusal(422, _describe_validation(exc))

    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(provenance.router)
    app.include_router(agent.router)
    app.include_router(agent.router, prefix="/a/{token}", dependencies=[Depends(capability_token)])
    app.include_router(ui.router)
    app.include_router(ui_summary.router)
    return app
