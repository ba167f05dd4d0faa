"""Keep what an agent writes readable by the platform's group (the grader reads submissions so).

On a cluster each experiment's agent runs as its own user and its workspace is mode 2750 with the
platform's group (:mod:`autorl_agent_runner.workspace.ownership`); the grader reads checkpoints through that
group. Common writers ignore the umask and create files 0600 — safetensors (so ``save_pretrained``'s
weights), ``tempfile.mkstemp`` and every atomic writer built on it, ``tempfile.mkdtemp`` (0700) — so
the grader could not read a checkpoint saved the usual way.

A sidecar of the agent's pod (``autorl agent-runner group-read`` beside a built-in agent, ``mirror
--group-readable`` beside a custom image) walks the workspace every second and adds group-read (and
group-search on folders) where it is missing. It runs as the agent's user, which alone may change the
modes of the agent's files, with the platform's group as its own: the kernel drops a folder's setgid
bit when a user outside the folder's group changes its mode, and files saved there later would get
the agent's group, out of the grader's reach for good. Outside that group, the walk leaves such
folders as they are. (Hence not the agent runner itself: the agent it starts must not have the
platform's group, and a restricted pod cannot drop one.)

Nothing else changes: no bit is added for other users, never group-write, and the only bits removed
are a file's set-user-id and set-group-id (the keeper, in the platform's group, must never be the
one that leaves a set-group-id program of that group behind). The walk
holds a descriptor of each folder and reaches entries only relative to it, never through a symbolic
link; it changes only plain files and folders that the current user owns, on the workspace's own
file system; it skips links, fifos, sockets and devices, another user's file (a hard link to it
included) and anything that vanishes mid-walk. A file that is the agent's own anyway is all it can
ever change, so an agent gains nothing by pointing it elsewhere. Past :data:`MAX_DEPTH` nested
folders it stops descending; a tree that takes long to walk is walked less often
(:data:`BUSY_FACTOR`): the walks take at most a fifth of a core.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("autorl.agent_runner.group_read")

#: Seconds between two walks of the workspace (at least; see BUSY_FACTOR).
GROUP_READ_INTERVAL_S = 1.0
#: A walk that took T seconds is followed by a pause of at least BUSY_FACTOR × T.
BUSY_FACTOR = 4.0
#: Folders nested deeper than this are not walked (no checkpoint is this deep).
MAX_DEPTH = 64
FILE_BITS = stat.S_IRGRP
FOLDER_BITS = stat.S_IRGRP | stat.S_IXGRP
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class WalkResult:
    fixed: int = 0
    seen: int = 0
    #: Entries left as they were because they vanished, changed or refused (any OSError).
    skipped: int = 0


def make_group_readable(root: Path) -> WalkResult:
    """One walk of ``root``: add group-read (and group-search on folders) where it is missing.

    An entry that vanishes, changes or refuses while walked (any ``OSError``) is skipped; the next
    walk tries it again. Nothing here raises for what an agent can put in its workspace.
    """
    result = WalkResult()
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        _skipped(str(root), exc, result)
        return result
    try:
        info = os.fstat(fd)
        _fix(fd, info, str(root), result)
        _walk(fd, info.st_dev, str(root), 1, result)
    except OSError as exc:
        _skipped(str(root), exc, result)
    finally:
        os.close(fd)
    return result


def _skipped(path: str, exc: OSError, result: WalkResult) -> None:
    result.skipped += 1
    log.debug("event=group_read_skipped path=%s reason=%s", path, exc.strerror or type(exc).__name__)


def _walk(folder: int, device: int, shown: str, depth: int, result: WalkResult) -> None:
    """Fix the entries of ``folder`` one by one as they are listed (a folder of millions of entries
    costs no memory) and descend into its folders."""
    uid = os.geteuid()
    with os.scandir(folder) as entries:
        for entry in entries:
            result.seen += 1
            path = f"{shown}/{entry.name}"
            try:
                info = entry.stat(follow_symlinks=False)
                is_dir = stat.S_ISDIR(info.st_mode)
                # Only this user's plain files and folders, on the workspace's own file system.
                if info.st_uid != uid or info.st_dev != device or not (is_dir or stat.S_ISREG(info.st_mode)):
                    continue
                if is_dir and depth < MAX_DEPTH:
                    _descend(folder, entry.name, info, device, path, depth, result)
                elif _missing(info):
                    _fix_entry(folder, entry.name, info, path, result)
            except OSError as exc:
                _skipped(path, exc, result)


def _descend(
    folder: int, name: str, seen: os.stat_result, device: int, path: str, depth: int, result: WalkResult
) -> None:
    if _missing(seen):
        # The folder's own bits first (mkdtemp's 0700 gives the group nothing), through a descriptor
        # that cannot be a link.
        _fix_entry(folder, name, seen, path, result)
    child = os.open(name, _DIR_FLAGS, dir_fd=folder)
    try:
        info = os.fstat(child)
        if (info.st_ino, info.st_dev) == (seen.st_ino, seen.st_dev):
            _walk(child, device, path, depth + 1, result)
    finally:
        os.close(child)


def _missing(info: os.stat_result) -> bool:
    wanted = FOLDER_BITS if stat.S_ISDIR(info.st_mode) else FILE_BITS
    return info.st_mode & wanted != wanted


def _fix_entry(folder: int, name: str, seen: os.stat_result, path: str, result: WalkResult) -> None:
    """Add the bits to ``name`` in ``folder`` if it is still the entry that was listed."""
    fd = os.open(name, _PATH_FLAGS, dir_fd=folder)
    try:
        info = os.fstat(fd)
        # O_NOFOLLOW|O_PATH opens a link itself: its type (and the inode) must still be the listed one.
        if (info.st_ino, info.st_dev, stat.S_IFMT(info.st_mode)) == (
            seen.st_ino,
            seen.st_dev,
            stat.S_IFMT(seen.st_mode),
        ):
            _fix(fd, info, path, result)
    finally:
        os.close(fd)


def _fix(fd: int, info: os.stat_result, path: str, result: WalkResult) -> None:
    """Add the group bits to the inode ``fd`` holds (a plain file or folder this user owns)."""
    if info.st_uid != os.geteuid() or not _missing(info):
        return
    if stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISGID and not _in_group(info.st_gid):
        # The kernel would drop the setgid bit (the caller is not in the folder's group), and what is
        # saved there later would get the agent's group, for good: leave the folder as it is.
        log.debug("event=group_read_skipped path=%s reason=setgid_folder_of_another_group", path)
        return
    if stat.S_ISDIR(info.st_mode):
        mode = stat.S_IMODE(info.st_mode) | FOLDER_BITS
    else:
        # Never a set-id program of the platform's group kept by the keeper, which is in that group.
        mode = stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID) | FILE_BITS
    # fchmod refuses an O_PATH descriptor; its /proc link names exactly the inode it holds.
    os.chmod(f"/proc/self/fd/{fd}", mode)
    result.fixed += 1
    log.debug("event=group_read_fixed path=%s mode=%o", path, mode)


def _in_group(gid: int) -> bool:
    return gid == os.getegid() or gid in os.getgroups()


class GroupReadKeeper:
    """A thread that walks ``root`` (:func:`make_group_readable`) until stopped, then once more."""

    def __init__(self, root: Path, *, interval_s: float = GROUP_READ_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s:g}")
        self.root = root
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-read", daemon=True)

    def start(self) -> GroupReadKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop walking after one last walk (what the agent saved at the end is readable too)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            started = time.monotonic()
            make_group_readable(self.root)
            if stopping:
                return
            took = time.monotonic() - started
            self._stop.wait(max(self.interval_s, BUSY_FACTOR * took))
