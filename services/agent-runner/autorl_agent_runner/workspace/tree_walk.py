"""Walking a folder tree the agent wrote: without recursion, without following links.

Python's own walks recurse once per level (``os.walk``, ``shutil.rmtree`` before 3.12): a chain
of folders a few thousand deep raises ``RecursionError``. This walk holds one descriptor at a
time. Each folder is opened relative to its parent with ``O_NOFOLLOW`` (a link is an entry, never
a way elsewhere) and checked to be the folder that was listed; the walk climbs back through
``..`` only after checking that it reaches the very folder it left (device and inode), so a
folder moved while the walk is inside it ends the walk (:class:`TreeChanged`) instead of taking
it somewhere else. It stays on the tree's own file system.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: Called for every entry below the root, before a folder's content: (its folder's descriptor,
#: its name there, its own ``lstat``).
Visit = Callable[[int, str, os.stat_result], None]
#: Called for a folder after its content: (its parent's descriptor, its name there).
Leave = Callable[[int, str], None]


class TreeChanged(OSError):
    """A folder was moved while the walk was inside it: the walk stops where it is."""


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


@dataclass
class _Level:
    """A folder the walk is inside of: who it is, and its entries not yet visited."""

    identity: tuple[int, int]
    pending: list[str]
    #: Its name in its parent (empty for the root).
    name: str = ""


def walk_fd(root_fd: int, visit: Visit, leave: Leave | None = None) -> None:
    """Visit everything under the open folder ``root_fd`` (which stays open and unmoved).

    An entry that vanishes mid-walk is skipped; a folder that cannot be opened is visited but not
    entered. Raises :class:`TreeChanged` when a folder was moved while the walk was inside it.
    """
    fd = os.dup(root_fd)
    root_info = os.fstat(fd)
    level = _Level(_identity(root_info), os.listdir(fd))
    stack: list[_Level] = []
    try:
        while True:
            if level.pending:
                name = level.pending.pop()
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                visit(fd, name, info)
                if not stat.S_ISDIR(info.st_mode) or info.st_dev != root_info.st_dev:
                    continue
                child = _open_dir(fd, name, _identity(info))
                if child is None:
                    continue
                stack.append(level)
                os.close(fd)
                fd = child
                level = _Level(_identity(info), os.listdir(fd), name)
                continue
            if not stack:
                return
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            left, level = level, stack.pop()
            if _identity(os.fstat(fd)) != level.identity:
                raise TreeChanged(errno.ESTALE, f"a folder was moved during the walk (at {left.name!r})")
            if leave is not None:
                leave(fd, left.name)
    finally:
        os.close(fd)


def _open_dir(parent_fd: int, name: str, identity: tuple[int, int]) -> int | None:
    """The folder ``name`` of ``parent_fd`` if it is still the one that was listed."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None
    if _identity(os.fstat(fd)) != identity:
        os.close(fd)
        return None
    return fd


def open_dir(path: Path) -> int:
    """``path`` opened as a folder for :func:`walk_fd` (its last part must not be a link)."""
    return os.open(path, _DIR_FLAGS)


def chown_tree(root: Path, uid: int, gid: int) -> int:
    """Give ``root`` and everything under it to ``uid``:``gid``, links themselves and not what they
    name; returns how many entries could not be given."""
    failed = 0

    def give(dir_fd: int, name: str, info: os.stat_result) -> None:
        nonlocal failed
        if (info.st_uid, info.st_gid) == (uid, gid):
            return
        try:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            failed += 1

    fd = open_dir(root)
    try:
        os.fchown(fd, uid, gid)
        walk_fd(fd, give)
    finally:
        os.close(fd)
    return failed


def remove_entry(folder: Path, name: str) -> None:
    """Remove ``folder/name`` whatever it is (a folder with all it holds included), following no
    link. Raises ``OSError`` when something in it cannot be removed."""
    parent = open_dir(folder)
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        _make_enterable(parent, name, info)
        fd = _open_dir(parent, name, _identity(info))
        if fd is None:
            raise TreeChanged(errno.ESTALE, f"{name!r} changed while being removed")
        try:
            walk_fd(fd, _remove_visit, _remove_leave)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def _remove_visit(dir_fd: int, name: str, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        _make_enterable(dir_fd, name, info)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _remove_leave(dir_fd: int, name: str) -> None:
    os.rmdir(name, dir_fd=dir_fd)


def _make_enterable(dir_fd: int, name: str, info: os.stat_result) -> None:
    """A folder of this user's that it may not list or change (mode 0500, 0): make it 0700, through
    a path descriptor, so that a link put there meanwhile is not followed. Root needs no mode."""
    if os.geteuid() == 0 or info.st_uid != os.geteuid() or info.st_mode & 0o700 == 0o700:
        return
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    finally:
        os.close(fd)
