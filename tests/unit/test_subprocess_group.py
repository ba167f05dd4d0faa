"""The hard timeout kills the whole process tree, and so does the death of the process that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autorl_evaluator.subprocess_group import GroupResult, group_members, log_tail, run_in_group

# A command that leaves a grandchild behind and then blocks: the shape of OpenCompass starting a
# task process that starts vLLM workers.
TREE = ["sh", "-c", "sleep 300 & echo started; sleep 300"]


def escaping(then: str, *, ignore_sigterm: bool = False) -> list[str]:
    """A command that starts a grandchild which leaves the group and the session (``os.setsid()``)
    and sleeps, waits until it has, then runs ``then`` (Python)."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_sigterm else ""
    grandchild = (
        f"import os, signal, time; {ignore}os.setsid(); open('escaped', 'w').close(); time.sleep(300)"
    )
    return [
        sys.executable,
        "-c",
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        "while not os.path.exists('escaped'): time.sleep(0.02)\n"
        f"print('started', flush=True)\n{then}\n",
    ]


def run_shell(script: str, folder: Path) -> GroupResult:
    """``sh -c script`` run in ``folder`` within 30 s, its output logged to ``folder/l``."""
    return run_in_group(
        ["sh", "-c", script], cwd=folder, env=dict(os.environ), timeout_s=30, log_path=folder / "l"
    )


@pytest.fixture
def leftovers(tmp_path: Path) -> Iterator[None]:
    """Whatever a test leaves running in its folder (a failing one) is SIGKILLed at its end."""
    yield
    for pid in _processes_in(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _processes_in(cwd: Path) -> list[int]:
    """Live processes whose working directory is ``cwd`` (everything the tree started is there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(cwd):
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_timeout_kills_the_group_including_grandchildren(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    started = time.monotonic()
    result = run_in_group(TREE, cwd=tmp_path, env=dict(os.environ), timeout_s=1.5, log_path=log)
    assert result.timed_out
    assert result.survivors == []
    assert time.monotonic() - started < 15
    assert _processes_in(tmp_path) == []
    assert "started" in log.read_text()


def test_a_command_that_finishes_reports_its_exit_code(tmp_path: Path) -> None:
    result = run_shell("echo done; exit 3", tmp_path)
    assert (result.returncode, result.timed_out, result.survivors) == (3, False, [])
    assert log_tail(tmp_path / "l") == "done"


def test_what_a_finished_command_left_running_is_killed(tmp_path: Path) -> None:
    result = run_shell("sleep 300 & exit 0", tmp_path)
    assert result.returncode == 0 and not result.timed_out
    assert _processes_in(tmp_path) == []


@pytest.mark.usefixtures("leftovers")
def test_a_process_that_left_the_group_is_killed_when_the_command_exits(tmp_path: Path) -> None:
    result = run_in_group(
        escaping("sys.exit(4)"), cwd=tmp_path, env=dict(os.environ), timeout_s=60, log_path=tmp_path / "l"
    )
    assert (result.returncode, result.timed_out, result.survivors) == (4, False, [])
    assert (tmp_path / "escaped").exists()
    assert _processes_in(tmp_path) == []


@pytest.mark.usefixtures("leftovers")
def test_the_timeout_kills_what_left_the_group_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    result = run_in_group(
        escaping("time.sleep(300)", ignore_sigterm=True),
        cwd=tmp_path,
        env=dict(os.environ),
        timeout_s=3,
        log_path=tmp_path / "l",
    )
    assert "started" in log_tail(tmp_path / "l")
    assert _processes_in(tmp_path) == []
    assert (result.timed_out, result.survivors) == (True, [])


@pytest.mark.usefixtures("leftovers")
@pytest.mark.parametrize("command", [TREE, escaping("time.sleep(300)")], ids=["group", "left the group"])
def test_the_tree_dies_with_the_process_that_started_it(tmp_path: Path, command: list[str]) -> None:
    """A worker SIGKILLed mid-evaluation (an RQ cold shutdown) must not leave an orphaned tree, not
    even a process that left the group."""
    parent_code = (
        "import os, sys; from pathlib import Path; "
        "from autorl_evaluator.subprocess_group import run_in_group; "
        f"run_in_group({command!r}, cwd=Path({str(tmp_path)!r}), env=dict(os.environ), "
        f"timeout_s=300, log_path=Path({str(tmp_path / 'l')!r}))"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    deadline = time.monotonic() + 30
    while "started" not in log_tail(tmp_path / "l") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_processes_in(tmp_path)) >= 3  # the supervisor, the command, what it started
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_in(tmp_path) == []


def test_group_members_sees_only_live_members_of_the_group(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_members(child.pid) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert group_members(child.pid) == []
