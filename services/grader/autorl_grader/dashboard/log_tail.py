"""The tail of an experiment's ``agent.log``, read without following links and with a size cap.

The workspace is partly the agent's to write, and with ``--sandbox none`` all of it is: ``agent.log``
may have been replaced by a link to any file the grader can read, or by a huge or special file. The
log is therefore opened relative to the workspace directory with ``O_NOFOLLOW``, must be a regular
file, and only its last bytes are read.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

AGENT_LOG = "agent.log"
#: The most of the log's end that one request reads, in bytes.
MAX_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogTail:
    available: bool
    text: str
    size_bytes: int
    truncated: bool
    reason: str | None = None


def read_tail(workspace: str, max_bytes: int = MAX_TAIL_BYTES) -> LogTail:
    """The last ``max_bytes`` of WORKSPACE/agent.log as text (undecodable bytes replaced)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        dir_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return LogTail(False, "", 0, False, "the workspace is not visible to this grader")
    try:
        fd = os.open(AGENT_LOG, flags, dir_fd=dir_fd)
    except OSError as exc:
        reason = "no agent log yet" if exc.errno == errno.ENOENT else "the agent log is not a plain file"
        return LogTail(False, "", 0, False, reason)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return LogTail(False, "", 0, False, "the agent log is not a plain file")
        start = max(0, info.st_size - max_bytes)
        data = os.pread(fd, max_bytes, start)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if start > 0:
        # Start at a whole line: the cut most likely fell inside one.
        text = text.partition("\n")[2]
    return LogTail(True, text, info.st_size, start > 0)
