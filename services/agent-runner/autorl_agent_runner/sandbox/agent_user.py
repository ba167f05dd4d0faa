"""The agent's own host user id (when the platform runs as root).

A user id no account and no process uses is this run's alone: the agent cannot signal platform
processes, owns only the files handed to it, and every process it starts can be found, and
killed, by that id wherever it moved. Afterwards its files are handed back, so the id owns
nothing and can serve a later run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from pathlib import Path

from autorl.errors import AutoRLError
from autorl_agent_runner.workspace.tree_walk import chown_tree

#: User ids handed to agents. No passwd entry is needed; ids with one are skipped.
AGENT_UID_RANGE = range(61000, 65000)


class AgentUserError(AutoRLError):
    """No free user id for the agent."""


def allocate_uid() -> int:
    """A user id no account and no running process uses (so it is this run's alone)."""
    import pwd

    busy = {_uid_of(pid) for pid in _pids()}
    candidates = list(AGENT_UID_RANGE)
    random.shuffle(candidates)
    for uid in candidates:
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    first, last = AGENT_UID_RANGE.start, AGENT_UID_RANGE.stop - 1
    raise AgentUserError(f"no free user id in {first}-{last} for the agent")


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:  # the process has ended
        return None


def give_to_agent(paths: Iterable[Path], uid: int, gid: int) -> None:
    """Let the agent's user, and only it, write and read these folders (workspace root, code/, output/)."""
    for path in paths:
        os.chown(path, uid, gid)
        path.chmod(0o700)


def reclaim(root: Path) -> int:
    """Give everything the agent wrote back to the platform's user, links not followed, however
    deep its folders nest; returns how many entries could not be given back."""
    return chown_tree(root, os.geteuid(), os.getegid())


def signal_uid(uid: int, gid: int, signum: int) -> None:
    """Send ``signum`` to every process of ``uid`` (``kill(-1)`` from a child running as it).

    Race-free where a /proc scan is not: a process cannot fork out of its user id.
    """
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (the parent may hold locks)
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.kill(-1, signum)
        except ProcessLookupError:
            pass
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def uid_processes(uid: int) -> list[int]:
    return [pid for pid in _pids() if _uid_of(pid) == uid]
