"""The CPU OpenCompass environment (.venv-opencompass, what the tests and local runs evaluate with)
holds the evaluator image lock's versions, and OpenCompass starts from it.

The lock (docker/evaluator-worker.lock) is what the GPU evaluator image installs; its CPU side
(docker/lock_cpu_side.py: the lock without vLLM and the CUDA packages) is what `make setup` installs
.venv-opencompass under. A version that differs here would mean that scores measured by the tests
come from another OpenCompass stack than the cluster's.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.support.lock_tool import LOCK, load_lock_tool
from tests.support.opencompass_models import OC_PYTHON

pytestmark = pytest.mark.requires(OC_PYTHON.exists(), reason="needs .venv-opencompass (make setup)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_cpu_pins() -> dict[str, str]:
    side = load_lock_tool().cpu_side(LOCK.read_text())
    pins = {name: text.split(" ", 1)[0].split("==", 1)[1] for name, text in side.items()}
    return {name: version.rstrip("\\\n").strip() for name, version in pins.items()}


def test_the_environment_holds_the_locks_opencompass_side_and_runs_opencompass() -> None:
    listed = subprocess.run(
        [str(OC_PYTHON), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    installed = {_normal(p["name"]): p["version"] for p in json.loads(listed.stdout)}
    locked = lock_cpu_pins()
    assert {"opencompass", "datasets", "pyarrow", "transformers"} <= set(locked) & set(installed)
    differ = {n: (locked[n], installed[n]) for n in set(locked) & set(installed) if locked[n] != installed[n]}
    assert differ == {}, "make setup installs .venv-opencompass under the lock's pins (lock, installed)"
    command = [str(OC_PYTHON.parent / "opencompass"), "--help"]
    started = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert started.returncode == 0, started.stderr[-2000:]
    assert "usage" in started.stdout.lower()
