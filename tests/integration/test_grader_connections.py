"""A client that holds connections open, or sends its requests slowly, costs the grader bounded memory
and no other client its service (on a cluster agents reach the grader without the sandbox's relay,
which has limits of its own). The real `autorl grader`, in both its modes, over real sockets:

- a request not received whole within the deadline (a body that stalls, headers trickled a byte at a
  time, nothing at all) is answered 408 with the usual JSON refusal and its connection is closed;
- past the connections one address may hold on a port, or a port may hold, a connection is answered
  503 with a Retry-After, while other addresses and the admin port are served;
- connections that each hold a body all but whole are capped, and the deadline releases them;
- a client that never reads its answers is cut off once what was written to it has waited for it
  past the answer deadline: its connections, and the memory their answers took, are released.

The limits are shortened through the server's own argument (``ConnectionLimits``), run by the same
command line code as `autorl grader`; the command's defaults are checked with the command itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import pytest

from autorl.api.request_limits import (
    MAX_AGENT_BODY_BYTES,
    MAX_AGENT_CONNECTIONS,
    MAX_AGENT_PORT_CONNECTIONS_PER_CLIENT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    RETRY_AFTER_S,
    request_too_slow,
    too_many_connections,
)
from tests.support.infra import free_port, grader_process
from tests.support.waiting import wait_for

AUTORL = str(Path(sys.executable).parent / "autorl")
#: `autorl grader` with the given ConnectionLimits (a JSON object, the first argument).
LAUNCH = """
import json, sys
from autorl.cli import build_parser
from autorl_grader.cli import run
from autorl_grader.http_server import ConnectionLimits
args = build_parser().parse_args(["grader", *sys.argv[2:]])
raise SystemExit(run(args, limits=ConnectionLimits(**json.loads(sys.argv[1]))))
"""
MIB = 1 << 20
#: The request deadline of the tests of it.
READ_S = 1.5
#: The answer deadline of the tests of it.
WRITE_S = 2.0
#: A request for the grader's OpenAPI document (about 76 KB; served where the admin routes are).
DOCUMENT = b"GET /openapi.json HTTP/1.1\r\nHost: grader\r\n\r\n"
SUBMIT_HEAD = (
    b"POST /submit HTTP/1.1\r\nHost: grader\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)


@dataclass
class Grader:
    process: Popen[str]
    agent_port: int
    admin_port: int | None
    token: str

    def admin_ok(self, source: str = "127.0.0.1") -> bool:
        """A fresh admin request from ``source``, on the admin port where there is one, is served."""
        port = self.admin_port or self.agent_port
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as client:
            answer = client.get(
                f"http://127.0.0.1:{port}/v1/experiments", headers={"Authorization": f"Bearer {self.token}"}
            )
        return answer.status_code == 200

    def rss(self) -> int:
        return proc_status(self.process.pid, "VmRSS")

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


@contextlib.contextmanager
def serving(tmp_path: Path, limits: dict[str, Any] | None, *, admin_port: bool) -> Iterator[Grader]:
    """`autorl grader` (with ``limits``: the same command with those ConnectionLimits) on free ports."""
    agent, admin = free_port(), free_port() if admin_port else None
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "AUTORL_HOME": str(tmp_path / "home"),  # SQLite in its home; local dispatch: no Redis
        "AUTORL_ADMIN_TOKEN": token,
        "AUTORL_PUBLIC_URL": f"http://127.0.0.1:{agent}",
    }
    for name in ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL", "AUTORL_LOCAL_MODE"):
        env.pop(name, None)
    args = ["--host", "127.0.0.1", "--port", str(agent), "--log-level", "warning"]
    if admin is not None:
        args += ["--admin-port", str(admin)]
    command = (
        [AUTORL, "grader", *args]
        if limits is None
        else [sys.executable, "-c", LAUNCH, json.dumps(limits), *args]
    )
    urls = [f"http://127.0.0.1:{port}" for port in (agent, admin) if port is not None]
    with grader_process(command, env, urls) as process:
        yield Grader(process, agent, admin, token)


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


def connect(port: int, source: str = "127.0.0.1", timeout: float = 30) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


def parse(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }
    return Answer(int(status_line.split()[1]), headers, json.loads(body) if body else None)


def read_to_close(sock: socket.socket) -> Answer:
    """Everything the grader sends until it closes the connection: one answer."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return parse(data)


def read_one(sock: socket.socket) -> Answer:
    """One answer of a kept-alive connection (its body by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(parse(head + b"\r\n\r\n").headers["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return parse(head + b"\r\n\r\n" + body)


def healthz(port: int, source: str = "127.0.0.1") -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as client:
        return client.get(f"http://127.0.0.1:{port}/healthz")


def next_connection(port: int, source: str = "127.0.0.1") -> Answer:
    """A request on a new connection, answered with a refusal that closes it."""
    with connect(port, source) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: grader\r\n\r\n")
        return read_to_close(sock)


def assert_refused(answer: Answer, status: int, reason: str) -> None:
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json" and answer.headers["connection"] == "close"
    assert answer.body == {"detail": reason, "error": reason}


@contextlib.contextmanager
def held(port: int, count: int, source: str = "127.0.0.1") -> Iterator[list[socket.socket]]:
    """``count`` connections from ``source``, each holding a request it has not finished sending."""
    socks = []
    try:
        for _ in range(count):
            sock = connect(port, source)
            # Its head unfinished: no request reaches a fair share (which would answer, then close).
            sock.sendall(b"POST /submit HTTP/1.1\r\nHost: grader\r\n")
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def never_reading(port: int, source: str = "127.0.0.1", requests: int = 8) -> socket.socket:
    """A connection that asks for ``requests`` copies of the OpenAPI document at once and reads
    none: its receive window is the smallest there is, and its segments small, as on a network
    (on loopback the grader's kernel would otherwise take megabytes of answers into its own
    buffers, where the grader does not count them)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1000)
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(DOCUMENT * requests)
    return sock


def grader_holds(sock: socket.socket) -> bool:
    """Whether the grader's end of this loopback connection is still one of its open sockets (a
    socket it closed with bytes unsent lives on in the kernel, in no process: inode 0)."""
    client_port, (_, grader_port) = sock.getsockname()[1], sock.getpeername()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        if (local, remote) == (grader_port, client_port):
            return fields[9] != "0"
    return False


def received(sock: socket.socket) -> int:
    """How many bytes the connection delivers until it ends (closed or reset)."""
    total = 0
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            total += len(chunk)
    return total


def stall_in_the_body(sock: socket.socket) -> float:
    sock.sendall(SUBMIT_HEAD % 100 + b'{"model_path": "output/')
    return time.monotonic()


def trickle_the_headers(sock: socket.socket) -> float:
    """A header byte every 0.2 s until the grader answers: the client is never idle, its request
    never complete (given up after 10 s)."""
    started = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: grader\r\nX-Slow: ")
    sock.settimeout(0.2)
    while time.monotonic() < started + 10:
        try:
            sock.recv(1, socket.MSG_PEEK)  # the answer has come (or the connection closed)
            break
        except TimeoutError:
            sock.sendall(b"s")
    sock.settimeout(READ_S + 10)
    return started


def send_nothing(sock: socket.socket) -> float:
    return time.monotonic()


def trickle_a_second_request(sock: socket.socket) -> float:
    """One request answered on the connection, then the next one trickled."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: grader\r\n\r\n")
    assert read_one(sock).status == 200
    return trickle_the_headers(sock)


@pytest.mark.parametrize(
    "stall",
    [stall_in_the_body, trickle_the_headers, send_nothing, trickle_a_second_request],
    ids=["part of a body", "headers a byte at a time", "nothing", "a second request, trickled"],
)
@pytest.mark.parametrize("admin_port", [True, False], ids=["agent port", "single port"])
def test_a_request_not_received_whole_in_time_is_answered_408_and_closed(
    tmp_path: Path, stall: Any, admin_port: bool
) -> None:
    with serving(tmp_path, {"read_s": READ_S}, admin_port=admin_port) as grader:
        with connect(grader.agent_port, timeout=READ_S + 10) as sock:
            started = stall(sock)
            answer = read_to_close(sock)  # the answer, then the grader's end of the connection
            waited = time.monotonic() - started
        assert_refused(answer, 408, request_too_slow(READ_S))
        assert READ_S - 0.2 < waited < READ_S + 5
        assert healthz(grader.agent_port).status_code == 200
        assert grader.process.poll() is None


@pytest.mark.parametrize("admin_port", [True, False], ids=["agent port", "single port"])
def test_one_address_past_its_cap_is_answered_503_and_other_clients_are_served(
    tmp_path: Path, admin_port: bool
) -> None:
    per_client = 4
    with serving(tmp_path, {"per_client": per_client, "per_port": 8}, admin_port=admin_port) as grader:
        with held(grader.agent_port, per_client):
            answer = next_connection(grader.agent_port)
            assert_refused(answer, 503, too_many_connections(per_client, per_client=True))
            assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
            # Another address, and the controller (on its own port, or from its own address), are
            # served meanwhile.
            assert healthz(grader.agent_port, source="127.0.0.2").status_code == 200
            assert grader.admin_ok(source="127.0.0.1" if admin_port else "127.0.0.3")
        # The held connections closed, their slots are free again.
        wait_for(
            lambda: healthz(grader.agent_port).status_code == 200, "the address to be served again", 10, 0.1
        )


def test_a_full_agent_port_leaves_the_admin_port_to_the_controller(tmp_path: Path) -> None:
    per_port = 6
    limits = {"per_client": 4, "per_port": per_port}
    with (
        serving(tmp_path, limits, admin_port=True) as grader,
        held(grader.agent_port, 4),
        held(grader.agent_port, 2, source="127.0.0.2"),
    ):
        answer = next_connection(grader.agent_port, source="127.0.0.3")
        assert_refused(answer, 503, too_many_connections(per_port, per_client=False))
        assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
        assert grader.admin_ok()


@pytest.mark.parametrize("admin_port", [True, False], ids=["agent port", "single port"])
def test_an_address_opening_connections_too_fast_is_refused_on_the_agent_port(
    tmp_path: Path, admin_port: bool
) -> None:
    # Requests that cannot be parsed are answered before a fair share could charge them, and each
    # closes its connection: opened one after another, the agent port paces them by address, and
    # past the pace closes a new connection unanswered, as a full listen queue would.
    limits = {"new_burst": 4, "new_per_s": 1.0}
    with serving(tmp_path, limits, admin_port=admin_port) as grader:

        def unparsable(source: str = "127.0.0.1") -> int | None:
            with connect(grader.agent_port, source) as sock:
                try:
                    sock.sendall(b"NOT HTTP\r\n\r\n")
                    return read_to_close(sock).status
                except (ConnectionResetError, BrokenPipeError, IndexError):
                    return None  # closed unanswered

        answers = [unparsable() for _ in range(10)]
        if not admin_port:  # one machine: the relay and the run's own client share an address
            assert answers == [400] * 10
            return
        # Its burst of 4 (less what the start-up's probes took), then about one a second.
        assert answers[0] == 400 and answers.count(400) <= 5 and answers[-1] is None, answers
        assert unparsable("127.0.0.2") == 400  # another address keeps its own pace
        assert grader.admin_ok()


def test_an_address_at_its_cap_is_paced_too(tmp_path: Path) -> None:
    # Refused connections are answered, as requests are: past the pace, an address holding all its
    # connections finds new ones closed unanswered, as one under its cap does.
    limits = {"new_burst": 8, "new_per_s": 1.0, "paced_per_client": 4}
    with serving(tmp_path, limits, admin_port=True) as grader, held(grader.agent_port, 4):

        def status() -> int | None:
            with connect(grader.agent_port) as sock:
                try:
                    return read_to_close(sock).status
                except (ConnectionResetError, BrokenPipeError, IndexError):
                    return None  # closed unanswered

        answers = [status() for _ in range(20)]
        # What is left of its burst (less what the start-up's probes took) answered 503, then about
        # one a second: the rest closed unanswered.
        assert answers[0] == 503 and answers.count(503) <= 6 and answers[-1] is None, answers
        assert healthz(grader.agent_port, source="127.0.0.2").status_code == 200


def test_refused_connections_being_answered_are_capped_too(tmp_path: Path) -> None:
    # A refused connection is answered, then drained for a bounded time; a client that opens them
    # faster than they drain finds the next ones closed unanswered, as a full listen queue would.
    limits = {"per_client": 1, "refusals": 2}
    with serving(tmp_path, limits, admin_port=True) as grader, held(grader.agent_port, 1):
        refused = [connect(grader.agent_port) for _ in range(2)]  # answered 503, not read yet
        try:
            with connect(grader.agent_port) as sock, contextlib.suppress(ConnectionResetError):
                assert sock.recv(65536) == b""
            for sock in refused:
                assert read_to_close(sock).status == 503
        finally:
            for sock in refused:
                sock.close()
        # Those answered, refusals are answered again; other addresses were served throughout.
        assert healthz(grader.agent_port, source="127.0.0.2").status_code == 200
        wait_for(
            lambda: healthz(grader.agent_port).status_code == 503, "refusals to be answered again", 10, 0.1
        )


def test_the_commands_own_cap_per_address_on_one_machine(tmp_path: Path) -> None:
    # An agent using every connection its sandbox's relay allows leaves room for an admin client on
    # the same address (`autorl run`: relay and run both reach the grader from 127.0.0.1).
    with (
        serving(tmp_path, None, admin_port=False) as grader,
        held(grader.agent_port, MAX_AGENT_CONNECTIONS),
    ):
        assert grader.admin_ok()
        with held(grader.agent_port, MAX_CONNECTIONS_PER_CLIENT - MAX_AGENT_CONNECTIONS):
            answer = next_connection(grader.agent_port)
            assert_refused(answer, 503, too_many_connections(MAX_CONNECTIONS_PER_CLIENT, per_client=True))
            assert healthz(grader.agent_port, source="127.0.0.2").status_code == 200
            assert grader.admin_ok(source="127.0.0.3")


def test_on_a_clusters_agent_port_sixteen_addresses_are_needed_to_fill_it(tmp_path: Path) -> None:
    # Each agent pod has an address of its own: one experiment, or a few, holding idle connections
    # (reopened as the grader closes them) cannot refuse every other experiment's.
    cap = MAX_AGENT_PORT_CONNECTIONS_PER_CLIENT
    assert MAX_CONNECTIONS // cap >= 16
    with (
        serving(tmp_path, None, admin_port=True) as grader,
        contextlib.ExitStack() as stack,
    ):
        for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"):
            stack.enter_context(held(grader.agent_port, cap, source=source))
            answer = next_connection(grader.agent_port, source=source)
            assert_refused(answer, 503, too_many_connections(cap, per_client=True))
        assert healthz(grader.agent_port, source="127.0.0.5").status_code == 200
        assert grader.admin_ok()


def test_connections_holding_bodies_are_capped_and_released_at_the_deadline(tmp_path: Path) -> None:
    # Each connection declares a body of the largest size an agent's request takes and sends all of
    # it but one byte.
    per_client, connections, read_s = 8, 64, 4.0  # within the pace's burst of new connections
    limits = {"per_client": per_client, "read_s": read_s}
    body = b" " * (MAX_AGENT_BODY_BYTES - 1)
    with serving(tmp_path, limits, admin_port=True) as grader:
        for _ in range(3):  # warm the paths a request takes
            assert healthz(grader.agent_port).status_code == 200
        files_before = grader.open_files()
        socks = []
        try:
            for _ in range(connections):
                sock = connect(grader.agent_port, timeout=read_s + 10)
                socks.append(sock)
                with contextlib.suppress(OSError):  # a refused connection may be closed meanwhile
                    sock.sendall(SUBMIT_HEAD % MAX_AGENT_BODY_BYTES + body)
            answers = [read_to_close(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        statuses = sorted(answer.status for answer in answers)
        assert statuses == [408] * per_client + [503] * (connections - per_client)
        # After the deadline every connection is closed and the address is served again.
        wait_for(lambda: grader.open_files() <= files_before, "every connection to be closed", 10, 0.1)
        assert healthz(grader.agent_port).status_code == 200
        assert grader.admin_ok() and grader.process.poll() is None


def test_a_client_that_never_reads_its_answers_is_cut_off_after_the_write_deadline(tmp_path: Path) -> None:
    # The answers wait in the grader for the client to read them; the request deadline no longer
    # applies (the requests were received), and a close would wait for them too.
    per_client = 4
    limits = {"per_client": per_client, "write_s": WRITE_S, "read_s": 60.0}
    with serving(tmp_path, limits, admin_port=False) as grader:
        document = len(httpx.get(f"http://127.0.0.1:{grader.agent_port}/openapi.json").content)
        socks = [never_reading(grader.agent_port) for _ in range(per_client)]
        started = time.monotonic()
        try:
            # The address is at its cap while its answers wait ...
            answer = next_connection(grader.agent_port)
            assert_refused(answer, 503, too_many_connections(per_client, per_client=True))
            # ... and is served again once the deadline has aborted them.
            wait_for(
                lambda: healthz(grader.agent_port).status_code == 200,
                "the address to be served again",
                WRITE_S + 10,
                0.1,
            )
            freed = time.monotonic() - started
            # Each connection has its own deadline (a busy grader begins their answers apart): read
            # once the grader has closed them all, or one still open would send all it was asked for.
            wait_for(
                lambda: not any(grader_holds(sock) for sock in socks),
                "every connection to be closed",
                10,
                0.1,
            )
            # What was not sent by then was dropped: far less than the 8 answers asked for arrives.
            assert all(received(sock) < 4 * document for sock in socks)
        finally:
            for sock in socks:
                sock.close()
        assert WRITE_S - 0.5 < freed < WRITE_S + 5
        assert grader.admin_ok() and grader.process.poll() is None


def test_answers_never_read_cost_memory_only_until_the_write_deadline(tmp_path: Path) -> None:
    # Three addresses, each with all the connections the command's cap per address allows, each
    # asking for 8 copies of the document and reading none.
    write_s = 5.0
    with serving(tmp_path, {"write_s": write_s, "read_s": 60.0}, admin_port=False) as grader:
        for _ in range(3):  # warm the paths a request takes
            assert httpx.get(f"http://127.0.0.1:{grader.agent_port}/openapi.json").status_code == 200
        rss_before, files_before = grader.rss(), grader.open_files()
        socks = []
        try:
            for number in range(3 * MAX_CONNECTIONS_PER_CLIENT):
                socks.append(never_reading(grader.agent_port, source=f"127.0.0.{1 + number % 3}"))
            # Held while unread (measured: 46 MiB, one answer and the next one's start on each) ...
            wait_for(
                lambda: grader.rss() - rss_before > 25 * MIB, "the unread answers to be held", write_s, 0.1
            )
            # ... until the deadline: every connection is closed, and the memory handed back.
            wait_for(
                lambda: grader.open_files() <= files_before,
                "every connection to be closed",
                write_s + 10,
                0.1,
            )
            wait_for(lambda: grader.rss() - rss_before < 10 * MIB, "the memory to be handed back", 5, 0.1)
        finally:
            for sock in socks:
                sock.close()
        assert healthz(grader.agent_port).status_code == 200
        assert grader.process.poll() is None
