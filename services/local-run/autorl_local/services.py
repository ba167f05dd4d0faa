"""The platform's own processes in a local run: the grader and the evaluator workers."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from autorl.errors import AutoRLError
from autorl.parent_death import dying_with_parent
from autorl.process_group import kill_group, log_tail

#: How long the grader may take to migrate the database and answer /readyz.
GRADER_START_TIMEOUT_S = 90.0
#: Workers finish the evaluation in hand on SIGTERM; a grader stops at once.
STOP_TIMEOUT_S = 15.0


class ServiceError(AutoRLError):
    """A platform process failed to start or died."""


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the grader's server does: connections of an earlier run in TIME_WAIT do not count,
        # a listening socket does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def autorl_command(*args: str) -> list[str]:
    """The ``autorl`` command of this very installation (not whichever is first on PATH)."""
    script = Path(sys.executable).parent / "autorl"
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from autorl.cli import main; raise SystemExit(main())", *args]


class ManagedProcess:
    """A child in a process group of its own, logging to a file, stopped in two stages."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            dying_with_parent(self.argv),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own group: the terminal's Ctrl-C goes to `autorl run` only, which then stops
            # the services in order instead of all of them dying mid-write.
            start_new_session=True,
        )

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def exit_code(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, max_lines=lines)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        process = self._process
        if process is not None:
            # The whole group: children it left behind too (a worker's evaluation subprocess).
            kill_group(process.pid, process, grace_s=timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_until_ready(
    process: ManagedProcess, ready: Callable[[], bool], timeout_s: float = GRADER_START_TIMEOUT_S
) -> None:
    """Poll ``ready()`` until true; fail early with the log's tail if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.running():
            raise ServiceError(
                f"{process.name} exited with code {process.exit_code()} while starting; "
                f"its log ({process.log_path}) ends with:\n{process.log_tail()}"
            )
        if ready():
            return
        time.sleep(0.2)
    raise ServiceError(f"{process.name} did not become ready in {timeout_s:.0f} s; see {process.log_path}")
