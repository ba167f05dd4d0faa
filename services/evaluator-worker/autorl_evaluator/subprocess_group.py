"""Run a command tree with a hard timeout that kills all of it.

The command runs under a small supervisor (this module run as a program) that leads a process
group of its own. Everything the command starts (OpenCompass's task subprocesses, vLLM's
spawned workers) inherits that group, so one ``killpg`` reaches all of it. The supervisor is
also a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process that leaves the group
(``setsid``, ``setpgid``) and whose parent ends is handed to the supervisor, so everything the
command started stays among its descendants. When the command exits, when the supervisor gets
SIGTERM (the hard timeout, an interrupted wait), and when its parent dies (it asks the kernel for
SIGTERM then, ``PR_SET_PDEATHSIG``), it ends every descendant: SIGTERM, SIGKILL what is left five
seconds later, reaped. An evaluation whose worker was SIGKILLed (an RQ cold shutdown, a local
worker's hard stop) leaves no orphaned process holding a GPU. The supervisor tells the worker,
through a pipe, which of them were still alive after SIGKILL.
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

from autorl.process_group import (
    KILL_GRACE_S,
    REAP_WAIT_S,
    end_descendants,
    group_members,
    kill_group,
    log_tail,
)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: How long the worker gives the supervisor to end the run (SIGTERM, grace, SIGKILL, reap) before
#: it SIGKILLs the group itself.
SUPERVISOR_GRACE_S = KILL_GRACE_S + REAP_WAIT_S + 5.0


__all__ = ["GroupResult", "group_members", "kill_group", "log_tail", "run_in_group"]


@dataclass
class GroupResult:
    """What became of one supervised run."""

    returncode: int
    timed_out: bool
    seconds: float
    #: Processes of the run still alive after the kill, in its group or not (should always be empty).
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

    At ``timeout_s`` the whole group, and every process of the run that left it, gets SIGTERM,
    then SIGKILL after :data:`KILL_GRACE_S`. Any exception in the caller while waiting (an RQ job
    timeout, a KeyboardInterrupt) ends them too before it propagates; so does the command's exit.
    """
    started = time.monotonic()
    report, report_to = os.pipe()
    with open(report, "rb", buffering=0) as reported:
        try:
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "autorl_evaluator.subprocess_group", str(os.getpid()),
                     str(report_to), "--", *command],
                    cwd=cwd,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(report_to,),
                )  # fmt: skip
        finally:
            os.close(report_to)
        pgid = process.pid
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            kill_group(pgid, process, grace_s=SUPERVISOR_GRACE_S)
            raise
        # The supervisor has ended the run (on a timeout, it is ending it); what it left of the group
        # (it died first, say) is ended here.
        survivors = kill_group(pgid, process, grace_s=SUPERVISOR_GRACE_S)
        # What the supervisor found still alive after SIGKILL, written before it exited (not waited
        # for: a process forked from this one meanwhile may hold the pipe open).
        os.set_blocking(report, False)
        survivors = sorted({*survivors, *map(int, (reported.read(1 << 16) or b"").split())})
    returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
    return GroupResult(returncode, timed_out, time.monotonic() - started, survivors)


# --- the supervisor ---------------------------------------------------------------------------


def _prctl(option: int, value: int, name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({name}) failed")


def set_parent_death_signal(signum: int) -> None:
    """In a child before it runs (``preexec_fn``): ``signum`` when the process that started it ends."""
    _prctl(_PR_SET_PDEATHSIG, signum, "PR_SET_PDEATHSIG")


def _end_run(report_fd: int) -> bool:
    """End every descendant and write those still alive after SIGKILL to ``report_fd`` (the worker
    reads it once the supervisor has exited); whether SIGKILL was needed."""
    killed, survivors = end_descendants()
    with contextlib.suppress(OSError):
        os.write(report_fd, " ".join(map(str, survivors)).encode())
    return killed


def _supervise(parent_pid: int, report_fd: int, command: list[str]) -> int:
    def end_run(signum: int, _frame: object) -> None:
        # Ignore our own share of the group-wide signals (the worker's), then take everything down.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if _end_run(report_fd):
            # Exit as the whole group did before: by SIGKILL when it took one.
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end_run)
    if sys.platform.startswith("linux"):
        set_parent_death_signal(signal.SIGTERM)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")
    # The parent may have died before prctl took effect: then nobody would ever signal us.
    if os.getppid() != parent_pid:
        return 1
    process = subprocess.Popen(command)
    # Wait for the command, reaping on the way what it left behind (handed to us) that ended.
    while (reaped := os.waitpid(-1, 0))[0] != process.pid:
        pass
    code = process.returncode = os.waitstatus_to_exitcode(reaped[1])
    # A command can exit while something it started goes on: end that too.
    _end_run(report_fd)
    # A child killed by a signal reports -N; exit as a shell would, 128 + N.
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[2] != "--":
        print(
            "usage: python -m autorl_evaluator.subprocess_group PARENT_PID REPORT_FD -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    return _supervise(int(args[0]), int(args[1]), args[3:])


if __name__ == "__main__":
    raise SystemExit(main())
