"""The sandbox's parts on their own: the agent API relay over real sockets, the allow-list
view's guard, the egress firewall, and what a kernel without a namespace is told."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autorl.api.request_limits import MAX_BODY_BYTES
from autorl_agent_runner.sandbox.api_relay import (
    LOGGED_REFUSALS,
    LOGGED_REFUSALS_EVERY,
    AgentApiRelay,
    Refusal,
    route_request,
)
from autorl_agent_runner.sandbox.egress import firewall_rules
from autorl_agent_runner.sandbox.filesystem_view import FilesystemView, ViewError
from autorl_agent_runner.sandbox.plan import missing_protections_warning

TOKEN = "tok-123"


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("POST", f"/a/{TOKEN}/submit", f"/a/{TOKEN}/submit"),
        ("POST", f"/a/{TOKEN}/submit?wait=false", f"/a/{TOKEN}/submit?wait=false"),
        ("GET", f"/a/{TOKEN}/submissions/12", f"/a/{TOKEN}/submissions/12"),
        ("GET", "/time", "/time"),
        ("GET", "/health", "/health"),
        ("GET", "/metrics", 404),
        ("GET", "/v1/experiments", 404),
        ("POST", "/v1/experiments", 404),
        ("GET", f"/a/{TOKEN}/metrics", 404),
        ("GET", f"/a/{TOKEN}/../metrics", 404),
        ("GET", f"/a/{TOKEN}/time/../../metrics", 404),
        ("GET", f"/a/{TOKEN}/%2e%2e/metrics", 404),
        ("GET", f"/a/{TOKEN}//time", 404),
        ("GET", "/docs", 404),
        ("GET", "/openapi.json", 404),
        ("GET", "/a/other-token/time", 401),
        ("GET", f"/a/{TOKEN}/submit", 405),
        ("DELETE", f"/a/{TOKEN}/scores", 405),
        ("GET", f"/a/{TOKEN}/time?x=%00", 400),
    ],
)
def test_only_agent_routes_of_this_experiment_are_forwarded(
    method: str, target: str, expected: str | int
) -> None:
    routed = route_request(method, target, TOKEN)
    if isinstance(expected, int):
        assert isinstance(routed, Refusal) and routed.status == expected and routed.detail
    else:
        assert routed == expected


@dataclass
class Upstream:
    """A stand-in grader that records what reaches it."""

    port: int
    seen: list[dict[str, object]] = field(default_factory=list)


@pytest.fixture
def relay() -> Iterator[tuple[tuple[str, int], Upstream]]:
    seen: list[dict[str, object]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            seen.append({"path": self.path, "headers": dict(self.headers), "body": self.rfile.read(length)})
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("set-cookie", "session=upstream")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    upstream = Upstream(server.server_address[1], seen)
    relay = AgentApiRelay(
        listener, upstream_host="127.0.0.1", upstream_port=upstream.port, token=TOKEN, log=print
    )
    relay.start()
    try:
        yield listener.getsockname(), upstream
    finally:
        relay.close()
        server.shutdown()
        server.server_close()


def exchange(address: tuple[str, int], payload: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_pipelined_requests_are_each_checked(relay: tuple[tuple[str, int], Upstream]) -> None:
    address, upstream = relay
    data = exchange(
        address,
        f"GET /a/{TOKEN}/time HTTP/1.1\r\nHost: x\r\n\r\n"
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        f"GET /a/{TOKEN}/scores HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
    )
    assert data.count(b"HTTP/1.1 200 OK") == 2 and data.count(b"HTTP/1.1 404 Not Found") == 1
    assert [seen["path"] for seen in upstream.seen] == [f"/a/{TOKEN}/time", f"/a/{TOKEN}/scores"]


def test_only_allowed_headers_pass_and_bodies_are_capped(relay: tuple[tuple[str, int], Upstream]) -> None:
    address, upstream = relay
    body = b'{"model_path": "output/m"}'
    data = exchange(
        address,
        f"POST /a/{TOKEN}/submit HTTP/1.1\r\nHost: evil\r\nX-Forwarded-For: 10.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body,
    )
    assert data.startswith(b"HTTP/1.1 200") and b"set-cookie" not in data.lower()
    (seen,) = upstream.seen
    headers = {k.lower(): v for k, v in seen["headers"].items()}  # type: ignore[attr-defined]
    assert seen["body"] == body and headers["authorization"] == f"Bearer {TOKEN}"
    assert "x-forwarded-for" not in headers and headers["host"] == f"127.0.0.1:{upstream.port}"
    too_big = MAX_BODY_BYTES + 1
    big = exchange(
        address, f"POST /a/{TOKEN}/submit HTTP/1.1\r\nHost: x\r\nContent-Length: {too_big}\r\n\r\n".encode()
    )
    assert big.startswith(b"HTTP/1.1 413") and len(upstream.seen) == 1


def test_view_never_exposes_platform_folders(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workspace = home / "runs" / "r" / "workspace"
    agent_dir = tmp_path / "agents"
    agent_dir.mkdir()
    view = FilesystemView(
        workspace=workspace, read_only=[], python_paths=[], program=agent_dir / "a.py", forbidden=[home]
    )
    assert [b.source for b in view.binds()] == [agent_dir, workspace]
    # An agent whose folder holds the platform home: only its file is mounted.
    view = FilesystemView(
        workspace=workspace, read_only=[], python_paths=[], program=tmp_path / "a.py", forbidden=[home]
    )
    assert view.binds()[0].source == tmp_path / "a.py"
    assert view.notes == [
        f"only the agent's file {tmp_path / 'a.py'} is mounted: its folder holds platform data"
    ]
    # A Python environment inside platform data, or around it, is refused rather than mounted.
    cache = tmp_path / "cache"
    for python in (home / "cache" / "venv", tmp_path):
        with pytest.raises(ViewError) as refused:
            FilesystemView(
                workspace=workspace, read_only=[], python_paths=[python], forbidden=[home, cache]
            ).binds()
        assert str(refused.value) == (
            f"{python} would be visible to the agent but holds (or lies in) platform data ({home}, {cache}); "
            "keep the agents' Python environment and agent programs outside the platform home, cache and "
            "data folders"
        )


def test_egress_firewall_rejects_the_host_and_keeps_loopback() -> None:
    rules = firewall_rules(["192.0.2.2", "fd00::2", "169.254.0.0/16", "10.0.2.2/32"])
    assert 'oifname "lo" accept' in rules
    assert "ip daddr { 10.0.2.2/32, 169.254.0.0/16, 192.0.2.2/32 } reject" in rules
    assert "ip6 daddr { fd00::2/128 } reject" in rules


def test_missing_namespaces_are_named_loudly() -> None:
    warning = missing_protections_warning(["net", "pid"])
    assert warning.startswith("WARNING") and "network namespace" in warning and "PID namespace" in warning


@pytest.mark.parametrize(
    ("headers", "body", "status", "limit"),
    [
        ({"Content-Type": "application/json"}, b'{"model_path": "' + b"x" * (5 << 20) + b'"}', 413, "body"),
        ({"X-Pad": "p" * (200 << 10)}, b'{"model_path": "output/m"}', 431, "headers"),
        ({"X-Pad": "p" * (100 << 10)}, b'{"model_path": "output/m"}', 431, "headers"),
    ],
    ids=["5 MB body", "200 KB header", "100 KB header"],
)
def test_an_oversized_request_is_answered_with_the_limit_not_reset(
    relay: tuple[tuple[str, int], Upstream], headers: dict[str, str], body: bytes, status: int, limit: str
) -> None:
    address, upstream = relay
    # A client as reference agents use one: it sends the whole request, then reads the answer.
    connection = http.client.HTTPConnection(*address, timeout=30)
    try:
        connection.request("POST", f"/a/{TOKEN}/submit", body=body, headers=headers)
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == status and response.getheader("connection") == "close"
    assert answer["detail"] == answer["error"] and "over the grading API's limit" in answer["detail"]
    assert limit in answer["detail"] and "send only" in answer["detail"]
    assert upstream.seen == []


def test_an_agents_refused_requests_cannot_grow_the_platforms_log_without_bound() -> None:
    """Each refusal is logged up to LOGGED_REFUSALS, then one line per LOGGED_REFUSALS_EVERY more,
    with the running count: the agent decides how many requests it sends, not the log's size."""
    lines: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    relay = AgentApiRelay(listener, upstream_host="127.0.0.1", upstream_port=9, token=TOKEN, log=lines.append)
    relay.start()
    try:
        sent = 2 * LOGGED_REFUSALS_EVERY + 50
        payload = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * (sent - 1)
        data = exchange(
            listener.getsockname(), payload + b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    finally:
        relay.close()
    assert data.count(b"HTTP/1.1 404 Not Found") == sent  # every request is still answered
    assert len(lines) == LOGGED_REFUSALS + 2
    assert lines[-1] == f"event=relay_refused method=GET status=404 refusals={2 * LOGGED_REFUSALS_EVERY}"
