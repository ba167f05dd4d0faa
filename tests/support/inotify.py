"""A minimal inotify watcher (Linux, through ctypes): tests react the moment a file is opened."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

IN_ACCESS = 0x001
IN_MODIFY = 0x002
IN_OPEN = 0x020
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Watch:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def events(self, timeout_s: float) -> list[tuple[str, int]]:
        """(name, mask) of the events that arrive within ``timeout_s`` (none: an empty list)."""
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        data = os.read(self.fd, 64 * 1024)
        events: list[tuple[str, int]] = []
        offset = 0
        while offset < len(data):
            _, mask, _, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            events.append((raw.rstrip(b"\0").decode("utf-8", "replace"), mask))
            offset += _EVENT.size + length
        return events


@contextmanager
def watch(folder: Path, mask: int) -> Iterator[Watch]:
    """Watch the files of ``folder`` for the events in ``mask``."""
    fd = _libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    try:
        if _libc.inotify_add_watch(fd, os.fsencode(folder), mask) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder} failed")
        yield Watch(fd)
    finally:
        os.close(fd)
