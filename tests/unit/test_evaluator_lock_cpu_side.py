"""docker/lock_cpu_side.py: the share of docker/evaluator-worker.lock that both evaluator images
install into OpenCompass's environment.

The lock itself resolving is tests/integration/test_opencompass_gpu_config.py's; the cpu image built
from this share runs OpenCompass (tests/containers/test_images.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.lock_tool import load_lock_tool

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "docker" / "evaluator-worker.lock"


def test_lock_pins_datasets_3_and_its_cpu_side_drops_cuda() -> None:
    tool = load_lock_tool()
    lock = LOCK.read_text()
    pins = {name: version for name, (version, _parents, _text) in tool.parse(lock).items()}
    # datasets 2 fails to import with pyarrow 21 and later (no pyarrow.PyExtensionType).
    assert pins["datasets"].startswith("3."), pins["datasets"]
    assert int(pins["pyarrow"].split(".")[0]) >= 21
    # vLLM has an environment of its own (docker/evaluator-vllm.lock): OpenCompass's pins numpy 1.
    assert "vllm" not in pins and pins["numpy"].startswith("1.")
    side = tool.cpu_side(lock)
    assert {"opencompass", "transformers", "datasets", "pyarrow", "pydantic", "sqlalchemy", "rq"} <= set(side)
    assert not {"torch", "triton"} & set(side) and {"torch", "triton"} <= set(pins)
    assert not [name for name in side if tool.is_cuda(name)]
    assert all("--hash=sha256:" in text for text in side.values())
    # torch's own dependencies are resolved with the CPU torch, for the image's Python; what
    # OpenCompass needs too stays in.
    assert "sympy" not in side and "networkx" not in side and "numpy" in side


def test_constraints_output_is_the_cpu_sides_pins() -> None:
    tool = load_lock_tool()
    pins = {name: version for name, (version, _parents, _text) in tool.parse(LOCK.read_text()).items()}
    result = subprocess.run(
        [sys.executable, str(REPO / "docker" / "lock_cpu_side.py"), "--constraints", str(LOCK)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines and all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*==\S+", line) for line in lines), lines[:5]
    assert {line.split("==")[0]: line.split("==")[1] for line in lines} == {
        name: pins[name] for name in tool.cpu_side(LOCK.read_text())
    }


def test_lock_tool_refuses_a_lock_without_hashes(tmp_path: Path) -> None:
    tool = load_lock_tool()
    with pytest.raises(ValueError, match="hashes"):
        tool.parse("opencompass==0.5.2\n    # via -r docker/evaluator-worker.in\n")
    lock = tmp_path / "no-opencompass.lock"
    lock.write_text("rich==15.0.0 \\\n    --hash=sha256:00\n    # via -r docker/evaluator-worker.in\n")
    result = subprocess.run(
        [sys.executable, str(REPO / "docker" / "lock_cpu_side.py"), str(lock)], capture_output=True, text=True
    )
    assert result.returncode == 1 and "no opencompass pin" in result.stderr


def test_every_package_the_worker_declares_is_in_both_evaluator_images() -> None:
    # Our packages go into the images without dependencies, so the lock alone must bring every
    # distribution the core and the worker declare, at a version they accept (its CPU side, which
    # both variants install). A dependency added to a pyproject.toml but not to
    # docker/evaluator-worker.in fails here, not in a running worker.
    tool = load_lock_tool()
    lock = LOCK.read_text()
    pins = {name: version for name, (version, _parents, _text) in tool.parse(lock).items()}
    cpu_side = set(tool.cpu_side(lock))
    declared = [
        Requirement(text)
        for pyproject in (REPO / "pyproject.toml", REPO / "services" / "evaluator-worker" / "pyproject.toml")
        for text in tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    ]
    wrong = []
    for requirement in declared:
        name = canonicalize_name(requirement.name)
        if name == "autorl":
            continue
        if name not in cpu_side or not requirement.specifier.contains(pins[name], prereleases=True):
            wrong.append(f"{requirement} (lock: {pins.get(name, 'absent')}, cpu side: {name in cpu_side})")
    assert not wrong, f"not in the evaluator images as declared: {wrong}"
