"""Finding and ending an agent's processes, including those that left its process group.

An agent starts in a session and process group of its own. Its children can leave both
(``setsid``, double fork), so at the deadline the runner also looks for:
- every process of the agent's own user id, in the ``user`` sandbox (they cannot change it);
- otherwise every process that is in the agent's session or carries the run's marker variable in
  its environment (a process that both left the session and scrubbed its environment escapes
  this; the ``user`` sandbox and bubblewrap's PID namespace do not have that gap).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autorl_agent_runner.environment import RUN_MARKER_VARIABLE
from autorl_agent_runner.sandbox import signal_uid, uid_processes

POLL_S = 0.1


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state ppid pgrp session ...
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[3])


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


@dataclass
class AgentProcesses:
    """The processes of one agent run, by whichever handle the sandbox gives."""

    leader_pid: int
    run_marker: str
    uid: int | None = None
    gid: int | None = None
    #: The leader is a wrapper (bubblewrap) that dies on SIGTERM and takes the agent with it at
    #: once; SIGTERM then goes to the agent's own processes only, so that the grace period holds.
    wrapped: bool = False

    def alive(self) -> list[int]:
        """Live (non-zombie) processes of this run, the runner itself excluded."""
        me = os.getpid()
        if self.uid is not None:
            return [pid for pid in uid_processes(self.uid) if pid != me and not _is_zombie(pid)]
        marker = f"{RUN_MARKER_VARIABLE}={self.run_marker}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == me or _is_zombie(pid):
                continue
            if _session_of(pid) == self.leader_pid or _has_marker(pid, marker):
                found.append(pid)
        return found

    def signal_all(self, signum: int) -> None:
        if self.uid is not None and self.gid is not None:
            # Every agent process has the uid (the group too): one signal each, not two, so that
            # an agent counting SIGTERMs does not take a second one for "hurry up".
            signal_uid(self.uid, self.gid, signum)
            if signum == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.leader_pid, signum)
            return
        spare_leader = self.wrapped and signum != signal.SIGKILL
        if not spare_leader:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader_pid, signum)
        for pid in self.alive():
            if spare_leader and pid == self.leader_pid:
                continue
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                continue


def end_processes(
    processes: AgentProcesses,
    *,
    grace_period_s: float,
    reap: Callable[[], None],
    log: Callable[[str], None],
) -> tuple[bool, int]:
    """SIGTERM everything, wait up to ``grace_period_s``, then SIGKILL what is left.

    ``reap`` collects the leader's exit status (so it is not counted as alive as a zombie).
    Returns (whether SIGKILL was needed, how many processes were still alive for it).
    """
    processes.signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_period_s
    while time.monotonic() < deadline:
        reap()
        if not processes.alive():
            return False, 0
        time.sleep(POLL_S)
    survivors = processes.alive()
    log(f"event=agent_kill signal=SIGKILL processes={len(survivors)} grace_s={grace_period_s:g}")
    # Repeated: a process may fork between the scan and the signal.
    for _ in range(50):
        processes.signal_all(signal.SIGKILL)
        reap()
        if not processes.alive():
            break
        time.sleep(POLL_S)
    return True, len(survivors)
