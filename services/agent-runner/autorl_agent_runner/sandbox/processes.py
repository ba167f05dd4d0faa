"""Finding and ending an agent's processes, including those that left its process group.

An agent starts in a session and process group of its own. Its children can leave both
(``setsid``, double fork), so at the deadline the runner looks for:
- every process in the sandbox's PID namespace (the descendants of its first process, which no
  process can leave: orphans are adopted by that first process);
- every process of the agent's own user id, in the ``user`` sandbox (they cannot change it);
- without a sandbox, every process in the agent's session or with the run's marker variable in
  its environment (a process that both left the session and scrubbed its environment escapes
  this; the sandboxes do not have that gap).
SIGTERM goes to the agent's processes, not to bubblewrap or the namespace's first process,
whose end would SIGKILL everything at once; SIGKILL goes to all of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autorl.process_group import descendants
from autorl_agent_runner.sandbox.agent_user import signal_uid, uid_processes
from autorl_agent_runner.sandbox.environment import RUN_MARKER_VARIABLE

POLL_S = 0.1


#: prctl's option that sets whether a process is dumpable (linux/prctl.h).
PR_SET_DUMPABLE = 4


def keep_from_agent() -> None:
    """Make this process non-dumpable, before it starts an agent that runs as its own user id (a
    cluster's pod is the agent's sandbox, with one user for the runner and the agent): a process of
    that user can then neither open this one's /proc files (its descriptors: the runner's log stream,
    the pod's own) nor trace it. The agent's program is dumpable again (exec resets it)."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state ppid pgrp session ...
    return stat[stat.rindex(")") + 2 :].split()


def _session_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[3]) if fields else None


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] == "Z"


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


@dataclass
class AgentProcesses:
    """The processes of one agent run, by whichever handles the sandbox gives."""

    leader_pid: int
    run_marker: str
    uid: int | None = None
    gid: int | None = None
    #: The leader is a wrapper (bubblewrap): SIGTERM would end it, and with it the agent at once.
    wrapped: bool = False
    #: The host pid of the first process of the sandbox's own PID namespace.
    namespace_init: int | None = None

    def alive(self) -> list[int]:
        """Live (non-zombie) processes of this run, the runner itself excluded."""
        found = {self.leader_pid}
        if self.namespace_init is not None:
            found |= {self.namespace_init, *descendants(self.namespace_init)}
        if self.uid is not None:
            found.update(uid_processes(self.uid))
        elif self.namespace_init is None:
            marker = f"{RUN_MARKER_VARIABLE}={self.run_marker}".encode()
            found.update(
                pid for pid in _all_pids() if _session_of(pid) == self.leader_pid or _has_marker(pid, marker)
            )
        me = os.getpid()
        return sorted(pid for pid in found if pid != me and not _is_zombie(pid))

    def signal_all(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            # The namespace's first process takes the whole namespace with it; the uid catches
            # anything else of the agent's.
            if self.namespace_init is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.namespace_init, signum)
            if self.uid is not None and self.gid is not None:
                signal_uid(self.uid, self.gid, signum)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader_pid, signum)
            spared: set[int] = set()
        else:
            spared = {self.leader_pid} if self.wrapped else set()
            if self.namespace_init is not None:
                spared.add(self.namespace_init)
        # One signal each, so that an agent counting SIGTERMs does not take a second for "hurry up".
        for pid in self.alive():
            if pid in spared:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


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
