"""Dependencies, each declared once as an `Annotated` alias."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request

from autorl.store import Database, Experiment, experiments
from autorl_grader.settings import GraderSettings
from autorl_grader.state import GraderState
from autorl_grader.thread_pools import in_agent_threads

# The dependencies that only read what is in memory are coroutines: a synchronous one would take a
# thread (of the pool its route runs on) for each request.


async def get_state(request: Request) -> GraderState:
    state: GraderState = request.app.state.grader
    return state


StateDep = Annotated[GraderState, Depends(get_state)]


async def get_settings(state: StateDep) -> GraderSettings:
    return state.settings


async def get_db(state: StateDep) -> Database:
    return state.db


SettingsDep = Annotated[GraderSettings, Depends(get_settings)]
DbDep = Annotated[Database, Depends(get_db)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


async def capability_token(
    token: Annotated[str, Path(description="The experiment token of the capability URL /a/<token>.")],
) -> str:
    """Declares the capability URL's token in the OpenAPI document (get_agent_experiment reads it)."""
    return token


async def get_agent_experiment(request: Request, state: StateDep) -> Experiment:
    """The experiment of the caller: from the capability URL `/a/<token>/...` or a bearer token.
    A matched token is remembered for a moment (autorl_grader.expiring_cache), and its requests are
    charged to its experiment's fair share from then on (autorl_grader.fair_share)."""
    token = request.path_params.get("token") or _bearer(request)
    if not token:
        raise HTTPException(
            401,
            detail="missing credentials: use the GRADING_SERVER_URL you were given (it carries your token) "
            "or send 'Authorization: Bearer <AUTORL_TOKEN>'",
        )
    experiment = await _experiment_of(state, token)
    if experiment is None:
        raise HTTPException(
            401,
            detail="unknown or revoked token: use the GRADING_SERVER_URL / AUTORL_TOKEN of your experiment",
        )
    return experiment


async def get_optional_agent_experiment(request: Request, state: StateDep) -> Experiment | None:
    """The caller's experiment where it sent its token, else None (for routes anyone may call)."""
    token = request.path_params.get("token") or _bearer(request)
    return await _experiment_of(state, token) if token else None


async def _experiment_of(state: GraderState, token: str) -> Experiment | None:
    experiment = state.tokens.get(experiments.hash_token(token))
    if experiment is not None:
        return experiment
    experiment = await in_agent_threads(_experiment_by_token, state.db, token)
    if experiment is not None:
        state.tokens.put(experiments.hash_token(token), experiment)
        state.fair_share.know(experiments.hash_token(token))
    else:
        state.fair_share.forget(experiments.hash_token(token))
    return experiment


def _experiment_by_token(db: Database, token: str) -> Experiment | None:
    with db.read_session() as session:
        return experiments.experiment_by_token(session, token)


AgentExperimentDep = Annotated[Experiment, Depends(get_agent_experiment)]
OptionalAgentExperimentDep = Annotated[Experiment | None, Depends(get_optional_agent_experiment)]


async def require_admin(request: Request, settings: SettingsDep) -> None:
    expected = settings.admin_token_value
    given = _bearer(request) or ""
    if not expected:
        # Local mode too: an open admin API on a shared machine is every user's (`autorl grader`
        # makes a token of its own there, autorl_grader.local_admin_token).
        raise HTTPException(503, detail="the admin API is disabled: set AUTORL_ADMIN_TOKEN")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, detail="admin API: send 'Authorization: Bearer <AUTORL_ADMIN_TOKEN>'")


AdminDep = Depends(require_admin)
