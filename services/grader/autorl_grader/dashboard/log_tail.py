"""The tail of an experiment's logs, read without following links and with a size cap.

Two logs, each of one source: ``agent.log`` in the workspace (the agent's own output) and, on one
machine, the runner's log under the platform home (``runs/<id>/logs/runner.log``: the platform's
events, which the agent cannot write). The workspace is partly the agent's to write, and with
``--sandbox none`` all of it is: ``agent.log`` may have been replaced by a link to any file the
grader can read, or by a huge or special file. A log is therefore opened relative to its folder
with ``O_NOFOLLOW``, must be a regular file, and only its last bytes are read.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from autorl.layout import AGENT_LOG_FILE, RUN_LOGS_DIR, RUNNER_LOG_FILE, RUNS_DIR

#: The most of the log's end that one request reads, in bytes.
MAX_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogTail:
    available: bool
    text: str
    size_bytes: int
    truncated: bool
    reason: str | None = None


def read_agent_tail(workspace: str, max_bytes: int = MAX_TAIL_BYTES) -> LogTail:
    """The last ``max_bytes`` of WORKSPACE/agent.log (the agent's output)."""
    unseen = "the workspace is not visible to this grader"
    return _read_tail(workspace, AGENT_LOG_FILE, max_bytes, what="agent log", no_folder=unseen)


def read_runner_tail(home: Path, run_id: str, max_bytes: int = MAX_TAIL_BYTES) -> LogTail:
    """The last ``max_bytes`` of the runner's log of run ``run_id`` under the platform home."""
    missing = "no runner log in this grader's home (in Kubernetes it is the agent pod's own log)"
    if run_id in ("", ".", "..") or "/" in run_id or "\0" in run_id:
        return LogTail(False, "", 0, False, missing)
    folder = str(home / RUNS_DIR / run_id / RUN_LOGS_DIR)
    return _read_tail(folder, RUNNER_LOG_FILE, max_bytes, what="runner log", no_folder=missing)


def _read_tail(folder: str, name: str, max_bytes: int, *, what: str, no_folder: str) -> LogTail:
    """The last ``max_bytes`` of FOLDER/NAME as text (undecodable bytes replaced)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return LogTail(False, "", 0, False, no_folder)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        reason = f"no {what} yet" if exc.errno == errno.ENOENT else f"the {what} is not a plain file"
        return LogTail(False, "", 0, False, reason)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return LogTail(False, "", 0, False, f"the {what} is not a plain file")
        start = max(0, info.st_size - max_bytes)
        data = os.pread(fd, max_bytes, start)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if start > 0:
        # Start at a whole line: the cut most likely fell inside one.
        text = text.partition("\n")[2]
    return LogTail(True, text, info.st_size, start > 0)
