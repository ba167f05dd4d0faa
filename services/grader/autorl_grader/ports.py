"""Two listening ports for one grader: the agent port serves only the agent API, the admin port all.

A NetworkPolicy filters by address and port, never by URL path, so "agents may reach the agent API
but not the admin API or the metrics" is enforceable in a cluster only if the two listen on
different ports: the chart lets every pod reach the agent port and only the platform's own pods
the admin port. On the agent port a request is served only when the route it would reach is an
agent route (or a probe) and no other, and every request there, whatever its path, is charged to
its experiment's or its address's fair share first (:mod:`autorl_grader.fair_share`): a flood of
probes or of paths that are not served costs the grader what any agent request does.
"""

from __future__ import annotations

import re
from functools import cached_property

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from autorl_grader.fair_share import AGENT_PORT_KEY, FairShareLayer

#: Served on the agent port besides the agent API: probes, which reveal nothing (the chart's kubelet
#: probes use the admin port, which agents' connections cannot fill).
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
AGENT_TAG = "agent"
_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


class AgentPortGuard:
    """ASGI wrapper: on ``agent_port`` answer 404 unless the path can only be an agent route.

    The routes come from the app's OpenAPI document (every route, with its tags): a path is served
    when it matches an operation tagged "agent" and no operation of another tag — an allow-list,
    so a route added later is admin-only until it is tagged for agents.
    """

    def __init__(self, app: FastAPI, *, agent_port: int) -> None:
        self.app = app
        self.agent_port = agent_port
        # What the agent port does not serve is refused only once charged, as any agent request.
        self._not_served = FairShareLayer(_not_served, fair_share=app.state.grader.fair_share, agent_roots=())

    @cached_property
    def _patterns(self) -> tuple[list[re.Pattern[str]], list[re.Pattern[str]]]:
        agent: list[re.Pattern[str]] = []
        other: list[re.Pattern[str]] = []
        for template, item in self.app.openapi().get("paths", {}).items():
            pattern = compile_path(template)[0]
            tags = [
                tag for method, op in item.items() if method in _HTTP_METHODS for tag in op.get("tags", [])
            ]
            (agent if tags and all(tag == AGENT_TAG for tag in tags) else other).append(pattern)
        return agent, other

    def allows(self, path: str) -> bool:
        if path in PROBE_PATHS:
            return True
        agent, other = self._patterns
        return any(p.match(path) for p in agent) and not any(p.match(path) for p in other)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        on_agent_port = scope["type"] == "http" and server is not None and server[1] == self.agent_port
        if on_agent_port:
            scope[AGENT_PORT_KEY] = True
            if not self.allows(scope["path"]):
                await self._not_served(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _not_served(scope: Scope, receive: Receive, send: Send) -> None:
    detail = (
        "not found on the agent port; the admin API and the metrics are served on the "
        "grader's admin port, which only the platform reaches"
    )
    await JSONResponse({"detail": detail, "error": detail}, status_code=404)(scope, receive, send)
