"""Helpers to stand up a grader and an experiment workspace in tests."""

from __future__ import annotations

import secrets
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.support.settings import DeploymentSettings


@dataclass
class RegisteredExperiment:
    name: str
    token: str
    url_path: str  # /a/<token>
    workspace: Path
    output_dir: Path
    view: dict[str, Any]

    @property
    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def admin_headers(settings: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {settings.admin_token_value}"}


def make_workspace(root: Path) -> Path:
    workspace = root / f"ws-{uuid.uuid4().hex[:8]}"
    (workspace / "output").mkdir(parents=True)
    return workspace


def register(
    client: TestClient,
    settings: Any,
    base_model_dir: Path,
    workspace: Path,
    *,
    start: bool = True,
    **fields: Any,
) -> RegisteredExperiment:
    """Register an experiment and (unless `start=False`) start its budget, as the platform does
    before its agent runs: submissions are accepted only inside the budget."""
    body = {
        "name": f"exp-{uuid.uuid4().hex[:10]}",
        "task": "gsm8k",
        "model": f"local:{base_model_dir.name}-{uuid.uuid4().hex[:6]}",
        "timeout_s": 3600,
        "workspace": str(workspace),
        "base_model_dir": str(base_model_dir),
        **fields,
    }
    response = client.post("/v1/experiments", json=body, headers=admin_headers(settings))
    assert response.status_code == 201, response.text
    view = response.json()
    if start:
        path = f"/v1/experiments/{view['name']}/start"
        started = client.post(path, json={}, headers=admin_headers(settings))
        assert started.status_code == 200, started.text
    return RegisteredExperiment(
        name=view["name"],
        token=view["token"],
        url_path=f"/a/{view['token']}",
        workspace=workspace,
        output_dir=workspace / "output",
        view=view,
    )


def copy_model(source: Path, target: Path, *, unique: bool = False) -> Path:
    """Copy a model folder. `unique` changes the lowest bits of the first weight (only the weights of
    a submission are evaluated and fingerprinted), so that the copy is a model of its own: identical
    weights would reuse an earlier score."""
    shutil.copytree(source, target)
    if unique:
        make_unique(target)
    return target


def make_unique(folder: Path) -> None:
    """Give the model in ``folder`` weights no other model has: the first weight's low byte is
    replaced by a random one (a change far below what decoding notices on a tiny model)."""
    weights = min(folder.glob("*.safetensors"))
    with weights.open("r+b") as handle:
        data_start = 8 + int.from_bytes(handle.read(8), "little")
        handle.seek(data_start)
        old = handle.read(1)
        handle.seek(data_start)
        handle.write(bytes([(old[0] ^ secrets.randbelow(255) + 1) & 0xFF]))


def evaluating_settings(
    make_settings: Callable[..., DeploymentSettings], database_url: str, *, limit: int, max_new_tokens: int
) -> DeploymentSettings:
    """A grader's and its workers' settings that evaluate the tiny model for real (``hf``) on the
    first ``limit`` problems, and answer submits at once (``submit_wait_s`` 0)."""
    return make_settings(
        database_url=database_url,
        eval_backend="hf",
        eval_limit=limit,
        eval_max_new_tokens=max_new_tokens,
        submit_wait_s=0.0,
    )
