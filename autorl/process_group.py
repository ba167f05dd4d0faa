"""Ending a process group: SIGTERM, a grace period, SIGKILL, then wait until the kernel has reaped
it; and the tail of a process's log. One implementation for every service that runs children in
a group of their own (the evaluator's supervised runs and warm child, `autorl run`'s services)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

#: After SIGTERM, how long a group gets to exit before SIGKILL (callers may give more).
KILL_GRACE_S = 5.0
#: How long to wait for the kernel to reap a SIGKILLed group before reporting survivors.
REAP_WAIT_S = 10.0


def group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``, read from /proc."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may itself hold spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def kill_group(
    pgid: int, leader: subprocess.Popen[Any] | None = None, *, grace_s: float = KILL_GRACE_S
) -> list[int]:
    """SIGTERM the group, SIGKILL what is left after ``grace_s`` (the leader, if given, is waited
    for too, so it leaves no zombie); return the pids still alive after the reap wait."""
    if not group_members(pgid):
        if leader is not None:
            leader.wait()
        return []
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pgid, leader):
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    if leader is not None:
        leader.wait()
    deadline = time.monotonic() + REAP_WAIT_S
    while (members := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def _alive(pgid: int, leader: subprocess.Popen[Any] | None) -> bool:
    if leader is not None and leader.poll() is None:
        return True
    return bool(group_members(pgid))


def log_tail(path: Path, *, max_lines: int = 40, max_chars: int = 4000) -> str:
    """The last lines of a log file (empty if it does not exist)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-max_chars * 4 :].decode("utf-8", errors="replace")
    lines = text.splitlines()[-max_lines:]
    return "\n".join(lines)[-max_chars:]
