"""Run a command tree with a hard timeout that kills all of it.

The command runs under a small supervisor (this module run as a program) that leads a process
group of its own. Everything the command starts (OpenCompass's task subprocesses, vLLM's
spawned workers) inherits that group, so one ``killpg`` reaches all of it. The supervisor asks
the kernel for a signal when its parent dies (``PR_SET_PDEATHSIG``) and then kills the group:
an evaluation whose worker was SIGKILLed (an RQ cold shutdown, a local worker's hard stop)
leaves no orphaned process holding a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autorl.process_group import KILL_GRACE_S, group_members, kill_group, log_tail

_PR_SET_PDEATHSIG = 1


__all__ = ["GroupResult", "group_members", "kill_group", "log_tail", "run_in_group"]


@dataclass
class GroupResult:
    """What became of one supervised run."""

    returncode: int
    timed_out: bool
    seconds: float
    #: Processes of the group still alive after the kill (should always be empty).
    survivors: list[int] = field(default_factory=list)


def run_in_group(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    log_path: Path,
) -> GroupResult:
    """Run ``command`` in a new process group; stdout and stderr go to ``log_path``.

    At ``timeout_s`` the whole group gets SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`.
    Any exception in the caller while waiting (an RQ job timeout, a KeyboardInterrupt) kills
    the group too before it propagates.
    """
    supervisor = [sys.executable, "-m", "autorl_evaluator.subprocess_group", str(os.getpid()), "--", *command]
    started = time.monotonic()
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            supervisor,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pgid = process.pid
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:
        kill_group(pgid, process)
        raise
    # A command can exit while something it started goes on in the group: end that too.
    survivors = kill_group(pgid, process)
    returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
    return GroupResult(returncode, timed_out, time.monotonic() - started, survivors)


# --- the supervisor ---------------------------------------------------------------------------


def set_parent_death_signal(signum: int) -> None:
    """In a child before it runs (``preexec_fn``): ``signum`` when the process that started it ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _supervise(parent_pid: int, command: list[str]) -> int:
    pgid = os.getpgrp()

    def end_group(signum: int, _frame: object) -> None:
        # Ignore our own share of the group-wide signals, then take everything down.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            if set(group_members(pgid)) <= {os.getpid()}:
                os._exit(128 + signum)
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, end_group)
    if sys.platform.startswith("linux"):
        set_parent_death_signal(signal.SIGTERM)
    # The parent may have died before prctl took effect: then nobody would ever signal us.
    if os.getppid() != parent_pid:
        return 1
    code = subprocess.Popen(command).wait()
    # A child killed by a signal reports -N; exit as a shell would, 128 + N.
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m autorl_evaluator.subprocess_group PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    return _supervise(int(args[0]), args[2:])


if __name__ == "__main__":
    raise SystemExit(main())
