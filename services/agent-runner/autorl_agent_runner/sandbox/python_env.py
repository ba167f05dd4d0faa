"""The folders a Python environment needs at run time, asked of that environment's own interpreter.

The sandbox mounts exactly these (read-only) so that the agent's Python works inside it: the
environment itself, the installation its interpreter comes from, and the source folders of
packages installed in editable mode (their files stay where they were developed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autorl.errors import AutoRLError

#: Run by the environment's interpreter; prints what it imports from, as JSON.
_INTROSPECT = """
import json, os, sys
paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
paths.update(p for p in sys.path if p)
for finder in sys.meta_path:
    mapping = getattr(sys.modules.get(getattr(finder, "__module__", ""), None), "MAPPING", None)
    if isinstance(mapping, dict):
        paths.update(str(p) for p in mapping.values())
print(json.dumps(sorted(paths)))
"""
INTROSPECT_TIMEOUT_S = 60.0


class PythonEnvError(AutoRLError):
    """The agent's Python environment cannot be used."""


@dataclass(frozen=True)
class PythonEnv:
    """A Python environment (a venv or an installation) by its prefix: ``bin/python3`` in it."""

    prefix: Path

    @classmethod
    def current(cls) -> PythonEnv:
        """The environment this process runs in (the platform's own)."""
        return cls(Path(sys.prefix).absolute())

    @classmethod
    def of_interpreter(cls, interpreter: Path) -> PythonEnv:
        """The environment of ``interpreter`` (``PREFIX/bin/python``; the link is not resolved:
        it is what makes a folder a venv)."""
        return cls(interpreter.absolute().parent.parent)

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @property
    def interpreter(self) -> Path:
        return self.bin_dir / "python3"

    def runtime_paths(self) -> list[Path]:
        """The outermost existing folders the environment reads from (links resolved too)."""
        if not os.access(self.interpreter, os.X_OK):
            raise PythonEnvError(
                f"the agents' Python environment {self.prefix} has no {self.interpreter}; "
                "pass the prefix of a virtual environment or a Python installation"
            )
        try:
            done = subprocess.run(
                [str(self.interpreter), "-E", "-s", "-c", _INTROSPECT],
                capture_output=True,
                text=True,
                timeout=INTROSPECT_TIMEOUT_S,
                check=True,
                cwd="/",
            )
            listed = [Path(p) for p in json.loads(done.stdout)]
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            raise PythonEnvError(f"cannot list what {self.interpreter} imports from: {exc}") from exc
        found = {self.prefix}
        for path in listed:
            if path.is_absolute() and path.exists():
                found.add(path.absolute())
                found.add(Path(os.path.realpath(path)))
        return outermost(p for p in found if p != Path("/"))


def outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths that are not inside another one of them."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept
