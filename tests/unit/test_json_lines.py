"""The JSON-lines framing every resident process of the evaluator speaks (autorl_evaluator.json_lines):
a line is read to its own end whatever else the connection carries, a line past its limit or cut
short by the peer is refused, and a server answers a request it cannot read with an error."""

from __future__ import annotations

import ast
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autorl_evaluator import json_lines


@pytest.fixture
def pair() -> Iterator[tuple[json_lines.Connection, socket.socket]]:
    """Our end of a connection (with a 64-byte line limit) and the raw peer."""
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, peer:
        connection = json_lines.Connection(ours, max_line_bytes=64)
        connection.set_timeout(5)
        yield connection, peer


def test_lines_are_read_one_at_a_time_however_the_bytes_arrive(
    pair: tuple[json_lines.Connection, socket.socket],
) -> None:
    connection, peer = pair
    peer.sendall(b'{"pid": 7}\n{"returncode": 0, "surv')
    assert connection.receive() == {"pid": 7}
    peer.sendall(b'ivors": []}\n')
    assert connection.receive() == {"returncode": 0, "survivors": []}
    connection.send({"text": "two\nlines", "ok": True})
    assert peer.recv(1024) == b'{"text": "two\\nlines", "ok": true}\n'


def test_a_peer_that_closes_between_lines_ends_the_stream_and_mid_line_is_refused(
    pair: tuple[json_lines.Connection, socket.socket],
) -> None:
    connection, peer = pair
    peer.sendall(b'{"ok": true}\n{"ok": tr')
    peer.shutdown(socket.SHUT_WR)
    assert connection.receive() == {"ok": True}
    with pytest.raises(json_lines.FramingError, match="middle of a line"):
        connection.receive()
    ours, other = socket.socketpair()
    with ours, other:
        other.shutdown(socket.SHUT_WR)
        assert json_lines.Connection(ours).receive() is None


def test_a_line_past_the_limit_is_refused_before_the_peer_ends_it(
    pair: tuple[json_lines.Connection, socket.socket],
) -> None:
    connection, peer = pair
    peer.sendall(b'{"prompt": "' + b"x" * 100)  # no end of line yet: refused without waiting for one
    with pytest.raises(json_lines.FramingError, match="longer than 64 bytes"):
        connection.receive()


def test_a_line_that_is_not_one_object_is_refused(pair: tuple[json_lines.Connection, socket.socket]) -> None:
    connection, peer = pair
    peer.sendall(b"[1, 2]\nnot json\n")
    with pytest.raises(json_lines.FramingError, match="one JSON object"):
        connection.receive()
    with pytest.raises(ValueError):
        connection.receive()


def test_a_server_answers_its_handler_and_an_error_for_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "server.sock"
    listener = json_lines.listen(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.sock"]  # no binding name left

    def handle(request: dict[str, Any], connection: json_lines.Connection) -> None:
        if request["op"] == "fail":
            raise RuntimeError("it failed " + "!" * 3000)
        connection.reply({"ok": True, "step": 1})
        connection.reply({"ok": True, "step": 2})

    threading.Thread(
        target=json_lines.serve, args=(listener, handle), kwargs={"max_request_bytes": 64}, daemon=True
    ).start()
    with json_lines.connect(path, timeout_s=5) as connection:
        connection.send({"op": "steps"})
        assert [connection.receive(), connection.receive(), connection.receive()] == [
            {"ok": True, "step": 1},
            {"ok": True, "step": 2},
            None,  # the server shut the connection down once answered
        ]
    failed = json_lines.request(path, {"op": "fail"}, timeout_s=5)
    assert failed is not None and failed["ok"] is False
    assert failed["error"].startswith("RuntimeError: it failed !")
    assert len(failed["error"]) == json_lines.MAX_ERROR_CHARS
    too_long = json_lines.request(path, {"op": "x" * 100}, timeout_s=5)
    assert too_long == {"ok": False, "error": "FramingError: a line longer than 64 bytes"}
    assert json_lines.request(path, {"op": "steps"}, timeout_s=5) == {"ok": True, "step": 1}


def test_connecting_where_nothing_listens_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError), json_lines.connect(tmp_path / "absent.sock", timeout_s=1):
        pass


def test_the_resident_programs_load_this_file_and_it_needs_only_the_standard_library() -> None:
    """The engine server, the warm OpenCompass and the engine's shim run in Pythons without our
    packages: each loads this very file by its path, so it may import the standard library only."""
    from autorl_evaluator.backends.opencompass import compass_server, engine_server
    from autorl_evaluator.backends.opencompass.engine_shim import vllm as shim

    here = Path(json_lines.__file__).resolve()
    assert {
        Path(program.json_lines.__file__).resolve() for program in (compass_server, engine_server, shim)
    } == {here}
    tree = ast.parse(here.read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
