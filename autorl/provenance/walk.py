"""A bounded, streaming walk of an agent's folders, shared by the scan and the cluster's copy.

An agent chooses what its folders hold, so the walk costs what the platform allows, not what the
agent wrote: folders are read with :func:`os.scandir` one entry at a time (a folder's names are
never held together: a million names cost no memory), every entry counts toward an entry budget
(files, folders, links, special files and the files a caller skips alike), and a time budget ends
it. No link is followed; folders are opened relative to their parent's descriptor, so no path is
ever longer than one name. A folder that cannot be opened or listed is recorded. Reaching a budget
or leaving anything unread makes the walk incomplete (:attr:`Walk.complete`), never clean.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autorl.untrusted_text import printable_within

#: Entries (of every kind) looked at at most, over all roots of one walk.
MAX_ENTRIES = 200_000
#: Seconds a walk (and what its caller does with each file) may take.
MAX_SECONDS = 300.0
#: Folders deeper than this below a root are not entered (and the walk is incomplete).
MAX_DEPTH = 64
#: Characters of a path a report names, at most (64 folders of 255 bytes would be 16 KiB).
MAX_SHOWN_PATH_CHARS = 300
#: A file whose allocated blocks are under half its size (and it is past this size) is sparse: its
#: holes would read as zeros that cost the byte budget and no disk; it is not read, and named.
SPARSE_MIN_BYTES = 64 * 1024
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def is_sparse(info: os.stat_result) -> bool:
    """Whether a regular file's holes make up most of it (by allocated blocks, not its size)."""
    return info.st_size > SPARSE_MIN_BYTES and info.st_blocks * 512 < info.st_size // 2


@dataclass
class Walk:
    """One walk's budgets and what it could not do. :meth:`files` yields the entries that are not
    folders; the caller opens them (and adds to :attr:`unreadable` what it could not read)."""

    max_entries: int = MAX_ENTRIES
    max_seconds: float = MAX_SECONDS
    max_depth: int = MAX_DEPTH
    entries: int = 0
    #: Why the walk stopped before the end (a budget), else "".
    stopped: str = ""
    #: Folders and files that could not be opened, listed or read (shown paths).
    unreadable: list[str] = field(default_factory=list)
    #: Sparse files left unread, and folders past the depth limit (shown paths).
    skipped: list[str] = field(default_factory=list)
    _deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.max_seconds

    @property
    def complete(self) -> bool:
        return not self.stopped and not self.unreadable and not self.skipped

    def stop(self, why: str) -> None:
        self.stopped = self.stopped or why

    def out_of_time(self) -> bool:
        if time.monotonic() > self._deadline:
            self.stop(f"its {self.max_seconds:g}-second time budget ran out")
        return bool(self.stopped)

    def files(
        self, root: Path, label: str, leave_out: Collection[str] = ()
    ) -> Iterator[tuple[str, str, int]]:
        """(``<label>/<path below root>``, name, its folder's descriptor) of every entry under
        ``root`` that is not a folder, in the folders' own order; nothing under a path of
        ``leave_out`` (``<label>/...``). A root that is a link or not a folder yields nothing; a
        root that does not exist neither (nothing to read)."""
        try:
            top = os.open(root, _DIRECTORY_FLAGS)
        except FileNotFoundError:
            return
        except OSError:
            if os.path.islink(root) or (root.exists() and not root.is_dir()):
                return
            self.unreadable.append(f"{shown_path(label)}/")
            return
        # Open folders: (descriptor, its scandir iterator, its shown path, its depth).
        stack: list[tuple[int, Iterator[os.DirEntry[str]], str, int]] = []
        try:
            stack.append((top, os.scandir(top), label, 0))
        except OSError:
            os.close(top)
            self.unreadable.append(f"{shown_path(label)}/")
            return
        try:
            while stack and not self.stopped:
                fd, entries, shown, depth = stack[-1]
                try:
                    entry = next(entries, None)
                except OSError:
                    entry = None
                    self.unreadable.append(f"{shown_path(shown)}/")
                if entry is None:
                    stack.pop()
                    _close(fd, entries)
                    continue
                self.entries += 1
                if self.entries > self.max_entries:
                    self.stop(f"its {self.max_entries}-entry budget was reached")
                    break
                if self.entries % 256 == 0 and self.out_of_time():
                    break
                below = f"{shown}/{entry.name}"
                if below in leave_out:
                    continue
                try:
                    is_folder = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_folder = False
                if not is_folder:
                    yield below, entry.name, fd
                    continue
                if depth + 1 >= self.max_depth:
                    self.skipped.append(f"{shown_path(below)}/ (deeper than {self.max_depth} folders)")
                    continue
                try:
                    child = os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=fd)
                except OSError:
                    if not _is_link(entry):
                        self.unreadable.append(f"{shown_path(below)}/")
                    continue
                try:
                    stack.append((child, os.scandir(child), below, depth + 1))
                except OSError:
                    os.close(child)
                    self.unreadable.append(f"{shown_path(below)}/")
        finally:
            for fd, entries, _, _ in stack:
                _close(fd, entries)

    def open_file(self, name: str, dir_fd: int, shown: str) -> int | None:
        """A read-only descriptor of ``name`` if it is a regular file that is not sparse (never
        through a link, never a FIFO or device, which are not even opened); else None, with a
        regular file that could not be opened recorded in :attr:`unreadable` and a sparse one in
        :attr:`skipped`."""
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            self.unreadable.append(shown_path(shown))
            return None
        if not stat.S_ISREG(before.st_mode):
            return None
        if is_sparse(before):
            self.skipped.append(
                f"{shown_path(shown)} (sparse: {before.st_size} bytes, {before.st_blocks * 512} allocated)"
            )
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError:
            self.unreadable.append(shown_path(shown))
            return None
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            self.unreadable.append(shown_path(shown))
            return None
        return fd


def _is_link(entry: os.DirEntry[str]) -> bool:
    try:
        return stat.S_ISLNK(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False


def _close(fd: int, entries: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(entries, "close", None)
    if close is not None:
        close()
    os.close(fd)


def shown_path(path: str) -> str:
    """A file name as the record shows it: undecodable bytes as ``\\xNN``, every character that
    does not show as itself escaped, in at most :data:`MAX_SHOWN_PATH_CHARS` characters (an agent
    names its files, and its folders up to :data:`MAX_DEPTH` deep)."""
    decoded = os.fsencode(path).decode("utf-8", errors="backslashreplace")
    return printable_within(decoded, MAX_SHOWN_PATH_CHARS)
