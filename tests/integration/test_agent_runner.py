"""The agent runner with real processes: the deadline ends every agent process (those that left
its process group too), the environment holds only the contract, and the sandbox isolates.

No grader runs here: a runner whose grader is unreachable uses its own ``timeout_s`` budget,
which is the standalone mode these tests exercise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autorl.agent_env import CONTRACT_VARIABLES
from autorl.client import GradingClient
from autorl.tasks import get_task
from autorl_agent_runner import runner as runner_module
from autorl_agent_runner.agent_command import resolve_agent
from autorl_agent_runner.runner import AgentOutcome, AgentRunner, RunnerConfig
from autorl_agent_runner.sandbox.agent_user import uid_processes
from autorl_agent_runner.sandbox.environment import ContractValues, parse_env_items
from autorl_agent_runner.sandbox.plan import SandboxMode
from autorl_agent_runner.workspace.layout import Workspace
from tests.support.workspaces import arith_workspace

UNREACHABLE = "http://127.0.0.1:9/a/token-of-nothing"
NEEDS_ROOT = pytest.mark.requires(os.geteuid() == 0, reason="the user sandbox needs root")
NEEDS_BWRAP = pytest.mark.requires(shutil.which("bwrap") is not None, reason="needs bubblewrap (make setup)")
#: Every sandbox mode, each skipped (or failed under CI) with its reason where it cannot run here.
MODES = [
    SandboxMode.NONE,
    pytest.param(SandboxMode.USER, marks=[NEEDS_ROOT, NEEDS_BWRAP]),
    pytest.param(SandboxMode.BWRAP, marks=NEEDS_BWRAP),
]


@pytest.fixture
def workspace(tmp_path: Path, tiny_base_model: Path) -> Workspace:
    train = get_task("arith").download_train_data(tmp_path / "cache" / "data").parent
    workspace = tmp_path / "home" / "runs" / "r" / "workspace"
    return arith_workspace(workspace, tiny_base_model, train, run_id="r", timeout_s=3)


#: A `sleep` duration no other process uses, so the escaped child can be found on the host
#: whatever PID namespace it was started in.
def escaped_sleep() -> str:
    """A `sleep` argument of this test's own: tests running side by side must not see each other's."""
    return f"313.{secrets.randbelow(10**6):06d}"


def escaped_children(seconds: str) -> list[int]:
    """Live (non-zombie) host processes running ``sleep seconds``."""
    wanted = f"sleep\0{seconds}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            running = entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted
            if running and not is_zombie(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def agent_script(tmp_path: Path, body: str, shebang: str = "#!/usr/bin/env python3") -> str:
    path = tmp_path / "agents" / "agent"
    path.parent.mkdir(exist_ok=True)
    path.write_text(shebang + "\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def runner_log(workspace: Workspace) -> str:
    """The runner's own events, beside the workspace (where ``run`` puts them)."""
    return (workspace.root.parent / "logs" / "runner.log").read_text()


def run(
    workspace: Workspace,
    agent: str,
    *,
    sandbox: SandboxMode,
    timeout_s: float = 3.0,
    env: list[str] | None = None,
    hidden: list[Path] | None = None,
) -> AgentOutcome:
    contract = ContractValues(
        grading_server_url=UNREACHABLE,
        token="token-of-nothing",
        task="arith",
        base_model="builtin:tiny-qwen2",
        model_path=workspace.model,
        data_path=workspace.data,
        output_dir=workspace.output,
        workspace=workspace.root,
    )
    config = RunnerConfig(
        workspace=workspace,
        contract=contract,
        agent=resolve_agent(agent),
        passed_env=parse_env_items(env or [], os.environ),
        sandbox=sandbox,
        hidden=hidden or [],
        grace_period_s=1.0,
        mirror_interval_s=60.0,
        timeout_s=timeout_s,
        runner_log=workspace.root.parent / "logs" / "runner.log",
    )
    with GradingClient(UNREACHABLE, timeout_s=1.0) as client:
        return AgentRunner(config, client).run()


@pytest.mark.parametrize("sandbox", MODES)
def test_agent_ignoring_sigterm_is_killed_with_its_escaped_children(
    tmp_path: Path, workspace: Workspace, sandbox: SandboxMode
) -> None:
    seconds = escaped_sleep()
    agent = agent_script(
        tmp_path,
        f"""
        import os, signal, subprocess, time
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
        # A grandchild in a session of its own: outside the agent's process group.
        subprocess.Popen(["setsid", "sleep", "{seconds}"])
        open(os.path.join(os.environ["OUTPUT_DIR"], "started"), "w")
        while True:
            time.sleep(0.1)
        """,
    )
    started = time.monotonic()
    outcome = run(workspace, agent, sandbox=sandbox, timeout_s=3.0)
    elapsed = time.monotonic() - started
    assert outcome.timed_out and outcome.killed
    assert elapsed < 3.0 + 1.0 + 5.0  # budget + grace + margin
    assert (workspace.output / "started").exists() and not escaped_children(seconds)
    assert "ignoring SIGTERM" in workspace.agent_log.read_text()
    assert "event=agent_kill signal=SIGKILL" in runner_log(workspace)
    meta = json.loads((workspace.root / "run_meta.json").read_text())
    assert meta["deadline"] - meta["start_time"] == pytest.approx(3.0, abs=0.5)
    assert meta["timeout_s"] == 3 and isinstance(meta["timeout_s"], int)  # whole seconds, as /time's
    # end_time is when the run actually ended: after the deadline, by the grace period's SIGKILL.
    assert meta["deadline"] < meta["end_time"] == pytest.approx(outcome.finished_at, abs=0.01)


@pytest.mark.parametrize("sandbox", MODES)
def test_parent_secret_reaches_the_agent_only_through_env(
    tmp_path: Path, workspace: Workspace, sandbox: SandboxMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARENT_SECRET", "hunter2")
    monkeypatch.setenv("LLM_API_KEY", "sk-passed")
    # /proc/self/environ is the environment exactly as exec'd (before Python adjusts its locale).
    agent = agent_script(
        tmp_path,
        """
        import os
        raw = open("/proc/self/environ", "rb").read()
        open(os.path.join(os.environ["OUTPUT_DIR"], "env.txt"), "wb").write(raw)
        """,
    )
    outcome = run(workspace, agent, sandbox=sandbox, env=["LLM_API_KEY", "MODE=fast"])
    assert outcome.exit_code == 0 and not outcome.timed_out, workspace.agent_log.read_text()
    raw = (workspace.output / "env.txt").read_text()
    seen = dict(item.split("=", 1) for item in raw.split("\0") if item)
    assert "PARENT_SECRET" not in seen and "hunter2" not in raw
    assert seen["LLM_API_KEY"] == "sk-passed" and seen["MODE"] == "fast"
    assert set(seen) == {
        *CONTRACT_VARIABLES,
        "HOME",
        "PATH",
        "HF_HUB_OFFLINE",
        "AUTORL_RUN_MARKER",
        "LLM_API_KEY",
        "MODE",
    }
    assert seen["HOME"] == seen["WORKSPACE"] == str(workspace.root)


def test_agent_leftovers_end_when_the_agent_exits(tmp_path: Path, workspace: Workspace) -> None:
    seconds = escaped_sleep()
    agent = agent_script(
        tmp_path,
        f"""
        import os, subprocess
        subprocess.Popen(["setsid", "sleep", "{seconds}"])
        open(os.path.join(os.environ["OUTPUT_DIR"], "started"), "w")
        """,
    )
    outcome = run(workspace, agent, sandbox=SandboxMode.NONE, timeout_s=30.0)
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert (workspace.output / "started").exists() and not escaped_children(seconds)


def test_ctrl_c_while_the_agent_starts_ends_the_agent(
    tmp_path: Path, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C can land after the agent's process exists and before the runner has taken stock of
    it: the agent (and what it started in its group) still ends, and the interrupt goes on."""
    seconds = escaped_sleep()
    agent = agent_script(
        tmp_path,
        f"""
        import os, subprocess, time
        subprocess.Popen(["sleep", "{seconds}"])
        open(os.path.join(os.environ["OUTPUT_DIR"], "started"), "w")
        time.sleep(300)
        """,
    )

    def interrupted_at_stock_taking(*args: object, **kwargs: object) -> object:
        deadline = time.monotonic() + 60
        while not (workspace.output / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_module, "AgentProcesses", interrupted_at_stock_taking)
    with pytest.raises(KeyboardInterrupt):
        run(workspace, agent, sandbox=SandboxMode.NONE, timeout_s=60.0)
    assert (workspace.output / "started").exists()
    assert not escaped_children(seconds)
    assert "event=interrupted action=SIGTERM" in runner_log(workspace)


@NEEDS_ROOT
@NEEDS_BWRAP
def test_user_sandbox_isolates_the_agent(tmp_path: Path, workspace: Workspace) -> None:
    home = tmp_path / "home"
    (home / "autorl.db").write_text("the platform database")
    agent = agent_script(
        tmp_path,
        """
        import json, os
        report = {"uid": os.getuid()}
        def attempt(name, action):
            try:
                action()
                report[name] = "allowed"
            except OSError as exc:
                report[name] = type(exc).__name__
        home = os.environ["WORKSPACE"].split("/runs/")[0]
        attempt("read_platform_db", lambda: open(os.path.join(home, "autorl.db")).read())
        attempt("write_base_model", lambda: open(os.path.join(os.environ["MODEL_PATH"], "config.json"), "a"))
        attempt("write_data", lambda: open(os.path.join(os.environ["DATA_PATH"], "x.jsonl"), "w"))
        attempt("signal_runner", lambda: os.kill(int(os.environ.get("RUNNER_PID", "1")), 0))
        attempt("write_output", lambda: open(os.path.join(os.environ["OUTPUT_DIR"], "ok"), "w").write("ok"))
        import torch, transformers, autorl.client  # the platform's Python works inside
        json.dump(report, open(os.path.join(os.environ["OUTPUT_DIR"], "report.json"), "w"))
        """,
    )
    outcome = run(
        workspace,
        agent,
        sandbox=SandboxMode.USER,
        timeout_s=60.0,
        hidden=[home],
        env=[f"RUNNER_PID={os.getpid()}"],
    )
    assert outcome.exit_code == 0, workspace.agent_log.read_text()
    report = json.loads((workspace.output / "report.json").read_text())
    assert report["uid"] != 0
    assert report["read_platform_db"] in ("FileNotFoundError", "PermissionError")
    assert report["write_base_model"] in ("OSError", "PermissionError")
    assert report["write_data"] in ("OSError", "PermissionError")
    # Another user id, and (in its own PID namespace) the runner's pid is not even there.
    assert report["signal_runner"] in ("PermissionError", "ProcessLookupError")
    assert report["write_output"] == "allowed"
    # Everything the agent wrote is handed back, so its uid owns nothing once the run is over.
    assert (workspace.output / "report.json").stat().st_uid == os.geteuid()
    # Dead processes not yet reaped by the host's init (zombies) are not running.
    assert not [pid for pid in uid_processes(report["uid"]) if not is_zombie(pid)]


def run_pod_runner(
    tmp_path: Path,
    base_model: Path,
    agent: str,
    workspace: Path,
    *,
    home: Path,
    sandbox: str,
    timeout_s: int = 2,
) -> subprocess.CompletedProcess[str]:
    """`autorl agent-runner` configured from variables alone, as a pod runs it."""
    train = get_task("arith").download_train_data(tmp_path / "data").parent
    env = {
        "PATH": os.environ["PATH"],
        "AUTORL_HOME": str(home),
        "AUTORL_AGENT": agent,
        "AUTORL_SANDBOX": sandbox,
        "AUTORL_BASE_MODEL_DIR": str(base_model),
        "AUTORL_TRAIN_DATA_DIR": str(train),
        "WORKSPACE": str(workspace),
        "TASK": "arith",
        "BASE_MODEL": "builtin:tiny-qwen2",
        "GRADING_SERVER_URL": UNREACHABLE,
    }
    autorl = str(Path(sys.executable).parent / "autorl")
    return subprocess.run(
        [autorl, "agent-runner", "--timeout", str(timeout_s), "--grace-period", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_agent_runner_command_runs_from_environment_alone(tmp_path: Path, tiny_base_model: Path) -> None:
    """`autorl agent-runner` as a pod runs it: everything from variables, the workspace created on
    first start, the budget enforced, exit 0 once the agent is ended at its deadline."""
    agent = agent_script(tmp_path, "import time\ntime.sleep(600)\n")
    workspace = tmp_path / "pod-workspace"
    done = run_pod_runner(tmp_path, tiny_base_model, agent, workspace, home=tmp_path / "home", sandbox="none")
    assert done.returncode == 0, done.stderr
    assert (workspace / "models" / "tiny-qwen2" / "config.json").is_file()
    assert (workspace / "data" / "train.jsonl").is_file()
    # A pod's runner writes its events to its own stream, never into the agent's agent.log.
    assert "event=deadline action=SIGTERM" in done.stderr
    assert "event=" not in (workspace / "agent.log").read_text()


@NEEDS_BWRAP
def test_the_platform_home_inside_the_agents_folder_stays_hidden(
    tmp_path: Path, tiny_base_model: Path
) -> None:
    """The agent's folder is normally mounted (its modules beside it); where that folder holds the
    platform home, only the agent's file is, so neither the home nor its siblings are visible."""
    agents = tmp_path / "agents"
    home = agents / "home"
    home.mkdir(parents=True)
    (home / "autorl.db").write_text("the platform database")
    (agents / "helper.py").write_text("X = 1\n")
    agent = agent_script(
        tmp_path,
        f"""
        import json, os
        report = {{}}
        for name, path in (("home", {str(home / "autorl.db")!r}), ("sibling", {str(agents / "helper.py")!r})):
            try:
                open(path).read()
                report[name] = "allowed"
            except OSError as exc:
                report[name] = type(exc).__name__
        json.dump(report, open(os.path.join(os.environ["OUTPUT_DIR"], "report.json"), "w"))
        """,
    )
    workspace = tmp_path / "pod-workspace"
    done = run_pod_runner(
        tmp_path, tiny_base_model, agent, workspace, home=home, sandbox="bwrap", timeout_s=60
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((workspace / "output" / "report.json").read_text())
    assert report == {"home": "FileNotFoundError", "sibling": "FileNotFoundError"}


#: A process of the runner's user opening the runner's stderr (its log stream in a pod) to write.
OPEN_THE_RUNNERS_STDERR = """
import os
try:
    open(f"/proc/{os.getppid()}/fd/2", "ab").close()
    print("opened")
except PermissionError:
    print("refused")
"""


@pytest.mark.parametrize(("kept", "expected"), [(False, "opened"), (True, "refused")])
def test_an_agent_of_the_runners_own_user_cannot_write_into_the_runners_log_stream(
    kept: bool, expected: str
) -> None:
    """In a pod the agent and its runner share a user id: without the runner made non-dumpable, the
    agent opened the runner's stderr (through /proc, as its owner) and forged the runner's lines
    there. Both run as an unprivileged user, the runner's stderr a pipe of its own, as in a pod."""
    driver = "\n".join(
        [
            "import os, subprocess, sys",
            "from autorl_agent_runner.sandbox.processes import keep_from_agent",
            "read, write = os.pipe()",
            "os.dup2(write, 2)",
            *(["keep_from_agent()"] if kept else []),
            # The system's Python: the unprivileged user may not reach the one the tests run under.
            f"subprocess.run(['/usr/bin/python3', '-c', {OPEN_THE_RUNNERS_STDERR!r}], check=True)",
        ]
    )
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    done = subprocess.run(
        [*unprivileged, "--bounding-set=-all", sys.executable, "-c", driver],
        capture_output=True,
        text=True,
        cwd="/",  # a folder that user may enter
        timeout=60,
    )
    assert done.stdout.strip() == expected, done


def test_the_runner_is_kept_from_its_agent_before_the_agent_starts(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept: list[bool] = []
    monkeypatch.setattr(runner_module, "keep_from_agent", lambda: kept.append(workspace.agent_log.exists()))
    agent = agent_script(tmp_path, "print('hello')")
    assert run(workspace, agent, sandbox=SandboxMode.NONE).exit_code == 0
    assert kept == [True]  # once, as the agent was about to start (its log open)
