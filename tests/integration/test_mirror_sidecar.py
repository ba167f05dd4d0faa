"""The mirror sidecar of a custom agent's pod (`autorl agent-runner mirror`) against a real grader:
run_meta.json carries the budget's end as `deadline` and `end_time` null while the agent runs, then
the time its run ended once the pod stops the sidecar."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from autorl.client import GradingClient
from autorl_agent_runner.workspace.layout import Workspace
from autorl_agent_runner.workspace.mirrors import keep_mirrors_fresh
from autorl_grader.main import create_app
from tests.support.grading import make_workspace, register
from tests.support.infra import serve
from tests.support.settings import DeploymentSettings


@pytest.fixture
def served(
    make_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> Iterator[tuple[str, DeploymentSettings]]:
    settings = make_settings(database_url=f"sqlite:///{tmp_path / 'autorl.db'}", submit_wait_s=0.0)
    with serve(create_app(settings, reconcile=False)) as grader:
        yield grader.url, settings


def read_meta(workspace: Workspace, *, until: Callable[[dict[str, object]], bool]) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if workspace.run_meta.exists():
            meta: dict[str, object] = json.loads(workspace.run_meta.read_text())
            if until(meta):
                return meta
        time.sleep(0.05)
    raise AssertionError(f"run_meta.json never became as expected: {workspace.run_meta.read_text()}")


def test_run_meta_gets_its_end_time_when_the_run_ends(
    served: tuple[str, DeploymentSettings], tiny_base_model: Path, tmp_path: Path
) -> None:
    url, settings = served
    with httpx.Client(base_url=url, timeout=30) as admin:
        experiment = register(admin, settings, tiny_base_model, make_workspace(tmp_path))
        budget = admin.get(f"{experiment.url_path}/time").json()
    workspace = Workspace(experiment.workspace, "model")
    stop = threading.Event()
    with GradingClient(url + experiment.url_path) as client:
        sidecar = threading.Thread(
            target=keep_mirrors_fresh, args=(workspace, client, stop), kwargs={"interval_s": 0.1}
        )
        sidecar.start()
        try:
            running = read_meta(workspace, until=lambda meta: meta.get("deadline") is not None)
            assert running["deadline"] == budget["end_time"] == budget["deadline"]
            assert running["start_time"] == budget["start_time"] and running["end_time"] is None
        finally:
            before_stop = time.time()
            stop.set()
            sidecar.join(timeout=30)
    ended = json.loads(workspace.run_meta.read_text())
    assert ended["deadline"] == budget["end_time"]
    assert isinstance(ended["end_time"], float) and before_stop <= ended["end_time"] <= time.time()
