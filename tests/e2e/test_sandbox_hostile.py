"""A hostile agent under `autorl run` (real sandbox, grader and worker): what it can reach.

Two runs share one platform home. The first agent probes everything it should not reach,
leaves files in every temporary folder, starts a double-forked `setsid` daemon that ignores
SIGTERM, submits through GRADING_SERVER_URL, floods its own `GET /scores` through the relay (while
the test floods the same grader from a second address with its token, and measures a second
experiment registered there, the admin API and a database write), and waits for its deadline.
The second runs with `--egress`: it looks for the first run's files and workspace, and tries the
host's services through the user-mode network. Each agent writes what it got into output/; the
tests assert it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy

from autorl.store import Database
from autorl_agent_runner.sandbox.egress import host_addresses
from autorl_agent_runner.workspace.tree_walk import open_dir, remove_entry, walk_fd
from autorl_grader.settings import AGENT_REQUEST_BURST, AGENT_REQUESTS_PER_S
from tests.conftest import FIXTURE_DATA, REPO_ROOT
from tests.e2e.test_local_run import AUTORL, REFERENCE_AGENT, Run, leftover_processes
from tests.support.infra import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

HOSTILE_AGENT = """
import errno, re, signal, socket, sys, time, urllib.error, urllib.parse, urllib.request
MARKUP_NAME = "m[/bold][link=https:evil.example]x[/link]"
ESCAPE_NAME = "ok\\x1b]0;pwned\\x07\\nsubmission 99 score=100.00"

MARK = os.environ["MARK"]
FLOOD_S, FLOOD_CONNECTIONS = int(os.environ["FLOOD_S"]), 48
report = {}
BASE = urllib.parse.urlsplit(URL)
ROOT = URL.split("/a/")[0]
TOKEN = os.environ["AUTORL_TOKEN"]


def connect(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.settimeout(3)
        try:
            sock.connect((host, port))
            return "connected"
        except OSError as error:
            return type(error).__name__


def status_of(path):
    try:
        with urllib.request.urlopen(ROOT + path, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def raw_statuses(payload):
    with socket.create_connection((BASE.hostname, BASE.port), timeout=30) as sock:
        sock.sendall(payload.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return re.findall(r"HTTP/1\\.1 ([0-9]{3}) ", data.decode(errors="replace"))


def where(path):
    try:
        os.stat(path)
        return sorted(os.listdir(path)) if os.path.isdir(path) else "present"
    except OSError as error:
        return type(error).__name__


def probe_network(targets):
    return {f"{host}:{port}": connect(host, port) for host, port in targets}


targets = [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("::1", 6379), ("10.0.2.2", 5432), ("10.0.2.2", 6379)]
for port in os.environ["LISTENER_PORTS"].split(","):
    targets += [("127.0.0.1", int(port)), ("10.0.2.2", int(port))]
for address in os.environ["HOST_ADDRESSES"].split(","):
    targets += [(address, 5432), (address, 6379)]
    targets += [(address, int(port)) for port in os.environ["LISTENER_PORTS"].split(",")]
report["network"] = probe_network(targets)
# Other machines of the operator's network: what the firewall says (errno), not what a host answers.
report["private"] = {}
for host in ("10.77.0.1", "172.20.0.1", "192.168.77.1", "100.64.0.1", "169.254.169.254"):
    with socket.socket() as sock:
        sock.settimeout(3)
        report["private"][host] = errno.errorcode.get(sock.connect_ex((host, 80)), "connected or timed out")
report["interfaces"] = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
report["routes"] = [line.split()[:3] for line in open("/proc/net/route").readlines()[1:]]
report["resolv_conf"] = where("/etc/resolv.conf") == "present" and open("/etc/resolv.conf").read()
report["time"] = status_of(f"/a/{TOKEN}/time")

home = os.environ["HOST_HOME"]
report["paths"] = {name: where(path) for name, path in {
    "home": home,
    "runs": os.path.join(home, "runs"),
    "results_csv": os.path.join(home, "results.csv"),
    "database": os.path.join(home, "autorl.db"),
    "cache": os.path.join(home, "cache"),
    "eval_storage": os.path.join(home, "eval"),
    "data_source": os.environ["DATA_SOURCE"],
    "test_split": os.path.join(os.environ["DATA_SOURCE"], "gsm8k", "test.jsonl"),
    "repo_tests_data": os.path.join(os.environ["REPO"], "tests", "data"),
    "repo_git": os.path.join(os.environ["REPO"], ".git"),
    "repo_pyproject": os.path.join(os.environ["REPO"], "pyproject.toml"),
    "root_home_autorl": "/root/.autorl",
    "first_workspace": os.environ.get("FIRST_WORKSPACE", "/nonexistent"),
}.items()}
report["tmp"] = {folder: sorted(os.listdir(folder)) for folder in ("/tmp", "/var/tmp", "/dev/shm")}

# Both runs submit the same new weights (the first weight's low byte changed the same way): the
# second run must get an evaluation of its own, not the first run's score at once.
shared = save("shared-bytes")
with open(os.path.join(OUT, "shared-bytes", "model.safetensors"), "r+b") as weights:
    start = 8 + int.from_bytes(weights.read(8), "little")
    weights.seek(start)
    low = weights.read(1)[0]
    weights.seek(start)
    weights.write(bytes([low ^ 0x55]))
report["shared_submit"] = call("/submit", {"model_path": shared})

if os.environ["PHASE"] == "first":
    # Oversized requests are answered with the reason, not a reset.
    oversized = {}
    for name, body, headers in (
        ("body", b'{"model_path": "' + b"x" * (5 * 1024 * 1024) + b'"}', {}),
        ("header", b'{"model_path": "output/x"}', {"X-Padding": "y" * (200 * 1024)}),
    ):
        request = urllib.request.Request(
            URL + "/submit", data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                oversized[name] = [response.status, json.loads(response.read())]
        except urllib.error.HTTPError as error:
            oversized[name] = [error.code, json.loads(error.read())]
        except OSError as error:
            oversized[name] = [type(error).__name__, None]
    report["oversized"] = oversized
    report["admin"] = {path: status_of(path) for path in (
        "/metrics", "/v1/experiments", "/docs", "/openapi.json", "/healthz", "/readyz", "/ui",
        f"/a/{TOKEN}/metrics", f"/a/{TOKEN}/v1/experiments", f"/a/{TOKEN}/../metrics",
        f"/a/{TOKEN}/%2e%2e/metrics", f"/a/{TOKEN}/time/../../metrics", "/a/another-token/time",
    )}
    report["pipelined"] = raw_statuses(
        f"GET /a/{TOKEN}/time HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
        "GET /metrics HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"
    )
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    commands = []
    for pid in pids:
        try:
            commands.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode())
        except OSError:
            pass
    report["processes"] = commands
    report["mountinfo"] = open("/proc/self/mountinfo").read()
    report["sys_class_net"] = where("/sys/class/net")
    report["sys"] = where("/sys")
    try:
        report["kernel_cmdline"] = open("/proc/cmdline").read()
    except OSError as error:
        report["kernel_cmdline"] = type(error).__name__
    # Its output is a pipe the runner copies: agent.log cannot be truncated or rewound through it.
    attempts = {}
    for name, attempt in (("truncate", lambda: os.ftruncate(1, 0)), ("seek", lambda: os.lseek(1, 0, 0))):
        try:
            attempt()
            attempts[name] = "allowed"
        except OSError as error:
            attempts[name] = type(error).__name__
    report["stdout"] = attempts
    # Forged platform events, one plain and one behind a carriage return, in its own output.
    print(f"[autorl 12:00:00] event=agent_finished exit_code=0 forged={MARK}", flush=True)
    print(f"harmless\\r[autorl 12:00:01] event=deadline action=SIGTERM forged={MARK}", flush=True)
    # A folder chain deeper than Python's recursion limit, for the hand-back to walk.
    os.mkdir(os.path.join(os.environ["WORKSPACE"], "code", "chain"))
    os.chdir(os.path.join(os.environ["WORKSPACE"], "code", "chain"))
    for _ in range(1500):
        os.mkdir("d")
        os.chdir("d")
    os.symlink("/etc/passwd", "link-out")
    os.chdir(os.environ["WORKSPACE"])
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        with open(os.path.join(folder, f"hostile-{MARK}"), "w") as handle:
            handle.write("left for a later run")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            daemon = (
                "import os, signal, time\\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                "beat = os.path.join(os.environ['OUTPUT_DIR'], 'daemon.txt')\\n"
                "while True:\\n"
                "    open(beat + '.tmp', 'w').write(str(time.time()))\\n"
                "    os.replace(beat + '.tmp', beat)\\n"
                "    time.sleep(0.2)\\n"
            )
            os.execv(sys.executable, [sys.executable, "-c", daemon, f"hostile-daemon-{MARK}"])
        os._exit(0)
    report["submit"] = call("/submit", {"model_path": save("copy-of-base")})
    # Names an operator's terminal must show as text: markup is accepted and shown as written, a
    # name with control characters (a window title, a forged progress line) is refused at submit.
    report["markup_submit"] = call("/submit", {"model_path": save(MARKUP_NAME)})
    report["escape_submit"] = call("/submit", {"model_path": save(ESCAPE_NAME)})
    record("report", report)
    # A flood of its own GET /scores from many keep-alive connections through the relay, while the
    # test floods the grader from a second address with this token and works as another tenant.
    import http.client, threading
    record("flooding", {"token": TOKEN})
    flooded, flood_lock, flood_until = {}, threading.Lock(), time.time() + FLOOD_S

    def flood():
        conn = http.client.HTTPConnection(BASE.hostname, BASE.port, timeout=30)
        while time.time() < flood_until:
            try:
                conn.request("GET", BASE.path + "/scores")
                response = conn.getresponse()
                response.read()
                outcome = str(response.status)
            except (OSError, http.client.HTTPException) as error:
                outcome = type(error).__name__
                conn.close()
                conn = http.client.HTTPConnection(BASE.hostname, BASE.port, timeout=30)
            with flood_lock:
                flooded[outcome] = flooded.get(outcome, 0) + 1

    flooders = [threading.Thread(target=flood) for _ in range(FLOOD_CONNECTIONS)]
    for thread in flooders:
        thread.start()
    for thread in flooders:
        thread.join()
    record("flood", flooded)
    # Until the deadline: a folder in place of run_meta.json, a FIFO in place of scores.json.
    while True:
        for name, plant in (("run_meta.json", os.mkdir), ("scores.json", os.mkfifo)):
            path = os.path.join(os.environ["WORKSPACE"], name)
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                plant(path)
                if name == "run_meta.json":
                    os.symlink("/etc/passwd", os.path.join(path, "link-out"))
        time.sleep(0.2)
record("report", report)
"""


@dataclass
class Listener:
    """A TCP listener of the test's own; it must never see a connection from an agent."""

    sock: socket.socket

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def connections(self) -> int:
        self.sock.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@dataclass
class HostileRuns:
    first: Run
    second: Run
    first_report: dict[str, Any]
    second_report: dict[str, Any]
    first_workspace: Path
    second_workspace: Path
    mark: str
    listeners: list[Listener]
    host_addresses: list[str]
    first_finished: float
    #: What the test measured as another tenant of the first run's grader during its agent's flood.
    beside: BesideTheFlood


def _listener(address: str) -> Listener:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.listen(16)
    return Listener(sock)


@dataclass
class BesideTheFlood:
    """Seconds each call took at most while the agent flooded, and the second address's statuses."""

    slowest_s: dict[str, float]
    second_address: Counter[str]


#: The most another tenant's request, the admin API or a database write may take during the flood.
SERVED_WITHIN_S = 2.0
#: How long the agent floods.
AGENT_FLOOD_S = 8


def _grader_admin_token(port: int) -> str:
    """The admin token `autorl run` gave its grader (the operator's own, read from the process)."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"grader" in command and str(port).encode() in command:
            for variable in environ:
                if variable.startswith(b"AUTORL_ADMIN_TOKEN="):
                    return variable.split(b"=", 1)[1].decode()
    raise AssertionError(f"no grader on port {port}")


def _beside_the_flood(home: Path, port: int, base_model: Path, workspace: Path) -> BesideTheFlood:
    """Once the agent floods: a second experiment registered on the same grader through the admin API,
    a flood from 127.0.0.2 with the agent's token, and the other experiment's agent API, the admin
    API and a write to the grader's database timed, one call at a time."""
    flags = "runs/*/workspace/output/flooding.json"
    wait_for(lambda: any(home.glob(flags)), "the agent to flood", 300)
    flag = next(home.glob(flags))
    token = json.loads(flag.read_text())["token"]
    url = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {_grader_admin_token(port)}"}
    body = {
        "name": f"beside-{uuid.uuid4().hex[:8]}",
        "task": "arith",
        "model": "builtin:tiny-qwen2",
        "timeout_s": 600,
        "workspace": str(workspace),
        "base_model_dir": str(base_model),
    }
    with httpx.Client(base_url=url, timeout=30) as client:
        other = client.post("/v1/experiments", json=body, headers=admin).json()
        client.post(f"/v1/experiments/{other['name']}/start", json={}, headers=admin).raise_for_status()
    stop, second_address = threading.Event(), Counter[str]()

    def flood() -> None:
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=transport, timeout=30) as client:
            while not stop.is_set():
                try:
                    second_address[str(client.get(f"{url}/a/{token}/scores").status_code)] += 1
                except httpx.HTTPError as error:
                    second_address[type(error).__name__] += 1

    floods = [threading.Thread(target=flood) for _ in range(16)]
    for thread in floods:
        thread.start()
    db = Database(f"sqlite:///{home / 'autorl.db'}")
    calls: dict[str, Callable[[], object]] = {
        "other experiment": lambda: httpx.get(
            f"{other['grading_server_url']}/scores", timeout=30
        ).raise_for_status(),
        "admin API": lambda: httpx.get(f"{url}/v1/experiments", headers=admin, timeout=30).raise_for_status(),
        "database write": lambda: _write(db, other["name"]),
    }
    slowest = dict.fromkeys(calls, 0.0)
    try:
        for _ in range(6):
            for name, call in calls.items():
                started = time.monotonic()
                call()
                slowest[name] = max(slowest[name], time.monotonic() - started)
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in floods:
            thread.join()
        db.dispose()
    return BesideTheFlood(slowest, second_address)


def _write(db: Database, name: str) -> None:
    with db.session() as session:
        session.execute(
            sqlalchemy.text("UPDATE experiments SET agent = agent WHERE name = :name"), {"name": name}
        )


def _run(
    home: Path,
    agent: Path,
    env: dict[str, str],
    *flags: str,
    beside: Callable[[Path, int], BesideTheFlood] | None = None,
) -> tuple[Run, BesideTheFlood | None]:
    environment = {
        **os.environ,
        "AUTORL_HOME": str(home),
        "AUTORL_DATA_SOURCE_DIR": str(FIXTURE_DATA),
        "AUTORL_EVAL_LIMIT": "4",
        "AUTORL_EVAL_MAX_NEW_TOKENS": "8",
        "AUTORL_EVAL_DEVICE": "cpu",
    }
    passed = [part for name, value in env.items() for part in ("--env", f"{name}={value}")]
    port = free_port()
    base = ["-a", str(agent), "-t", "arith", "-m", "builtin:tiny-qwen2", "--port", str(port)]
    started = time.monotonic()
    with subprocess.Popen(
        [AUTORL, "run", *base, *passed, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    ) as process:
        measured = beside(home, port) if beside is not None else None
        stdout, stderr = process.communicate(timeout=600)
    return Run(process.returncode, stdout, stderr, home, time.monotonic() - started), measured


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileRuns]:
    root = tmp_path_factory.mktemp("hostile")
    root.chmod(0o755)
    agent = root / "agent.py"
    agent.write_text("#!/usr/bin/env python3\n" + REFERENCE_AGENT + textwrap.dedent(HOSTILE_AGENT))
    agent.chmod(0o755)
    home = root / "home"
    mark = uuid.uuid4().hex[:12]
    listeners = [_listener("127.0.0.1"), _listener("0.0.0.0")]
    addresses = [a for a in host_addresses() if not a.startswith(("127.", "fe80:")) and a != "::1"]
    env = {
        "MARK": mark,
        "HOST_HOME": str(home),
        "DATA_SOURCE": str(FIXTURE_DATA),
        "REPO": str(REPO_ROOT),
        "LISTENER_PORTS": ",".join(str(listener.port) for listener in listeners),
        "HOST_ADDRESSES": ",".join(addresses),
        "FLOOD_S": str(AGENT_FLOOD_S),
    }
    from autorl.models.sources import resolve_model
    from autorl.settings import HomeSettings

    base_model = resolve_model("builtin:tiny-qwen2", HomeSettings().models_dir)
    other_workspace = root / "beside"
    (other_workspace / "output").mkdir(parents=True)
    first, beside = _run(
        home,
        agent,
        {**env, "PHASE": "first"},
        "--timeout",
        "45",
        "--grace-period",
        "2",
        beside=lambda home, port: _beside_the_flood(home, port, base_model, other_workspace),
    )
    assert beside is not None
    first_finished = time.time()
    assert first.code == 0, first.stderr
    first_workspace = first.workspace()
    first_report = json.loads((first_workspace / "output" / "report.json").read_text())
    second, _ = _run(
        home,
        agent,
        {**env, "PHASE": "second", "FIRST_WORKSPACE": str(first_workspace)},
        "--timeout",
        "60",
        "--egress",
    )
    assert second.code == 0, second.stderr
    second_workspace = second.workspace()
    second_report = json.loads((second_workspace / "output" / "report.json").read_text())
    yield HostileRuns(
        first,
        second,
        first_report,
        second_report,
        first_workspace,
        second_workspace,
        mark,
        listeners,
        addresses,
        first_finished,
        beside,
    )
    for listener in listeners:
        listener.sock.close()
    # pytest's own clean-up of old runs recurses, once per level.
    remove_entry(first_workspace / "code", "chain")


def test_a_flood_leaves_another_experiment_the_admin_api_and_the_database_their_service(
    hostile: HostileRuns,
) -> None:
    """The agent floods its own large answers through the relay and the test floods from a second
    address with its token: the other experiment's agent API, the admin API and a database write each
    answer within 2 s, and the flood is answered 429 past its experiment's fair share."""
    slowest = hostile.beside.slowest_s
    assert all(took < SERVED_WITHIN_S for took in slowest.values()), slowest
    through_relay = json.loads((hostile.first_workspace / "output" / "flood.json").read_text())
    floods = (through_relay, hostile.beside.second_address)
    assert all(flood.get("429", 0) > flood.get("200", 0) > 0 for flood in floods), floods
    # Both floods are the one experiment's: together served no more than its share over the flood.
    served = sum(flood.get("200", 0) for flood in floods)
    assert served <= AGENT_REQUEST_BURST + AGENT_REQUESTS_PER_S * (AGENT_FLOOD_S + 2), floods


def test_submitting_through_the_forwarded_endpoint_is_scored(hostile: HostileRuns) -> None:
    status, answer = hostile.first_report["submit"]
    assert status == 200 and answer["status"] == "scored" and answer["score"] is not None
    assert hostile.first_report["time"] == 200 and hostile.second_report["time"] == 200
    rows = hostile.first.results()
    # and the markup-named copy, and the shared bytes
    assert rows[0]["submissions"] == 3 and rows[0]["status"] == "completed"


def test_another_runs_checkpoint_is_evaluated_again_not_answered_from_its_score(hostile: HostileRuns) -> None:
    """Score reuse is no membership test: the same bytes another experiment had scored are
    evaluated again, and the answer names nothing of the other run."""
    first_status, first = hostile.first_report["shared_submit"]
    second_status, second = hostile.second_report["shared_submit"]
    assert first_status == 200 and first["status"] == "scored" and first["reused_from"] is None
    assert second_status == 200 and second["status"] == "scored", second
    assert second["reused_from"] is None and second["eval_seconds"] > 0
    assert second["score"] == first["score"]  # the same weights, evaluated again


def test_oversized_requests_through_the_forwarded_endpoint_are_answered_with_the_reason(
    hostile: HostileRuns,
) -> None:
    oversized = hostile.first_report["oversized"]
    for name, status in (("body", 413), ("header", 431)):
        got, answer = oversized[name]
        assert got == status, oversized
        assert answer["detail"] == answer["error"] and "limit" in answer["detail"]


def test_checkpoint_names_reach_the_operator_as_text(hostile: HostileRuns) -> None:
    status, accepted = hostile.first_report["markup_submit"]
    assert status == 200 and accepted["status"] == "scored"
    status, refused = hostile.first_report["escape_submit"]
    assert status == 400 and refused["detail"] == refused["error"]
    assert "do not print (\\x1b, \\x07, \\n)" in refused["detail"]
    progress, everything = hostile.first.stderr, hostile.first.stdout + hostile.first.stderr
    # The markup is shown as written (no MarkupError ended the progress thread): its line, then
    # the run's later lines; no raw escape and no forged line anywhere in what `autorl run` printed.
    shown = f"submission {accepted['submission_id']} output/m[/bold][link=https:evil.example]x[/link] status="
    assert shown in progress and "agent reached its deadline" in progress.split(shown, 1)[1]
    assert "\x1b" not in everything and "\x07" not in everything
    assert not [line for line in everything.splitlines() if "submission 99" in line]


def test_no_local_service_is_reachable(hostile: HostileRuns) -> None:
    for report in (hostile.first_report, hostile.second_report):
        reached = {target: result for target, result in report["network"].items() if result == "connected"}
        assert not reached, reached
    assert all(listener.connections() == 0 for listener in hostile.listeners)
    # Without --egress the agent's network is its own loopback, nothing else.
    assert hostile.first_report["interfaces"] == ["lo"] and hostile.first_report["routes"] == []


def test_admin_api_and_metrics_are_not_forwarded(hostile: HostileRuns) -> None:
    admin = hostile.first_report["admin"]
    assert admin.pop("/a/another-token/time") == 401
    assert set(admin.values()) <= {400, 404}, admin
    # A second request pipelined on an allowed connection is checked like the first.
    assert hostile.first_report["pipelined"] == ["200", "404"]


def test_the_agent_sees_only_its_own_processes(hostile: HostileRuns) -> None:
    commands = hostile.first_report["processes"]
    assert 0 < len(commands) < 10, commands
    for platform in ("autorl grader", "autorl worker", "autorl run", "postgres", "redis-server", "-m pytest"):
        assert not any(platform in command for command in commands), commands


def test_platform_data_and_other_runs_are_absent(hostile: HostileRuns) -> None:
    for report, workspace in (
        (hostile.first_report, hostile.first_workspace),
        (hostile.second_report, hostile.second_workspace),
    ):
        paths = report["paths"]
        # The own workspace's parents exist as bare folders: nothing else of the home is there.
        assert paths["home"] == ["runs"]
        assert paths["runs"] == [workspace.parent.name]
        for name in (
            "results_csv",
            "database",
            "cache",
            "eval_storage",
            "data_source",
            "test_split",
            "repo_tests_data",
            "repo_git",
            "repo_pyproject",
            "root_home_autorl",
            "first_workspace",
        ):
            assert paths[name] == "FileNotFoundError", (name, paths[name])


def test_temporary_files_are_private_and_gone(hostile: HostileRuns) -> None:
    leftover = f"hostile-{hostile.mark}"
    # Nothing of the host's temporary folders is visible, and nothing of the first run is left.
    assert all(
        not any(n.startswith("hostile-") for n in listing) for listing in hostile.first_report["tmp"].values()
    )
    assert all(leftover not in listing for listing in hostile.second_report["tmp"].values())
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not (Path(folder) / leftover).exists()


def test_a_setsid_daemon_is_gone_after_the_deadline(hostile: HostileRuns) -> None:
    wanted = f"hostile-daemon-{hostile.mark}".encode()
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                alive.append(int(entry.name))
        except OSError:
            continue
    assert not alive
    heartbeat = float((hostile.first_workspace / "output" / "daemon.txt").read_text())
    assert heartbeat <= hostile.first_finished
    log = hostile.first.runner_log(0)
    # The agent ended on SIGTERM; its PID namespace ended with it, the daemon (ignoring SIGTERM) too.
    assert "event=deadline action=SIGTERM" in log
    assert not leftover_processes(hostile.first.home)


def test_egress_has_a_network_without_the_host(hostile: HostileRuns) -> None:
    report = hostile.second_report
    assert report["interfaces"] == ["lo", "tap0"]
    assert ["tap0", "00000000", "0202000A"] in report["routes"]  # default route via 10.0.2.2
    assert report["resolv_conf"] == "nameserver 10.0.2.3\n"
    probed = set(report["network"])
    assert {"10.0.2.2:5432", "127.0.0.1:5432"} <= probed
    assert all(f"{address}:5432" in probed for address in hostile.host_addresses)
    # Refused by the agent's firewall at once (no route to host), before any packet leaves: not a
    # reset from the user-mode stack, which would mean the connection was tried from this machine.
    assert set(report["private"].values()) == {"EHOSTUNREACH"}, report["private"]


def test_what_the_agent_left_never_breaks_the_hand_back(hostile: HostileRuns) -> None:
    """Mirrors replaced by a folder (holding a link out) and a FIFO until the deadline, a chain of
    1,500 folders: the run is recorded completed with its score, everything is given back."""
    (row,) = [r for r in hostile.first.results() if r["workspace"] == str(hostile.first_workspace)]
    _, answer = hostile.first_report["submit"]
    assert row["status"] == "completed" and row["best_score"] == answer["score"]
    workspace = hostile.first_workspace
    for mirror in ("run_meta.json", "scores.json"):
        assert stat.S_ISREG((workspace / mirror).lstat().st_mode), mirror
    scores = json.loads((workspace / "scores.json").read_text())
    assert scores[0]["score"] == answer["score"]
    assert json.loads((workspace / "run_meta.json").read_text())["end_time"] is not None
    foreign: list[str] = []

    def owned_by_the_platform(dir_fd: int, name: str, info: os.stat_result) -> None:
        if info.st_uid != os.geteuid():
            foreign.append(name)

    fd = open_dir(workspace)
    try:
        walk_fd(fd, owned_by_the_platform)
    finally:
        os.close(fd)
    assert workspace.stat().st_uid == os.geteuid() and not foreign, foreign[:10]


def test_agent_output_cannot_touch_or_forge_the_platforms_log(hostile: HostileRuns) -> None:
    assert hostile.first_report["stdout"] == {"truncate": "OSError", "seek": "OSError"}
    agent_log = (hostile.first_workspace / "agent.log").read_text()
    assert f"forged={hostile.mark}" in agent_log  # the agent's own output, where it belongs
    runner_log = hostile.first.runner_log(0)
    assert "event=agent_start" in runner_log and "sandbox=user" in runner_log
    assert hostile.mark not in runner_log and "event=agent_start" not in agent_log
    assert all(line.startswith("[autorl ") for line in runner_log.splitlines())


def test_the_view_names_nothing_of_the_host(hostile: HostileRuns) -> None:
    report = hostile.first_report
    assert report["sys_class_net"] == "FileNotFoundError" and report["sys"] == ["devices"]
    assert report["kernel_cmdline"] in ("", "PermissionError")  # the host's boot command line
    # The sandbox's launcher shows no option, no staging folder, no bind source.
    launchers = [command.split(" -- ")[0] for command in report["processes"] if command.startswith("bwrap")]
    assert launchers and all("--bind" not in launcher and "/" not in launcher for launcher in launchers)
    for text in (*report["processes"], report["mountinfo"]):
        assert "autorl-sandbox-" not in text and str(REPO_ROOT / "tests") not in text
    for line in report["mountinfo"].splitlines():
        root, mount_point = line.split()[3:5]
        # A folder of a file system is named by its own path in the view (sysfs' /devices/system/cpu
        # at /sys/devices/system/cpu), or is a file of the view's own (bubblewrap's, /usr's).
        named = root == "/" or mount_point.endswith(root)
        assert named or root.startswith(("/bindfile", "/newroot", "/null", "/usr/")), line
