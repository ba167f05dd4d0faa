"""The grader's agent API, forwarded into the agent's network namespace, and nothing else.

The agent's network namespace holds only loopback. The relay listens there on the grader's own
address (``GRADING_SERVER_URL`` keeps its shape) and forwards a request to the grader only when
it is one of the agent routes, under this experiment's ``/a/<token>`` or at the root (where the
grader checks the bearer token). Every request on a connection is parsed (h11), so a second,
pipelined request is checked like the first; the admin API, ``/metrics``, the docs and anything
unknown are answered 404 here and never reach the grader. Only an allow-list of headers goes
through, and bodies are capped.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

import h11

from autorl.api.request_limits import (
    DRAIN_BYTES,
    DRAIN_S,
    MAX_AGENT_BODY_BYTES,
    MAX_AGENT_CONNECTIONS,
    RequestParser,
    body_too_large,
    unparsable_request,
)

#: The grader's agent routes (docs/AGENTS.md, "The grading API"), by method.
AGENT_ROUTES: dict[str, re.Pattern[str]] = {
    "GET": re.compile(r"/(scores|time|health|submissions/[0-9]{1,18})"),
    "POST": re.compile(r"/(submit|set_baseline|final)"),
}
AGENT_API_SUMMARY = "POST /submit, POST /final, GET /submissions/ID, /scores, /time, /health"
_CAPABILITY_PREFIX = re.compile(r"/a/(?P<token>[A-Za-z0-9_-]{1,256})(?P<route>/.*)")
_QUERY = re.compile(r"[A-Za-z0-9_.=&-]*")
#: Request headers passed on to the grader; everything else is dropped.
FORWARDED_REQUEST_HEADERS = frozenset({b"authorization", b"content-type", b"accept", b"user-agent"})
#: Response headers passed back to the agent.
FORWARDED_RESPONSE_HEADERS = frozenset({"content-type", "retry-after", "location"})
#: Longer than the grader holds a blocking /submit (540 s by default).
UPSTREAM_TIMEOUT_S = 660.0
#: An idle agent connection is closed after this long.
IDLE_TIMEOUT_S = 900.0
#: Connections the agent may hold at once; past it a new one is closed. The grader allows one
#: address this many and more (request_limits.MAX_CONNECTIONS_PER_CLIENT).
MAX_CONNECTIONS = MAX_AGENT_CONNECTIONS
_ACCEPT_POLL_S = 0.5


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str


def route_request(method: str, target: str, token: str) -> str | Refusal:
    """The path to ask the grader for, or why the request is not forwarded."""
    path, _, query = target.partition("?")
    if not _QUERY.fullmatch(query):
        return Refusal(400, "the query string holds characters the agent API never uses")
    route = path
    prefixed = _CAPABILITY_PREFIX.fullmatch(path)
    if prefixed is not None:
        if prefixed["token"] != token:
            return Refusal(401, "unknown experiment token; use GRADING_SERVER_URL as given")
        route = prefixed["route"]
    allowed = AGENT_ROUTES.get(method)
    if allowed is None or not allowed.fullmatch(route):
        if any(p.fullmatch(route) for p in AGENT_ROUTES.values()):
            return Refusal(405, f"{method} is not allowed on {route}")
        return Refusal(404, f"not an agent API route; the agent API is {AGENT_API_SUMMARY}")
    return target


#: Refusals logged one by one; past this, one line per LOGGED_REFUSALS_EVERY more: the agent
#: decides how many requests it sends, not how large the platform's log grows.
LOGGED_REFUSALS = 100
LOGGED_REFUSALS_EVERY = 1000


class AgentApiRelay:
    """Accepts on a listener in the agent's namespace; forwards agent routes to ``upstream``."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        upstream_host: str,
        upstream_port: int,
        token: str,
        log: Callable[[str], None],
    ) -> None:
        self._listener = listener
        self._upstream = (upstream_host, upstream_port)
        self._token = token
        self._log = log
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._refusals = 0
        self._refusals_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="autorl-api-relay", daemon=True)

    def start(self) -> None:
        self._listener.settimeout(_ACCEPT_POLL_S)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                self._log_refusal(f"reason=too_many_connections limit={MAX_CONNECTIONS}")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="autorl-api-conn", daemon=True).start()

    def _log_refusal(self, fields: str) -> None:
        with self._refusals_lock:
            self._refusals += 1
            count = self._refusals
        if count <= LOGGED_REFUSALS or count % LOGGED_REFUSALS_EVERY == 0:
            self._log(f"event=relay_refused {fields} refusals={count}")

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IDLE_TIMEOUT_S)
            _Connection(conn, self).serve()
        except (OSError, h11.ProtocolError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            self._slots.release()

    def forward(self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes) -> _Answer:
        routed = route_request(method, target, self._token)
        if isinstance(routed, Refusal):
            # The path is not logged: it may hold a token.
            self._log_refusal(f"method={method} status={routed.status}")
            return _Answer.refusal(routed)
        upstream = http.client.HTTPConnection(*self._upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            sent = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}
            upstream.request(method, routed, body=body if method == "POST" else None, headers=sent)
            response = upstream.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() in FORWARDED_RESPONSE_HEADERS]
            return _Answer(response.status, kept, data)
        except (OSError, http.client.HTTPException) as exc:
            self._log(f"event=relay_upstream_error error={type(exc).__name__}")
            return _Answer.refusal(Refusal(502, "the grader cannot be reached; try again shortly"))
        finally:
            upstream.close()


@dataclass
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @classmethod
    def refusal(cls, refusal: Refusal) -> _Answer:
        # The grader's error shape: `detail`, and the same text as `error` for reference clients.
        body = json.dumps({"detail": refusal.detail, "error": refusal.detail}).encode()
        return cls(refusal.status, [("content-type", "application/json")], body)


class _Connection:
    """One agent connection: request after request, each checked on its own."""

    def __init__(self, sock: socket.socket, relay: AgentApiRelay) -> None:
        self.sock = sock
        self.relay = relay
        self.h11 = RequestParser()

    def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(self.sock.recv(65536))

    def serve(self) -> None:
        try:
            self._serve_requests()
        except h11.RemoteProtocolError as exc:
            # Unparsable (a header block over the limit, a broken chunk): answered, as every refusal.
            self._refuse(Refusal(*unparsable_request(exc.error_status_hint, str(exc))))

    def _serve_requests(self) -> None:
        while True:
            event = self._next_event()
            if not isinstance(event, h11.Request):
                return
            method = event.method.decode("latin-1")
            target = event.target.decode("latin-1")
            headers = [(k, v) for k, v in event.headers if k in FORWARDED_REQUEST_HEADERS]
            declared = dict(event.headers).get(b"content-length", b"0")
            body = bytearray()
            # Refused before it is read when declared too large; counted as it comes otherwise.
            too_large = int(declared) > MAX_AGENT_BODY_BYTES
            while not too_large:
                part = self._next_event()
                if isinstance(part, h11.Data):
                    body += part.data
                    if len(body) > MAX_AGENT_BODY_BYTES:
                        too_large = True
                        break
                elif isinstance(part, h11.EndOfMessage):
                    break
                else:
                    return
            if too_large:
                self._refuse(Refusal(413, body_too_large(MAX_AGENT_BODY_BYTES)))
                return
            answer = self.relay.forward(method, target, headers, bytes(body))
            self._send(answer, close=False)
            if self.h11.our_state is h11.MUST_CLOSE or self.h11.their_state is h11.MUST_CLOSE:
                return
            self.h11.start_next_cycle()

    def _refuse(self, refusal: Refusal) -> None:
        """Answer, then close without resetting: the client may still be sending (a large body),
        and closing a socket with unread data would reset the connection and lose the answer."""
        self._send(_Answer.refusal(refusal), close=True)
        self.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + DRAIN_S
        drained = 0
        while drained < DRAIN_BYTES and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return
            if not chunk:
                return
            drained += len(chunk)

    def _send(self, answer: _Answer, *, close: bool) -> None:
        headers = [*answer.headers, ("content-length", str(len(answer.body)))]
        if close:
            headers.append(("connection", "close"))
        reason = HTTPStatus(answer.status).phrase
        response = h11.Response(status_code=answer.status, headers=headers, reason=reason)
        self.sock.sendall(self.h11.send(response) or b"")
        self.sock.sendall(self.h11.send(h11.Data(data=answer.body)) or b"")
        self.sock.sendall(self.h11.send(h11.EndOfMessage()) or b"")
