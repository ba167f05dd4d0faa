"""What an agent sees from inside a real bubblewrap sandbox built from the allow-list view
(autorl_agent_runner.sandbox.filesystem_view): its own users, host names and resolver files, private
temporary folders, a read-only system, a writable workspace with read-only models/ and data/,
and nothing of the platform folders around it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from autorl_agent_runner.sandbox.egress import TOOLS
from autorl_agent_runner.sandbox.filesystem_view import AGENT_USER_NAME, PRIVATE_TMP
from autorl_agent_runner.sandbox.plan import SandboxMode, SandboxRequest, plan_sandbox
from autorl_agent_runner.sandbox.python_env import PythonEnv
from tests.support.requirements import require

pytestmark = pytest.mark.requires(shutil.which("bwrap") is not None, reason="the sandbox needs bubblewrap")


def sandboxed(request: SandboxRequest, script: str) -> str:
    """Run ``script`` with /bin/sh inside the sandbox ``request`` plans; its standard output."""
    plan = plan_sandbox(SandboxMode.BWRAP, request)
    try:
        assert plan.gate is not None
        process = subprocess.Popen(
            plan.command(["/bin/sh", "-c", script]),
            pass_fds=plan.pass_fds,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        plan.started()
        plan.gate.release()
        out, err = process.communicate(timeout=60)
    finally:
        plan.cleanup()
    assert process.returncode == 0, f"the sandboxed shell failed ({process.returncode}): {err}"
    return out


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A platform home holding a run's workspace, a secret beside it and an agent's program."""
    home = tmp_path / "home"
    workspace = home / "runs" / "r" / "workspace"
    for part in ("models", "data", "output"):
        (workspace / part).mkdir(parents=True)
    (workspace / "models" / "config.json").write_text("{}\n")
    (home / "platform.db").write_text("secret")
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "agent.py").write_text("print('hi')\n")
    (agents / "helper.py").write_text("X = 1\n")
    return {"home": home, "workspace": workspace, "agents": agents}


def request_for(
    layout: dict[str, Path], *, program: Path | None = None, egress: bool = False
) -> SandboxRequest:
    workspace = layout["workspace"]
    return SandboxRequest(
        workspace=workspace,
        read_only=[workspace / "models", workspace / "data"],
        python_env=PythonEnv.current(),
        program=program,
        forbidden=[layout["home"]],
        egress=egress,
    )


def lines(text: str) -> dict[str, str]:
    """``key=value`` lines printed by a script, as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_agent_has_its_own_users_hosts_and_no_resolver(layout: dict[str, Path]) -> None:
    out = sandboxed(
        request_for(layout),
        'echo "uid=$(id -u)"; echo "hostname=$(cat /etc/hostname)"; echo "pwd=$(pwd)"; '
        'grep "^agent:" /etc/passwd | sed "s/^/passwd=/"; grep "^agent:" /etc/group | sed "s/^/group=/"; '
        'grep -c . /etc/passwd | sed "s/^/users=/"; '
        'grep -P "^127\\.0\\.0\\.1\\tlocalhost$" /etc/hosts | sed "s/^/hosts=/"; '
        "test -e /etc/resolv.conf && echo resolv=yes || echo resolv=no; "
        "test -e /etc/shadow && echo shadow=yes || echo shadow=no; "
        'getent passwd 0 | sed "s/^/root=/"; getent passwd 65534 | sed "s/^/nobody=/"; '
        f"{PythonEnv.current().interpreter} -c 'import sys; print(\"python=\" + sys.prefix)'",
    )
    seen = lines(out)
    name, _, uid, gid, _, home, shell = seen["passwd"].split(":")
    assert (name, uid, home, shell) == (AGENT_USER_NAME, seen["uid"], str(layout["workspace"]), "/bin/sh")
    assert seen["group"] == f"{AGENT_USER_NAME}:x:{gid}:"
    assert seen["users"] == "3", "root, the agent and nobody: no user of the host"
    assert seen["hostname"] == "autorl-agent" and seen["hosts"] == "127.0.0.1\tlocalhost"
    assert seen["pwd"] == str(layout["workspace"])
    assert seen["resolv"] == "no", "without --egress the agent has no resolver to ask"
    assert seen["shadow"] == "no"
    assert seen["root"] == "root:x:0:0:root:/root:/usr/sbin/nologin"
    assert seen["nobody"] == "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
    # The agent's Python environment is there, at its own path.
    assert seen["python"] == sys.prefix


def test_egress_gives_the_agent_a_resolver(layout: dict[str, Path]) -> None:
    require(all(shutil.which(tool) for tool in TOOLS), "--egress needs slirp4netns, nftables and iproute2")
    out = sandboxed(request_for(layout, egress=True), "cat /etc/resolv.conf")
    assert out.startswith("nameserver "), out


def test_temporary_folders_are_private_and_the_system_read_only(layout: dict[str, Path]) -> None:
    name = f"autorl-view-{uuid.uuid4().hex}"
    checks = "".join(
        f'echo "{folder}=$(stat -c %a {folder})"; touch {folder}/{name} && echo "{folder} writable=yes"; '
        for folder in PRIVATE_TMP
    )
    out = sandboxed(
        request_for(layout),
        checks + "touch /usr/x 2>/dev/null && echo usr=writable || echo usr=read-only; "
        'for d in bin lib sbin; do test -x /$d/sh -o -d /$d && echo "$d=present"; done; '
        "test -f /etc/ssl/certs/ca-certificates.crt -o -d /etc/ssl/certs && echo certs=present; "
        "test -d /sys/devices && echo sys=present; test -c /dev/null && echo devnull=present; "
        "test -r /proc/self/status && echo proc=present",
    )
    seen = lines(out)
    for folder in PRIVATE_TMP:
        assert seen[folder] == "1777" and seen[f"{folder} writable"] == "yes", out
        assert not (Path(folder) / name).exists(), f"the agent's {folder} is the host's"
    assert seen["usr"] == "read-only"
    assert {seen.get(d) for d in ("bin", "lib", "sbin")} == {"present"}, out
    assert seen["certs"] == seen["sys"] == seen["devnull"] == seen["proc"] == "present", out


def test_the_workspace_is_writable_its_inputs_are_not_and_the_home_is_gone(layout: dict[str, Path]) -> None:
    workspace = layout["workspace"]
    out = sandboxed(
        request_for(layout, program=layout["agents"] / "agent.py"),
        f"cd {workspace}; touch output/x && echo output=writable; "
        "touch models/x 2>/dev/null && echo models=writable || echo models=read-only; "
        "touch data/x 2>/dev/null && echo data=writable || echo data=read-only; "
        "cat models/config.json | sed 's/^/config=/'; "
        f"test -e {layout['home']}/platform.db && echo secret=visible || echo secret=absent; "
        f"ls {layout['home']}/runs | sed 's/^/runs=/'; "
        f"test -f {layout['agents']}/helper.py && echo helper=visible; "
        f"touch {layout['agents']}/new 2>/dev/null && echo agents=writable || echo agents=read-only",
    )
    seen = lines(out)
    assert seen["output"] == "writable" and (workspace / "output" / "x").is_file()
    assert seen["models"] == seen["data"] == "read-only" and seen["config"] == "{}"
    assert seen["secret"] == "absent" and seen["runs"] == "r", out
    # A custom agent's folder is mounted, read-only, with the modules beside its program.
    assert seen["helper"] == "visible" and seen["agents"] == "read-only"


def test_an_agent_whose_folder_holds_the_workspace_gets_only_its_file(tmp_path: Path) -> None:
    workspace = tmp_path / "run" / "workspace"
    (workspace / "models").mkdir(parents=True)
    (workspace / "data").mkdir()
    (tmp_path / "agent.py").write_text("print('hi')\n")
    (tmp_path / "notes.txt").write_text("beside the agent\n")
    request = SandboxRequest(
        workspace=workspace,
        read_only=[workspace / "models", workspace / "data"],
        python_env=PythonEnv.current(),
        program=tmp_path / "agent.py",
    )
    out = sandboxed(
        request,
        f"test -f {tmp_path}/agent.py && echo program=visible; "
        f"test -e {tmp_path}/notes.txt && echo notes=visible || echo notes=absent; "
        f"touch {tmp_path}/agent.py 2>/dev/null && echo program=writable || echo program=read-only",
    )
    seen = out.split()
    assert seen == ["program=visible", "notes=absent", "program=read-only"], out
