"""The grader's HTTP protocol: uvicorn's h11 protocol, with every refusal readable by the client, and
what a client's connections may cost bounded.

uvicorn's own protocol answers a header block over h11's limit with a plain-text 400 and closes at
once, and closes at once after an answer that ends the connection: with the client's bytes still
arriving, the kernel then resets the connection and the client sees ``ConnectionResetError``, not
the reason. Here the header block is capped at :data:`autorl.api.request_limits.MAX_HEADER_BYTES`
(as in the sandbox's relay), an unparsable request is answered with the grader's JSON refusal
(431 for a header block over the limit, 400 otherwise), and a connection that must close while
the client is still sending its request is half-closed: the answer goes out, what still comes in
is read and dropped for at most :data:`~autorl.api.request_limits.DRAIN_S` seconds and
:data:`~autorl.api.request_limits.DRAIN_BYTES` bytes, then it closes.

uvicorn's protocol also waits for a request as long as the client likes and takes every connection
it is offered, so connections that each hold part of a request (up to a body's megabyte, read before
any route or token is checked) could grow the grader's memory without bound. Here (limits in
:class:`ConnectionLimits`, their values and reasons in :mod:`autorl.api.request_limits`):

- a request must arrive whole (line, headers and body) within ``read_s`` of when the grader begins
  to wait for it (the connection opened, or the previous answer sent); past it the answer is 408 and
  the connection closes as above, and the app reading its body sees the client gone;
- what the grader writes must leave it within ``write_s``: each write's bytes that the socket did
  not take at once wait in the transport's buffer for the client to read them, and if some are
  still there ``write_s`` after they were written (a client that does not read its answers), the
  connection is aborted: the buffer is dropped, the slot freed, and an app waiting to write more
  sees the client gone. A drain that gives up aborts too, so what the client never read of a
  refusal is dropped with it rather than held for a close that would wait for it. The allocator
  keeps what such buffers freed for the process (glibc returns little of it on its own), so soon
  after connections were aborted with unsent bytes the grader hands the freed memory back to the
  system (``malloc_trim``; at most once per :data:`RELEASE_MEMORY_AFTER_S`);
- a port serves at most ``per_port`` connections at once, and one client address at most
  ``per_client`` of them; on ``paced_port`` (the agent port of a grader with an admin port of its
  own, where each agent pod has an address of its own) at most ``paced_per_client``, so that one
  experiment, or a few, cannot fill the port; there an address opens at most ``new_per_s`` new
  connections a second (bursts of ``new_burst``),
  so that requests it does not wait the answer of, or that cannot be parsed, cost the grader no
  more than accepting a connection: past that pace a new one is closed unanswered, as a full listen
  queue would (answering cost the grader as much as the 400s it replaced: one core at about 5,000
  connections a second from one address). Past a cap, a new connection is answered 503 with a
  Retry-After at once and closed as above. The agent port and the admin port are counted apart,
  so agents that fill one leave the other to the controller. Refused connections being answered
  are themselves capped (``refusals`` per port): past that, a new one is closed unanswered, as a
  full listen queue would.

``autorl grader`` passes this protocol to uvicorn explicitly (:meth:`AnsweringH11Protocol.limited`),
so it is used even where httptools is installed.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
from collections import Counter, deque
from dataclasses import dataclass
from functools import cache
from http import HTTPStatus
from typing import Any, ClassVar, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from autorl.api.request_limits import (
    ANSWER_WRITE_S,
    DRAIN_BYTES,
    DRAIN_S,
    MAX_AGENT_PORT_CONNECTIONS_PER_CLIENT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    NEW_CONNECTIONS_PER_S,
    REQUEST_READ_S,
    RETRY_AFTER_S,
    RequestParser,
    request_too_slow,
    too_many_connections,
    unparsable_request,
)
from autorl_grader.fair_share import Admission, Budget, FairShare

#: Refused connections logged one by one, for each port, reason and client address; past this, one
#: line per LOGGED_REFUSALS_EVERY more of the same (a client decides how often it is refused, not how
#: large the grader's log grows, and one client's flood does not hide another's refusals: the
#: controller's on the admin port, another agent's). At most REFUSAL_KEYS (port, reason, client)
#: are counted apart; past that, the rest share one count.
LOGGED_REFUSALS = 100
LOGGED_REFUSALS_EVERY = 1000
REFUSAL_KEYS = 4096
#: Writes this close together share the time of the first for the write deadline, so that a
#: connection keeps at most ``write_s`` / WRITE_MARK_S of them (a deadline up to this much early).
WRITE_MARK_S = 0.1
#: How long after a connection was aborted with unsent bytes the grader hands freed memory back to
#: the system; the aborts meanwhile share the one call (about 10 ms for a heap of a few hundred MiB).
RELEASE_MEMORY_AFTER_S = 1.0


def release_freed_memory() -> None:
    """Hands the memory that the C allocator keeps after frees back to the system: glibc's
    ``malloc_trim``; nothing where the C library has none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim() -> Any:
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server's connections may take (module docstring); tests shorten them."""

    read_s: float = REQUEST_READ_S
    write_s: float = ANSWER_WRITE_S
    per_port: int = MAX_CONNECTIONS
    per_client: int = MAX_CONNECTIONS_PER_CLIENT
    refusals: int = MAX_CONNECTIONS
    new_per_s: float = NEW_CONNECTIONS_PER_S
    new_burst: int = MAX_CONNECTIONS_PER_CLIENT
    paced_port: int | None = None
    paced_per_client: int = MAX_AGENT_PORT_CONNECTIONS_PER_CLIENT


#: Why a connection is closed unanswered: its address opens them faster than ``new_per_s``.
OPENED_TOO_FAST = "opened_too_fast"


class ConnectionSlots:
    """The connections one server holds, by listening port and by port and client address, and the
    refused ones it is still answering, by port. Used from the event loop's thread only."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._on_port: Counter[int | None] = Counter()
        self._from_client: Counter[tuple[int | None, str | None]] = Counter()
        self._refusing: Counter[int | None] = Counter()
        self.refused = 0
        self._refused_by: Counter[tuple[int | None, str, str | None]] = Counter()
        self._release: asyncio.TimerHandle | None = None
        # New connections on the paced port, a token bucket per address (kept as the fair share keeps its).
        self._opened = FairShare(Budget(limits.new_per_s, limits.new_burst, in_flight=limits.new_burst))

    def take(self, port: int | None, client: str | None) -> str | None:
        """A slot for a new connection: None once taken, else the reason it is refused
        (:data:`OPENED_TOO_FAST`: closed unanswered)."""
        paced = port is not None and port == self.limits.paced_port
        per_client = self.limits.per_client
        if paced:
            # Every new connection is charged to the pace first, refused or not: a refusal answered
            # costs as much as a request answered.
            opened = self._opened.admit(None, client)
            if not isinstance(opened, Admission):
                return OPENED_TOO_FAST
            opened.release()
            per_client = min(per_client, self.limits.paced_per_client)
        if self._from_client[(port, client)] >= per_client:
            return too_many_connections(per_client, per_client=True)
        if self._on_port[port] >= self.limits.per_port:
            return too_many_connections(self.limits.per_port, per_client=False)
        self._on_port[port] += 1
        self._from_client[(port, client)] += 1
        return None

    def give_back(self, port: int | None, client: str | None) -> None:
        self._on_port[port] -= 1
        self._from_client[(port, client)] -= 1
        if not self._from_client[(port, client)]:
            del self._from_client[(port, client)]  # an address that left takes no room

    def take_refusal(self, port: int | None) -> bool:
        """Whether a refused connection on ``port`` may be answered (else it is closed at once)."""
        if self._refusing[port] >= self.limits.refusals:
            return False
        self._refusing[port] += 1
        return True

    def give_back_refusal(self, port: int | None) -> None:
        self._refusing[port] -= 1

    def release_memory_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """A connection was aborted with unsent bytes: hand freed memory back once it is freed
        (the app writing to it returns, its answer with it, in the next iterations of the loop)."""
        if self._release is None:
            self._release = loop.call_later(RELEASE_MEMORY_AFTER_S, self._release_memory)

    def _release_memory(self) -> None:
        self._release = None
        release_freed_memory()

    def count_refusal(self, port: int | None, reason: str, client: str | None) -> int:
        """Counts a refusal; returns how many of the same (port, reason, client) there were, this
        one included, when it is to be logged, else 0."""
        self.refused += 1
        key = (port, reason, client)
        if key not in self._refused_by and len(self._refused_by) >= REFUSAL_KEYS:
            key = (None, reason, None)
        self._refused_by[key] += 1
        same = self._refused_by[key]
        return same if same <= LOGGED_REFUSALS or same % LOGGED_REFUSALS_EVERY == 0 else 0


class _Parser(RequestParser):
    """The request parser, keeping the last parse error so that the answer can name its cause."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise


class _Transport:
    """The connection's transport as the protocol's request cycles use it: closing while the
    client is still sending half-closes and drains instead."""

    def __init__(self, transport: asyncio.Transport, protocol: AnsweringH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._protocol.write(data)

    def close(self) -> None:
        if (
            self._protocol.conn.their_state is h11.SEND_BODY
            and not self._protocol.draining
            and not self._transport.is_closing()
        ):
            self._protocol.drain()
        else:
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol.draining or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class AnsweringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits and answers described above."""

    #: Shared by every connection of every server that uses this class; :meth:`limited` gives a
    #: server slots (and limits) of its own.
    slots: ClassVar[ConnectionSlots] = ConnectionSlots(ConnectionLimits())

    @classmethod
    def limited(cls, limits: ConnectionLimits) -> type[AnsweringH11Protocol]:
        """This protocol for one server: its connections share slots of their own, under ``limits``."""
        return cast(
            type[AnsweringH11Protocol], type(cls.__name__, (cls,), {"slots": ConnectionSlots(limits)})
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parser = _Parser()
        self.conn = self._parser
        self.draining = False
        self._drained = 0
        self._drain_deadline: asyncio.TimerHandle | None = None
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        #: Bytes written to the transport so far, and (how many had been written with a write's
        #: last byte, when) for each write the socket has not taken all of yet, oldest first.
        self._written = 0
        self._unsent: deque[tuple[int, float]] = deque()
        self._socket_transport: asyncio.Transport | None = None
        #: (port, client address) of the slot this connection holds, or None.
        self._slot: tuple[int | None, str | None] | None = None
        #: Whether this connection was refused and holds one of its port's refusals being answered.
        self._answering_refusal = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._socket_transport = transport
        super().connection_made(cast(asyncio.Transport, _Transport(transport, self)))
        port = self.server[1] if self.server else None
        address = self.client[0] if self.client else None
        refusal = self.slots.take(port, address)
        if refusal is None:
            self._slot = (port, address)
            self._watch_request()
            return
        self._log_refusal("too_many_connections" if refusal != OPENED_TOO_FAST else refusal, port, address)
        if refusal == OPENED_TOO_FAST or not self.slots.take_refusal(port):
            transport.abort()
            return
        self._answering_refusal = True
        self._answer(503, refusal, [("retry-after", str(RETRY_AFTER_S))])
        self.drain()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._drain_deadline, self._read_deadline, self._write_deadline):
            if timer is not None:
                timer.cancel()
        self._read_deadline = self._write_deadline = None
        self._unsent.clear()
        if self._slot is not None:
            self.slots.give_back(*self._slot)
            self._slot = None
        if self._answering_refusal:
            self.slots.give_back_refusal(self.server[1] if self.server else None)
            self._answering_refusal = False
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.draining:
            super().data_received(data)
            self._watch_request()
            return
        self._drained += len(data)
        if self._drained > DRAIN_BYTES:
            self._close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_request()  # the connection stays open: the next request's deadline starts

    def _should_upgrade(self) -> bool:
        # The grader serves no WebSocket; an upgraded connection would leave this protocol, and the
        # slot it holds, behind. A request asking for one is served as plain HTTP.
        return False

    def _watch_request(self) -> None:
        """Arms the request's deadline while the grader waits for a request or the rest of one;
        cancels it once the request is whole (or the connection is closing)."""
        transport = self._socket_transport
        waiting = (
            self._slot is not None
            and not self.draining
            and transport is not None
            and not transport.is_closing()
            and self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        )
        if waiting and self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.slots.limits.read_s, self._request_too_slow)
        elif not waiting and self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Writes to the client; what the socket does not take at once is timed (module docstring)."""
        transport = self._socket_transport
        assert transport is not None
        transport.write(data)
        self._written += len(data)
        if not transport.get_write_buffer_size():
            self._watch_answer()  # all taken: earlier writes' bytes too
            return
        now = self.loop.time()
        if self._unsent and now - self._unsent[-1][1] < WRITE_MARK_S:
            self._unsent[-1] = (self._written, self._unsent[-1][1])
        else:
            self._unsent.append((self._written, now))
        self._watch_answer()

    def _watch_answer(self) -> None:
        """Forgets the writes the socket has taken whole; aborts the connection if the oldest write
        it has not is ``write_s`` old, else arms a deadline for it."""
        transport = self._socket_transport
        assert transport is not None
        sent = self._written - transport.get_write_buffer_size()
        while self._unsent and self._unsent[0][0] <= sent:
            self._unsent.popleft()
        if not self._unsent:
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None
            return
        due = self._unsent[0][1] + self.slots.limits.write_s
        if due <= self.loop.time():
            self._log_refusal("answer_not_read", *(self._slot or (None, None)))
            self._abort()
        elif self._write_deadline is None:
            self._write_deadline = self.loop.call_at(due, self._answer_deadline)

    def _answer_deadline(self) -> None:
        self._write_deadline = None
        self._watch_answer()

    def _request_too_slow(self) -> None:
        """The request did not arrive whole in time: 408, then close as after every refusal."""
        self._read_deadline = None
        transport = self._socket_transport
        if self.draining or transport is None or transport.is_closing():
            return
        self._log_refusal("request_too_slow", *(self._slot or (None, None)))
        self._refuse_request(408, request_too_slow(self.slots.limits.read_s))

    def _refuse_request(self, status: int, detail: str) -> None:
        """Answers the request being received with a refusal, unless an answer was begun already
        (the app answered before reading the whole body), and closes as after every refusal. An
        app still reading the request's body sees the client gone."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True
            cycle.message_event.set()
        if (
            cycle is None
            or not cycle.response_started
            or (cycle.response_complete and self.conn.their_state is not h11.SEND_BODY)
        ):
            self._answer(status, detail)
        self.drain()

    def _answer(self, status: int, detail: str, headers: list[tuple[str, str]] | None = None) -> None:
        """Writes a refusal in the grader's JSON shape that ends the connection, past h11 (which
        has no request to answer when none was received)."""
        body = json.dumps({"detail": detail, "error": detail}).encode()
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            *(f"{name}: {value}" for name, value in headers or []),
        ]
        self.write("\r\n".join([*lines, "", ""]).encode("latin-1") + body)

    def _log_refusal(self, reason: str, port: int | None, address: str | None) -> None:
        same = self.slots.count_refusal(port, reason, address)
        if same:
            self.logger.warning(
                "event=connection_refused reason=%s port=%s client=%s same=%d refusals=%d",
                reason,
                port,
                address,
                same,
                self.slots.refused,
            )

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn for a request h11 cannot parse (``msg`` is uvicorn's generic text)."""
        error = self._parser.error
        status, detail = (
            unparsable_request(error.error_status_hint, str(error)) if error else unparsable_request(400, msg)
        )
        self._refuse_request(status, detail)

    def drain(self) -> None:
        """Send what is buffered and end our side; drop what the client still sends, bounded."""
        transport = self._socket_transport
        assert transport is not None
        self.draining = True
        self._watch_request()  # a request's deadline no longer applies; the drain's does
        self.flow.resume_reading()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._drain_deadline = self.loop.call_later(DRAIN_S, self._close)

    def _close(self) -> None:
        """The drain gives up: what the client has not read yet is dropped (a close would wait
        for it as long as the client does not read)."""
        self._abort()

    def _abort(self) -> None:
        """Closes the connection at once, dropping what it has not sent."""
        transport = self._socket_transport
        assert transport is not None
        self._unsent.clear()
        if transport.get_write_buffer_size():
            self.slots.release_memory_soon(self.loop)
        transport.abort()
