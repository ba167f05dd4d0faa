"""Layouts a hostile agent leaves in its workspace for the checks after it has ended."""

from __future__ import annotations

import os
from pathlib import Path


def nest_past_path_max(folder: Path, name: str, text: str, *, levels: int = 20) -> None:
    """``text`` in a file ``name`` at the bottom of ``levels`` folders of 242-character names below
    ``folder``: with 20, a path past PATH_MAX (4,096), made relative to each folder's descriptor."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(levels):
            below = f"{level:02d}" + "y" * 240
            os.mkdir(below, dir_fd=fd)
            inner = os.open(below, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as handle:
            handle.write(text)
    finally:
        os.close(fd)
