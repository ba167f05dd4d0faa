"""Request bodies over :data:`autorl.api.request_limits.MAX_BODY_BYTES` (an agent's: over
:data:`~autorl.api.request_limits.MAX_AGENT_BODY_BYTES`) are refused before the app runs.

Every route, the agent's and the admin's, takes at most a small JSON object, so a larger body is
answered 413 as soon as its ``Content-Length`` or the part received so far passes the limit; at
most the limit and one received chunk are ever held. The answer closes the connection: the
server's protocol (:mod:`autorl_grader.http_server`) then drops what the client is still sending
for a bounded time, so that the client reads the reason instead of a reset. How long the body may
take to arrive, and how many connections may each hold one, is that protocol's to bound. A request
whose client is gone before its body is whole never reaches the app.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autorl.api.request_limits import MAX_AGENT_BODY_BYTES, MAX_BODY_BYTES, body_too_large
from autorl_grader.fair_share import is_admitted_agent_request


class BodyLimit:
    """ASGI middleware: reads an HTTP request's body up to the limit, then hands it to the app."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES, agent_max_bytes: int = MAX_AGENT_BODY_BYTES
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.agent_max_bytes = agent_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.agent_max_bytes if is_admitted_agent_request(scope) else self.max_bytes
        declared = Headers(scope=scope).get("content-length")
        # The server's parser has already refused a Content-Length that is not a number.
        if declared is not None and int(declared) > limit:
            await self._refuse(limit, scope, receive, send)
            return
        received: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # The client left, or the server gave up on it (it did not send the request whole
                # in time): nothing will read the answer, so the app is not run.
                return
            received.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                await self._refuse(limit, scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        reason = body_too_large(limit)
        answer = JSONResponse(
            {"detail": reason, "error": reason},
            status_code=413,
            headers={"connection": "close"},
        )
        await answer(scope, receive, send)
