"""The operators' dashboard at ``/ui``: sign-in, pages, static files and the read-only JSON they poll.

Only a dashboard session opens it. A session is made by signing in with the admin token through the
form; the cookie is secure, HTTP-only and SameSite=Strict, and holds a signed random value, never the
token. A request that carries any bearer credential (an agent's token, or the admin token meant for
the admin API) is refused on every dashboard route, and the agent's capability prefix ``/a/<token>``
has no dashboard routes at all: an agent never gets in.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from autorl.store import experiments
from autorl_grader.api.deps import DbDep, SettingsDep
from autorl_grader.api.refusals import refusals
from autorl_grader.dashboard.assets import ASSETS, asset_bytes
from autorl_grader.dashboard.data import (
    ExperimentDetail,
    ExperimentList,
    LogTailView,
    experiment_detail,
    experiment_list,
)
from autorl_grader.dashboard.log_tail import MAX_TAIL_BYTES, read_agent_tail, read_runner_tail
from autorl_grader.dashboard.session import COOKIE_NAME, SessionSigner
from autorl_grader.views import Availability

SIGN_IN = "/ui/login"
#: The sign-in form is one short field; a larger body is not a sign-in.
MAX_FORM_BYTES = 4096
#: Every dashboard answer: no framing, no inline code, nothing from another origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_BEARER_REFUSED = (
    "the dashboard does not take bearer tokens (agent tokens never open it); an operator opens "
    f"{SIGN_IN} in a browser and signs in with the admin token"
)


def refuse_bearer(request: Request) -> None:
    if request.headers.get("authorization"):
        raise HTTPException(403, detail=_BEARER_REFUSED)


router = APIRouter(prefix="/ui", tags=["dashboard"], dependencies=[Depends(refuse_bearer)])


def _signer(request: Request, settings: SettingsDep) -> SessionSigner:
    token = settings.admin_token_value
    if not token:
        raise HTTPException(
            503, detail="the dashboard is disabled: set AUTORL_ADMIN_TOKEN to sign in with it"
        )
    # One signer per app, kept so that sign-outs are remembered; a new admin token gets a new one.
    signer: SessionSigner | None = getattr(request.app.state, "dashboard_sessions", None)
    if signer is None or not signer.is_admin_token(token):
        signer = SessionSigner(token)
        request.app.state.dashboard_sessions = signer
    return signer


SignerDep = Annotated[SessionSigner, Depends(_signer)]


def _signed_in(request: Request, signer: SessionSigner) -> bool:
    return signer.verify(request.cookies.get(COOKIE_NAME))


def require_session(request: Request, signer: SignerDep) -> None:
    """JSON and static files: 401 without a valid session."""
    if not _signed_in(request, signer):
        raise HTTPException(401, detail=f"not signed in: sign in at {SIGN_IN} with the admin token")


SessionDep = Depends(require_session)


def _page(name: str, status_code: int = 200, replace: dict[str, str] | None = None) -> Response:
    body = asset_bytes(name)
    for marker, text in (replace or {}).items():
        body = body.replace(marker.encode(), text.encode())
    return Response(
        body, status_code=status_code, media_type=ASSETS[name].media_type, headers=SECURITY_HEADERS
    )


def _to_sign_in() -> Response:
    return RedirectResponse(SIGN_IN, status_code=303, headers=SECURITY_HEADERS)


@router.get("", include_in_schema=False)
@router.get("/", include_in_schema=False)
def experiments_page(request: Request, signer: SignerDep) -> Response:
    return _page("experiments.html") if _signed_in(request, signer) else _to_sign_in()


@router.get("/experiments/{name}", include_in_schema=False)
def experiment_page(name: str, request: Request, signer: SignerDep) -> Response:
    return _page("experiment.html") if _signed_in(request, signer) else _to_sign_in()


@router.get("/login", include_in_schema=False)
def sign_in_page(request: Request, signer: SignerDep) -> Response:
    return RedirectResponse("/ui", status_code=303) if _signed_in(request, signer) else _page("login.html")


@router.post("/login", include_in_schema=False)
async def sign_in(request: Request, signer: SignerDep) -> Response:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, detail="the sign-in form takes one token; the body is too large")
    fields = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=4)
    given = (fields.get("token") or [""])[0].strip()
    if not given or not signer.is_admin_token(given):
        return _page(
            "login.html",
            status_code=401,
            replace={
                "<!--error-->": "That is not the admin token (AUTORL_ADMIN_TOKEN). "
                "Agent tokens never open the dashboard."
            },
        )
    response = RedirectResponse("/ui", status_code=303, headers=SECURITY_HEADERS)
    response.set_cookie(
        COOKIE_NAME,
        signer.issue(),
        max_age=signer.ttl_s,
        path="/",
        secure=True,
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/logout", include_in_schema=False)
def sign_out(request: Request, signer: SignerDep) -> Response:
    signer.revoke(request.cookies.get(COOKIE_NAME))
    response = _to_sign_in()
    response.delete_cookie(COOKIE_NAME, path="/", secure=True, httponly=True, samesite="strict")
    return response


@router.get("/static/{path:path}", include_in_schema=False)
def static_file(path: str, request: Request, signer: SignerDep) -> Response:
    asset = ASSETS.get(path)
    if asset is None or path.endswith(".html"):
        raise HTTPException(404, detail=f"no dashboard file {path!r}")
    if not asset.public:
        require_session(request, signer)
    headers = {**SECURITY_HEADERS, "Cache-Control": "private, max-age=300"}
    return Response(asset_bytes(path), media_type=asset.media_type, headers=headers)


@router.get("/api/experiments", dependencies=[SessionDep], responses=refusals(401, 403))
async def experiments_data(db: DbDep, settings: SettingsDep, response: Response) -> ExperimentList:
    response.headers.update(SECURITY_HEADERS)

    def read() -> ExperimentList:
        with db.read_session() as session:
            return experiment_list(session, Availability.of(settings))

    return await run_in_threadpool(read)


@router.get("/api/experiments/{name}", dependencies=[SessionDep], responses=refusals(401, 403, 404))
async def experiment_data(
    name: str, db: DbDep, settings: SettingsDep, response: Response
) -> ExperimentDetail:
    response.headers.update(SECURITY_HEADERS)

    def read() -> ExperimentDetail:
        with db.read_session() as session:
            return experiment_detail(session, name, Availability.of(settings))

    return await run_in_threadpool(read)


@router.get("/api/experiments/{name}/log", dependencies=[SessionDep], responses=refusals(401, 403, 404))
async def agent_log(
    name: str,
    db: DbDep,
    settings: SettingsDep,
    response: Response,
    tail_bytes: int = Query(MAX_TAIL_BYTES, gt=0, le=MAX_TAIL_BYTES),
    source: Literal["agent", "runner"] = Query(
        "agent", description="agent: the agent's own output (agent.log); runner: the platform's events"
    ),
) -> LogTailView:
    response.headers.update(SECURITY_HEADERS)

    def read() -> LogTailView:
        with db.read_session() as session:
            workspace = experiments.get_experiment(session, name).workspace
        if source == "runner":
            tail = read_runner_tail(settings.home, name, tail_bytes)
        else:
            tail = read_agent_tail(workspace, tail_bytes)
        return LogTailView(**asdict(tail))

    return await run_in_threadpool(read)
