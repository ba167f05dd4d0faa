"""Ending a process group: SIGTERM, a grace period, SIGKILL, then wait until the kernel has reaped
it; the same for every descendant of a child subreaper, in whatever group or session; and the tail
of a process's log. One implementation for every service that runs children in a group of their
own (the evaluator's supervised runs and warm child, `autorl run`'s services)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: After SIGTERM, how long a group gets to exit before SIGKILL (callers may give more).
KILL_GRACE_S = 5.0
#: How long to wait for the kernel to reap a SIGKILLed group before reporting survivors.
REAP_WAIT_S = 10.0


def _processes() -> Iterator[tuple[int, bool, int, int]]:
    """Each process in /proc: its pid, whether it is live (not a zombie), its parent, its group."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which is in parentheses and may itself hold spaces.
        state, parent, group = stat[stat.rfind(")") + 2 :].split()[:3]
        yield int(entry.name), state not in ("Z", "X"), int(parent), int(group)


def group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``, read from /proc."""
    return [pid for pid, live, _, group in _processes() if live and group == pgid]


def descendants(root: int) -> list[int]:
    """Pids of live (not zombie) processes whose ancestry leads to ``root`` (its children, theirs,
    and so on, in whatever group or session), from one scan of /proc."""
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    for pid, alive, parent, _ in _processes():
        children.setdefault(parent, []).append(pid)
        if alive:
            live.add(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return sorted(found & live)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def end_descendants(grace_s: float = KILL_GRACE_S) -> tuple[bool, list[int]]:
    """In a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``: an orphan among its descendants is
    handed to it, so whatever it started stays its descendant even in a group or session of its
    own): SIGTERM each descendant, SIGKILL what is left after ``grace_s``, and reap its children
    (every child of this process, so only for a process whose children are all to end). Returns
    whether SIGKILL was needed and the pids still alive after :data:`REAP_WAIT_S`."""
    me = os.getpid()
    _reap_children()
    left = descendants(me)
    _signal_each(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        _reap_children()
        left = descendants(me)
    if not left:
        return False, []
    deadline = time.monotonic() + REAP_WAIT_S
    while left and time.monotonic() < deadline:
        # Every round: a process may have started another between the scan and the signal.
        _signal_each(left, signal.SIGKILL)
        time.sleep(0.1)
        _reap_children()
        left = descendants(me)
    return True, left


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
