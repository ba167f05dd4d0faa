"""The sandbox's parts on their own: the agent API relay over real sockets, the allow-list
view's guard, the egress firewall, and what a kernel without a namespace is told."""

from __future__ import annotations

import http.client
import http.server
import ipaddress
import json
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autorl.api.request_limits import MAX_AGENT_BODY_BYTES
from autorl_agent_runner.sandbox.api_relay import (
    LOGGED_REFUSALS,
    LOGGED_REFUSALS_EVERY,
    AgentApiRelay,
    Refusal,
    route_request,
)
from autorl_agent_runner.sandbox.egress import (
    REFUSE,
    EgressError,
    allowed_network,
    firewall_rules,
    refused_destinations,
)
from autorl_agent_runner.sandbox.filesystem_view import FilesystemView, ViewError
from autorl_agent_runner.sandbox.plan import missing_protections_warning
from tests.support.requirements import require

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
    too_big = MAX_AGENT_BODY_BYTES + 1
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
            "data folders and the Hugging Face caches (HF_HOME, HF_DATASETS_CACHE, HF_HUB_CACHE, ...)"
        )


def test_view_knows_a_platform_folder_however_it_is_named(tmp_path: Path) -> None:
    """Evaluator storage set through a link into the folder of the agent's program, or the agent's
    folder reached through a link into the platform home: the folder is the platform's all the same."""
    workspace = tmp_path / "home" / "runs" / "r" / "workspace"
    disk = tmp_path / "disk"
    (disk / "eval").mkdir(parents=True)
    (tmp_path / "eval-link").symlink_to(disk / "eval")
    view = FilesystemView(
        workspace=workspace,
        read_only=[],
        python_paths=[],
        program=disk / "agent.py",
        forbidden=[tmp_path / "eval-link"],
    )
    assert [b.source for b in view.binds()] == [disk / "agent.py", workspace]
    (tmp_path / "home" / "agents").mkdir(parents=True)
    (tmp_path / "home-link").symlink_to(tmp_path / "home")
    for python in (tmp_path / "home-link" / "agents", tmp_path / "home-link"):
        with pytest.raises(ViewError):
            FilesystemView(
                workspace=workspace, read_only=[], python_paths=[python], forbidden=[tmp_path / "home"]
            ).binds()


def test_the_hugging_face_caches_are_never_in_an_agents_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``datasets`` downloads GSM8K's test split into them when no data source is set."""
    from autorl_agent_runner.settings import AgentRunnerSettings, huggingface_caches

    assert huggingface_caches({}) == [Path("~/.cache/huggingface")]
    assert huggingface_caches({"XDG_CACHE_HOME": ""}) == [Path("huggingface")]  # the working folder's
    env = {
        "XDG_CACHE_HOME": "/c",
        "HF_HOME": "/h",
        "HF_DATASETS_CACHE": "/d",
        "HF_DATASETS_DOWNLOADED_DATASETS_PATH": "/dl",
        "HF_XET_CACHE": "/x",
    }
    assert huggingface_caches(env) == [Path("/c/huggingface"), *map(Path, ["/h", "/d", "/dl", "/x"])]
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("AUTORL_HOME", str(tmp_path / "home"))
    hidden = AgentRunnerSettings().hidden_paths()
    assert tmp_path / "datasets" in hidden and Path("~/.cache/huggingface").expanduser() in hidden


#: One address of every kind of destination that is not the public internet.
NON_PUBLIC_PROBES = (
    "0.1.2.3", "10.1.2.3", "100.64.0.1", "100.127.255.254", "127.0.0.2", "169.254.169.254", "172.16.0.1",
    "172.31.255.254", "192.0.0.8", "192.0.2.1", "192.168.1.10", "198.18.0.1", "198.51.100.7", "203.0.113.9",
    "224.0.0.251", "239.255.255.250", "240.0.0.1", "255.255.255.255", "::", "::1", "::ffff:10.0.0.1",
    "64:ff9b::a00:1", "64:ff9b:1::1", "100::1", "2001:db8::1", "2002:a00:1::1", "3fff::1", "5f00::1",
    "fd12:3456::1", "fe80::1", "fec0::1", "ff02::1",
)  # fmt: skip
PUBLIC_PROBES = ("1.1.1.1", "8.8.8.8", "93.184.216.34", "2606:4700:4700::1111")


def ruleset_verdicts(rules: str) -> list[tuple[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]]]:
    """The ruleset's address rules in order: (verdict, networks)."""
    found = []
    for line in rules.splitlines():
        match = re.fullmatch(r"\s*ip6? daddr (?:\{ (.*) \}|(\S+)) (accept|reject.*)", line)
        if match and "dport" not in line:
            listed = (match.group(1) or match.group(2)).split(", ")
            found.append((match.group(3), [ipaddress.ip_network(n) for n in listed]))
    return found


def first_verdict(rules: str, address: str) -> str:
    ip = ipaddress.ip_address(address)
    for verdict, networks in ruleset_verdicts(rules):
        if any(ip.version == n.version and ip in n for n in networks):
            return verdict
    return "accept"


def test_egress_firewall_refuses_every_non_public_range_and_the_host_unless_allowed() -> None:
    rules = firewall_rules(refused_destinations(["203.0.113.50", "fd00::2", "8.8.4.4"]))
    assert 'oifname "lo" accept' in rules and "policy accept" in rules
    for address in NON_PUBLIC_PROBES:
        assert first_verdict(rules, address) == REFUSE, address
    # Whatever Python's ipaddress holds non-global is refused (a seeded sample of the IPv4 space).
    refused = [n for verdict, networks in ruleset_verdicts(rules) if verdict == REFUSE for n in networks]
    sample = random.Random(35)
    for _ in range(20_000):
        ip = ipaddress.IPv4Address(sample.getrandbits(32))
        assert ip.is_global or any(ip in n for n in refused if n.version == 4), ip
    assert first_verdict(rules, "8.8.4.4") == REFUSE  # a public address of the host itself
    assert first_verdict(rules, "10.0.2.2") == REFUSE  # the gateway: this machine's loopback
    for address in PUBLIC_PROBES:
        assert first_verdict(rules, address) == "accept", address
    assert "ip daddr 10.0.2.3 udp dport 53 accept" in rules  # the user-mode network's resolver


def test_egress_firewall_accepts_what_the_operator_names_before_refusing() -> None:
    allowed = [allowed_network("192.168.7.0/24"), allowed_network("10.20.0.5"), allowed_network("fd12::/16")]
    rules = firewall_rules(refused_destinations(["192.168.7.1"]), allowed)
    for address in ("192.168.7.1", "192.168.7.200", "10.20.0.5", "fd12::1"):
        assert first_verdict(rules, address) == "accept", address
    for address in ("192.168.8.1", "10.20.0.6", "fd13::1", "169.254.169.254"):
        assert first_verdict(rules, address) == REFUSE, address
    # Even a named range holding it never opens the gateway (this machine's own loopback).
    assert first_verdict(firewall_rules([], [allowed_network("10.0.0.0/8")]), "10.0.2.2") == REFUSE


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.1.2.3/8", "has host bits set; write the network, 10.0.0.0/8, or one address, 10.1.2.3"),
        ("example.com", "is not an address or a network; give one such as 192.168.1.0/24"),
        ("10.0.0.0/33", "is not an address or a network"),
    ],
)
def test_a_bad_allowed_network_names_the_fix(text: str, message: str) -> None:
    with pytest.raises(EgressError, match="--egress-allow") as refused:
        allowed_network(text)
    assert message in str(refused.value)


#: Runs in a new user and network namespace: a veth whose far end drops everything, the ruleset
#: from stdin, then a TCP connect to each target at once; prints what each got.
FIREWALL_PROBE = """
import errno, json, socket, subprocess, sys, time
def ip(*args):
    subprocess.run(["ip", *args], check=True)
ip("link", "set", "lo", "up")
ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
ip("link", "set", "v0", "up")
ip("link", "set", "v1", "up")
ip("addr", "add", "10.0.2.100/24", "dev", "v0")
ip("-6", "addr", "add", "fd00::100/64", "dev", "v0", "nodad")
for gateway, family in (("10.0.2.2", "-4"), ("fd00::2", "-6")):
    ip(family, "neigh", "add", gateway, "lladdr", "02:00:00:00:00:02", "dev", "v0", "nud", "permanent")
    ip(family, "route", "add", "default", "via", gateway, "dev", "v0")
subprocess.run(["nft", "-f", "-"], input=sys.stdin.read(), text=True, check=True)
socks, got = {}, {}
for address in sys.argv[1:]:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.setblocking(False)
    code = sock.connect_ex((address, 443))
    if code != errno.EINPROGRESS:
        got[address] = errno.errorcode.get(code, str(code))
    socks[address] = sock
time.sleep(1.5)  # an IPv6 refusal comes with the first retransmission, a second in
for address, sock in socks.items():
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    got.setdefault(address, errno.errorcode[code] if code else "sent")
print(json.dumps(got))
"""


def test_the_kernel_refuses_non_public_destinations_at_once_and_lets_the_rest_out() -> None:
    """The ruleset as the agent's namespace gets it, in a real kernel: a refused destination fails
    at once (no route to host, or permission denied for IPv6), an allowed or public one leaves."""
    require(all(shutil.which(tool) for tool in ("unshare", "ip", "nft")), "needs unshare, ip and nft")
    allowed = [allowed_network("192.168.7.0/24")]
    rules = firewall_rules(refused_destinations(["203.0.113.50"]), allowed)
    unicast = [a for a in NON_PUBLIC_PROBES if not ipaddress.ip_address(a).is_multicast]
    # Not these: no packet leaves for them (loopback is the agent's own, link-local needs a scope,
    # the rest cannot be sent to).
    unsent = ("0.1.2.3", "::", "::1", "127.0.0.2", "255.255.255.255", "fe80::1")
    unicast = [a for a in unicast if a not in unsent]
    leaving = ["192.168.7.9", "1.1.1.1", "2606:4700:4700::1111"]
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", FIREWALL_PROBE,
         *unicast, "10.0.2.2", "203.0.113.50", *leaving],
        input=rules, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    unprivileged = done.returncode != 0 and "Operation not permitted" in done.stderr
    require(not unprivileged, f"no user and network namespace here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    refused = {a: got[a] for a in [*unicast, "10.0.2.2", "203.0.113.50"]}
    odd = {a: r for a, r in refused.items() if r not in ("EHOSTUNREACH", "EACCES")}
    assert not odd, odd
    assert all(got[a] == "sent" for a in leaving), got


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
