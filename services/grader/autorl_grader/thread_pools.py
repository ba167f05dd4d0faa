"""The agent API's blocking work runs on threads of its own, apart from the admin API's.

Starlette runs a synchronous route, and ``run_in_threadpool`` its callers' work, on anyio's default
thread limiter: one pool for every route. Agents that keep it full would hold up the admin API, the
controller's calls and the probes behind them. So the agent routes (:class:`AgentRoute`, the agent
router's route class) and the agent API's own calls (:func:`in_agent_threads`) take their threads
from the grader's agent limiter (``AUTORL_AGENT_THREADS``); everything else keeps the default
limiter, sized to ``AUTORL_ADMIN_THREADS`` when the grader starts (:func:`size_admin_threads`). How
much of the agent limiter one experiment may take is the fair share's to bound (requests in flight).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Request, Response
from fastapi.routing import APIRoute

T = TypeVar("T")

#: The agent limiter of the request being served by an agent route; None elsewhere.
AGENT_THREADS: ContextVar[CapacityLimiter | None] = ContextVar("autorl_agent_threads", default=None)


async def in_agent_threads(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` on a thread of the agent limiter (in an agent route; elsewhere the default)."""
    return await anyio.to_thread.run_sync(functools.partial(func, *args), limiter=AGENT_THREADS.get())


def size_admin_threads(threads: int) -> None:
    """Sizes the default limiter, which only the admin API, dashboard and probes use. Called in the
    event loop that serves them (the limiter is the loop's)."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = threads


def _on_agent_threads(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A synchronous endpoint as a coroutine that runs it on the agent limiter (FastAPI reads the
    parameters and the answer's type through ``__wrapped__``)."""
    if inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    async def run(**kwargs: Any) -> Any:
        return await in_agent_threads(functools.partial(endpoint, **kwargs))

    return run


class AgentRoute(APIRoute):
    """An agent route: its synchronous endpoint and its dependencies' blocking calls run on the
    grader's agent limiter (``GraderState.agent_threads``)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _on_agent_threads(endpoint), **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def on_agent_threads(request: Request) -> Response:
            token = AGENT_THREADS.set(request.app.state.grader.agent_threads)
            try:
                return await handler(request)
            finally:
                AGENT_THREADS.reset(token)

        return on_agent_threads
