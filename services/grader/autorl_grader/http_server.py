"""The grader's HTTP protocol: uvicorn's h11 protocol, with every refusal readable by the client.

uvicorn's own protocol answers a header block over h11's limit with a plain-text 400 and closes at
once, and closes at once after an answer that ends the connection: with the client's bytes still
arriving, the kernel then resets the connection and the client sees ``ConnectionResetError``, not
the reason. Here the header block is capped at :data:`autorl.api.request_limits.MAX_HEADER_BYTES`
(as in the sandbox's relay), an unparsable request is answered with the grader's JSON refusal
(431 for a header block over the limit, 400 otherwise), and a connection that must close while
the client is still sending its request is half-closed: the answer goes out, what still comes in
is read and dropped for at most :data:`~autorl.api.request_limits.DRAIN_S` seconds and
:data:`~autorl.api.request_limits.DRAIN_BYTES` bytes, then it closes. ``autorl grader`` passes this
protocol to uvicorn explicitly, so it is used even where httptools is installed.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from autorl.api.request_limits import DRAIN_BYTES, DRAIN_S, RequestParser, unparsable_request


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

    def close(self) -> None:
        if self._protocol.conn.their_state is h11.SEND_BODY and not self._protocol.draining:
            self._protocol.drain()
        else:
            self._transport.close()

    def is_closing(self) -> bool:
        return self._protocol.draining or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class AnsweringH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits and answers described above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parser = _Parser()
        self.conn = self._parser
        self.draining = False
        self._drained = 0
        self._drain_deadline: asyncio.TimerHandle | None = None
        self._socket_transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._socket_transport = transport
        super().connection_made(cast(asyncio.Transport, _Transport(transport, self)))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._drain_deadline is not None:
            self._drain_deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.draining:
            super().data_received(data)
            return
        self._drained += len(data)
        if self._drained > DRAIN_BYTES:
            self._close()

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn for a request h11 cannot parse (``msg`` is uvicorn's generic text)."""
        error = self._parser.error
        status, detail = (
            unparsable_request(error.error_status_hint, str(error)) if error else unparsable_request(400, msg)
        )
        body = json.dumps({"detail": detail, "error": detail}).encode()
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.drain()

    def drain(self) -> None:
        """Send what is buffered and end our side; drop what the client still sends, bounded."""
        transport = self._socket_transport
        assert transport is not None
        self.draining = True
        self.flow.resume_reading()
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._drain_deadline = self.loop.call_later(DRAIN_S, self._close)

    def _close(self) -> None:
        if self._socket_transport is not None:
            self._socket_transport.close()
