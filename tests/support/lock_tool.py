"""docker/lock_cpu_side.py, loaded as a module (it is a script of docker/, not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "docker" / "evaluator-worker.lock"


def load_lock_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lock_cpu_side", REPO / "docker" / "lock_cpu_side.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
