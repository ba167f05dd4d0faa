"""Fixtures of the snapshot tests (test_snapshot*.py): a workspace with an output folder, a valid
checkpoint in it (a copy of the tiny base model), and a snapshot taken or refused into evaluator
storage of the test's own."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.checkpoints.snapshot import Snapshot
from tests.support.snapshots import refuser, taker


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "output").mkdir(parents=True)
    return root


@pytest.fixture
def snapshots(tmp_path: Path) -> Path:
    return tmp_path / "snapshots"


@pytest.fixture
def checkpoint(workspace: Path, tiny_base_model: Path) -> Path:
    """A valid submission: a copy of the base model under output/."""
    return Path(shutil.copytree(tiny_base_model, workspace / "output" / "ckpt"))


@pytest.fixture
def take(workspace: Path, tiny_base_model: Path, snapshots: Path) -> Callable[..., Snapshot]:
    return taker(workspace, tiny_base_model, snapshots)


@pytest.fixture
def refusal(take: Callable[..., Snapshot], snapshots: Path) -> Callable[..., str]:
    return refuser(take, snapshots)
