"""Secret seeds in the evaluator's own storage: what only the platform can draw from."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path


def secret_seed(folder: Path, name: str) -> int:
    """The seed in ``folder/name``, created once (atomically, owner-only) if absent.

    Evaluators that share storage (replicas on one volume) read the same seed, so their scores
    are comparable; a new evaluator storage draws new problems from the same distribution.
    """
    path = folder / name
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        # Written whole under a private name, then linked into place: a reader never sees half a
        # seed, and of two evaluators creating it at once, one link wins and both read it.
        fd, partial = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(f"{secrets.randbits(63)}\n")
            with contextlib.suppress(FileExistsError):
                os.link(partial, path)
        finally:
            os.unlink(partial)
    return int(path.read_text(encoding="ascii").strip())
