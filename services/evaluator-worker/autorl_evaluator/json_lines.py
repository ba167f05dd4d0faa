"""One JSON object a line over a Unix socket: how the worker talks to the programs it keeps
resident (the engine server, the warm OpenCompass) and OpenCompass's ``vllm`` shim to the engine.

A request is one connection: the client sends one line, the server answers with one line or more
(the warm OpenCompass: the run's pid, then its end) and shuts the connection down. A line is read
to its own end, never to the connection's: the engine's processes, forked while a request is
served, hold copies of the connection.

Standard library only: the engine server runs in vLLM's Python, the warm OpenCompass and the shim
in OpenCompass's; none has our packages, so each loads this file by its path.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

#: What one read asks of the socket.
CHUNK_BYTES = 1 << 20
#: How much of a failed request's error its answer carries.
MAX_ERROR_CHARS = 2000


class FramingError(ValueError):
    """What came is not one JSON object a line: a line past its limit, a line the peer cut short
    by closing the connection, or a line that holds another JSON value."""


class Connection:
    """One end of a connection: objects sent and received a line each."""

    def __init__(self, sock: socket.socket, *, max_line_bytes: int | None = None) -> None:
        self.socket = sock
        #: The longest line :meth:`receive` accepts (None: any).
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()

    def close(self) -> None:
        self.socket.close()

    def set_timeout(self, seconds: float | None) -> None:
        """How long a send or a receive may wait (None: for ever); past it they raise ``TimeoutError``."""
        self.socket.settimeout(seconds)

    def send(self, message: Mapping[str, Any]) -> None:
        self.socket.sendall(json.dumps(message).encode() + b"\n")

    def reply(self, message: Mapping[str, Any]) -> None:
        """:meth:`send`, unless the peer has gone: what a server does next never depends on whether
        its client still listens (an evaluation that was stopped closes its end)."""
        with contextlib.suppress(OSError):
            self.send(message)

    def receive(self) -> dict[str, Any] | None:
        """The next line's object; None when the peer closed the connection before a line began.
        Raises :class:`FramingError` (a line past :attr:`max_line_bytes`, cut short, or not an
        object), ``ValueError`` for a line that is not JSON, and ``TimeoutError`` when the timeout
        passes first (what was read stays for the next call)."""
        searched = 0
        while (end := self._buffer.find(b"\n", searched)) < 0:
            self._check_length(len(self._buffer))
            searched = len(self._buffer)
            chunk = self.socket.recv(CHUNK_BYTES)
            if not chunk:
                if self._buffer:
                    raise FramingError("the peer closed the connection in the middle of a line")
                return None
            self._buffer += chunk
        self._check_length(end)
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        message = json.loads(line)
        if not isinstance(message, dict):
            raise FramingError("a line holds one JSON object")
        return message

    def _check_length(self, size: int) -> None:
        if self.max_line_bytes is not None and size > self.max_line_bytes:
            raise FramingError(f"a line longer than {self.max_line_bytes} bytes")


@contextlib.contextmanager
def connect(path: str | os.PathLike[str], *, timeout_s: float | None = None) -> Iterator[Connection]:
    """A connection to the server listening at ``path``, closed on leaving; ``OSError`` when none
    can be made."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(os.fspath(path))
        yield Connection(sock)


def request(
    path: str | os.PathLike[str], message: Mapping[str, Any], *, timeout_s: float | None = None
) -> dict[str, Any] | None:
    """One request to the server at ``path`` and its answer (None: it closed the connection
    without one)."""
    with connect(path, timeout_s=timeout_s) as connection:
        connection.send(message)
        return connection.receive()


def listen(path: Path, *, backlog: int = 4) -> socket.socket:
    """A socket listening at ``path``, its owner's only. It is bound under a name of its own and
    renamed once listening: whoever sees ``path`` can connect (a client that polls for the path
    never meets a socket that refuses)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    binding = path.with_name(f".{path.name}.{os.getpid()}")
    binding.unlink(missing_ok=True)
    old_mask = os.umask(0o177)
    try:
        listener.bind(str(binding))
    finally:
        os.umask(old_mask)
    listener.listen(backlog)
    os.replace(binding, path)
    return listener


def serve(
    listener: socket.socket,
    handle: Callable[[dict[str, Any], Connection], None],
    *,
    max_request_bytes: int,
) -> NoReturn:
    """Serve ``listener``'s connections one at a time, for ever. Each brings one request, which
    ``handle`` answers on the connection (:meth:`Connection.reply`, once or more). A request that
    cannot be read, or that ``handle`` fails, is answered ``{"ok": false, "error": ...}`` (its
    traceback to this process's output, the server's log): the worker decides what follows. The
    connection is then shut down, not only closed: processes forked while the request was served
    hold copies of it, and closing this one would not end it for the client."""
    while True:
        sock, _ = listener.accept()
        with sock:
            connection = Connection(sock, max_line_bytes=max_request_bytes)
            try:
                message = connection.receive()
                if message is None:
                    raise FramingError("the connection closed before a request")
                handle(message, connection)
            except Exception as exc:
                traceback.print_exc()
                connection.reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]})
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
