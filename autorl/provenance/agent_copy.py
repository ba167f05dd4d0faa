"""An ended agent's text files, copied out of its workspace for the evaluators to read.

On a cluster the evaluators hold the test split and mount no workspace; the grader reads the
workspace (it snapshots submissions from it) and writes the snapshot volume, which the evaluators
read and the agent cannot reach. So once the agent has ended, the grader copies the text files of
its ``code/`` and ``output/``, and of the rest of its workspace (an agent's pod may write anywhere
in it but its read-only mounts), into ``provenance-<experiment id>/`` there, and an evaluator reads
the copy for the test questions (:mod:`autorl.provenance.overlap`, the rule of ``autorl run``).

The copy follows the scan's own rules, so that it holds what the scan would read and no more: no
link is followed (a root that is one is not copied), only regular files are opened (never a FIFO or
a device), weights (recognised by their content, :func:`autorl.provenance.file_text.is_weights`)
are left out, of a PyTorch checkpoint only its pickle is copied
(:func:`autorl.provenance.file_text.pytorch_pickles`; both named in the manifest's ``weights``),
every other file is copied as it is (the evaluator opens its containers), and the
per-file, total and file-count caps of :mod:`autorl.provenance.overlap` bound what is written. What
a cap cut, and each regular file the grader may not read (an agent that took the group's read
permission away), is named in the folder's manifest (:data:`MANIFEST`), which the evaluator's
record repeats.
File names are the agent's, kept as bytes; the manifest shows them as valid UTF-8 text.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autorl.provenance.agent_area import left_out
from autorl.provenance.file_text import is_weights, pytorch_pickles
from autorl.provenance.overlap import (
    CHUNK_BYTES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_BYTES,
    listed,
)
from autorl.provenance.walk import MAX_ENTRIES, Walk, shown_path

#: The copy's folder below it: one folder per root, named by its label (``code``, ``output``).
FILES = "files"
#: Seconds the copy may take: it runs inside an admin request, under the controller's 30 s timeout.
COPY_SECONDS = 20.0
#: Entries the copy looks at, of every kind (:data:`autorl.provenance.walk.MAX_ENTRIES`).
COPY_ENTRIES = MAX_ENTRIES
#: Written last: the copy is complete (what it holds, what the caps cut, the final's snapshot).
MANIFEST = "copied.json"


def provenance_folder(experiment_id: int) -> str:
    """The folder in the snapshot volume of one experiment's copy (and its final's snapshot)."""
    return f"provenance-{experiment_id}"


@dataclass(frozen=True)
class CopiedFiles:
    """What :func:`copy_text_files` wrote."""

    files: int
    bytes: int
    #: Files copied only up to the per-file cap, or the one where the total cap ran out.
    truncated: tuple[str, ...]
    #: A budget (total bytes, files, entries, time) ended the copy before every file was read.
    stopped_early: bool
    #: Files and folders that could not be opened, listed, read or written: not copied, so not checked.
    unreadable: tuple[str, ...] = ()
    #: Why the copy stopped early, else "".
    stop_reason: str = ""
    #: Sparse files and folders past the depth limit, not copied.
    skipped: tuple[str, ...] = ()
    #: Entries the walk looked at.
    entries: int = 0
    #: Files recognised as weights and left out, and PyTorch checkpoints of which only the pickle
    #: was copied: named, not unverified.
    weights: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not (self.stopped_early or self.truncated or self.unreadable or self.skipped)

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "entries": self.entries,
            "complete": self.complete,
            "truncated": list(self.truncated),
            "stopped_early": self.stopped_early,
            "stop_reason": self.stop_reason,
            "unreadable": list(self.unreadable),
            "skipped": list(self.skipped),
            "weights": list(self.weights),
        }


def copy_unverified(copied: Mapping[str, Any] | None) -> str:
    """Why a copy (its manifest's record, :meth:`CopiedFiles.to_json`) is not complete, else ""."""
    if not isinstance(copied, Mapping):
        return "the copy's record is missing"
    reasons = []
    if copied.get("stopped_early"):
        reasons.append(f"the copy stopped early ({copied.get('stop_reason') or 'a cap was reached'})")
    for key, what in (
        ("truncated", "file(s) copied only in part"),
        ("unreadable", "file(s) or folder(s) could not be copied"),
        ("skipped", "sparse file(s) or too-deep folder(s) not copied"),
    ):
        if copied.get(key):
            reasons.append(f"{len(copied[key])} {what}")
    return "; ".join(reasons)


def copy_text_files(
    roots: Mapping[str, Path],
    dest: Path,
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_files: int = MAX_FILES,
    leave_out: Collection[Path] = (),
    walk: Walk | None = None,
) -> CopiedFiles:
    """Copy the text files under each of ``roots`` (label → folder) to ``dest/<label>/`` (``dest``
    must not exist), by the scan's rules and within its budgets. A root inside another (``code`` in
    the workspace) is copied once, under its own label; nothing under ``leave_out`` is copied.
    Nothing the agent laid out makes it raise: what one file or folder cannot have (a name too
    long for a path, a permission) is recorded and the copy goes on; targets are written relative
    to their folder's descriptor, so a path of any length is copied."""
    for label in roots:
        if label in ("", ".", "..") or "/" in label:
            raise ValueError(f"a root's label must be a plain name, not {label!r}")
    walk = walk if walk is not None else Walk(max_entries=COPY_ENTRIES, max_seconds=COPY_SECONDS)
    dest.mkdir(mode=0o755)
    files = written = 0
    truncated: list[str] = []
    weights: list[str] = []
    for label, root in roots.items():
        for below, name, dir_fd in walk.files(root, label, leave_out=left_out(roots, label, leave_out)):
            if files >= max_files or written >= max_total_bytes:
                walk.stop(
                    f"its {max_files}-file cap was reached"
                    if files >= max_files
                    else f"its {max_total_bytes}-byte cap was reached"
                )
                break
            fd = walk.open_file(name, dir_fd, below)
            if fd is None:
                continue
            limit = min(max_file_bytes, max_total_bytes - written)
            try:
                if is_weights(fd):
                    weights.append(shown_path(below))
                    continue
                pickles = pytorch_pickles(fd)
                if pickles is not None:
                    weights.append(shown_path(below))
                read, more = _copy(
                    pickles.read if pickles else functools.partial(os.read, fd), dest, below, limit
                )
            except Exception:  # one file's error (a name too long, a permission): named, the copy goes on
                walk.unreadable.append(shown_path(below))
                continue
            finally:
                os.close(fd)
            files += 1
            written += read
            if more:
                truncated.append(shown_path(below))
                if limit < max_file_bytes:
                    walk.stop(f"its {max_total_bytes}-byte cap was reached")
            if walk.stopped or walk.out_of_time():
                break
        if walk.stopped:
            break
    return CopiedFiles(
        files=files,
        bytes=written,
        truncated=listed(truncated),
        stopped_early=bool(walk.stopped),
        unreadable=listed(walk.unreadable),
        stop_reason=walk.stopped,
        skipped=listed(walk.skipped),
        entries=walk.entries,
        weights=listed(weights),
    )


def _copy(read: Callable[[int], bytes], dest: Path, below: str, limit: int) -> tuple[int, bool]:
    """Copy what ``read`` gives (a file's bytes, a checkpoint's pickle) to ``dest/below``, each
    folder made and opened relative to its parent's descriptor (no path longer than one name);
    (bytes copied, whether bytes remain past ``limit``)."""
    *folders, name = below.split("/")
    parent = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=parent)
            inner = os.open(
                folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
            )
            os.close(parent)
            parent = inner
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(name, flags, 0o644, dir_fd=parent)
    finally:
        os.close(parent)
    copied = 0
    try:
        while copied < limit:
            chunk = read(min(CHUNK_BYTES, limit - copied))
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
            copied += len(chunk)
    finally:
        os.close(out)
    return copied, copied == limit and bool(read(1))


def stage_copy(
    roots: Mapping[str, Path], folder: Path, *, leave_out: Collection[Path] = ()
) -> tuple[Path, CopiedFiles]:
    """A fresh staging folder beside ``folder`` holding the copy of ``roots`` under :data:`FILES`
    and its manifest; the caller adds the final's snapshot, then :func:`publish` s it."""
    staging = folder.with_name(f".{folder.name}-{uuid.uuid4().hex[:12]}")
    staging.mkdir(mode=0o755, parents=True)
    try:
        copied = copy_text_files(roots, staging / FILES, leave_out=leave_out)
    except OSError as exc:  # not one file's (those are recorded): the copy as a whole
        shutil.rmtree(staging / FILES, ignore_errors=True)
        copied = CopiedFiles(0, 0, (), True, stop_reason=f"the copy failed: {exc.strerror or exc}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging, copied


def publish(staging: Path, folder: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest into ``staging`` and put it in ``folder``'s place (an earlier, incomplete
    copy there is removed)."""
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    if folder.exists() or folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The complete copy's manifest; None while there is none (not copied yet, or being copied)."""
    try:
        loaded = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None
