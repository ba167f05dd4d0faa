"""The evaluators' data step on a fresh install: the test split reaches the evaluators' own storage
before the first baseline, from the configured source, and no agent pod can mount it.

The chart is rendered by Helm; the evaluator pod's `test-data` init container runs as a real process
with its rendered command and environment, its volumes mapped onto temporary folders (no hub here:
the folder and URL sources serve the GSM8K-format fixture of tests/data). The worker's container
then loads the split offline from the same volume, as its first evaluation does.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from autorl.errors import ConfigurationError
from autorl.experiment import ExperimentSpec
from autorl.settings import HomeSettings
from autorl.tasks import get_task
from autorl.tasks.base import read_problems
from autorl_controller.operator.manifests import ExperimentRef, build_agent_job, build_prepare_job
from autorl_evaluator.eval_data import provide
from tests.integration.test_chart import IMAGES, NAMESPACE, RELEASE, merge, of_kind, pod_specs, render
from tests.integration.test_chart_security import controller_settings

AUTORL = str(Path(sys.executable).parent / "autorl")
FIXTURE_DATA = Path(__file__).resolve().parents[1] / "data"
DATA_CLAIM = "gsm8k-data"
FOLDER_ON_CLAIM: dict[str, Any] = {
    "evaluator": {"testData": {"source": "folder", "existingClaim": DATA_CLAIM, "folder": "/"}}
}
BUILTIN_AGENT = ExperimentSpec.model_validate(
    {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B", "agent": {"builtin": "example_grpo"}}
)
CUSTOM_AGENT = ExperimentSpec.model_validate(
    {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B", "agent": {"image": "registry.example/agent:1"}}
)


def evaluator_pod(documents: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-evaluator"]["spec"]["template"][
        "spec"
    ]
    return pod


def mount_paths(container: dict[str, Any]) -> dict[str, str]:
    """Volume name → mount path of one container."""
    return {mount["name"]: mount["mountPath"] for mount in container.get("volumeMounts", [])}


def run_data_step(
    documents: list[dict[str, Any]], volumes: dict[str, Path], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """The init container's rendered command and environment, its volumes mapped onto ``volumes``."""
    (step,) = evaluator_pod(documents)["initContainers"]
    assert step["name"] == "test-data"
    mounts = mount_paths(step)
    assert set(mounts) == set(volumes), "every volume of the step is mapped"

    def local(value: str) -> str:
        for name, path in mounts.items():
            if value == path or value.startswith(path.rstrip("/") + "/"):
                return str(volumes[name]) + value[len(path.rstrip("/")) :]
        return value

    assert all("valueFrom" not in e for e in step["env"])  # no hub token configured here
    env = {e["name"]: local(e["value"]) for e in step["env"]}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AUTORL_", "HF_"))}, **env}
    env["HF_HUB_OFFLINE"] = env["HF_DATASETS_OFFLINE"] = "1"  # nothing may come from the hub here
    command = [AUTORL if part == "autorl" else part for part in step["command"]]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def first_baseline_problems(documents: list[dict[str, Any]], volumes: dict[str, Path]) -> int:
    """The worker's container loads the split as its first evaluation does: offline, no source."""
    pod = evaluator_pod(documents)
    worker = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert "AUTORL_DATA_SOURCE_DIR" not in env and "HF_TOKEN" not in env
    eval_dir = env["AUTORL_EVAL_DIR"]
    assert mount_paths(worker)["eval"] == eval_dir
    (step,) = pod["initContainers"]
    assert {e["name"]: e["value"] for e in step["env"]}["AUTORL_EVAL_DIR"] == mount_paths(step)["eval"]
    problems = get_task("gsm8k").load_test_problems(volumes["eval"] / "data", source_dir=None)
    return len(problems)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_a_fresh_install_caches_the_split_from_a_claim_before_the_first_baseline(
    tmp_path: Path, offline: None
) -> None:
    documents = render(merge(IMAGES, FOLDER_ON_CLAIM))
    volumes = {"eval": tmp_path / "eval", "tmp": tmp_path / "tmp", "test-data-source": FIXTURE_DATA}
    for path in (volumes["eval"], volumes["tmp"]):
        path.mkdir()
    # Before the data step the worker has nothing, and without the hub it cannot fetch the split.
    with pytest.raises(Exception, match="AUTORL_DATA_SOURCE_DIR"):
        first_baseline_problems(documents, volumes)
    step = run_data_step(documents, volumes, tmp_path)
    assert step.returncode == 0, step.stderr
    expected = read_problems(FIXTURE_DATA / "gsm8k" / "test.jsonl")
    assert read_problems(volumes["eval"] / "data" / "gsm8k" / "test.jsonl") == expected
    assert f"problems={len(expected)}" in step.stderr
    assert not any(problem.question[:40] in step.stdout + step.stderr for problem in expected)
    assert first_baseline_problems(documents, volumes) == len(expected)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def object_store() -> Iterator[str]:
    """An HTTP server over tests/data, standing in for an object store's HTTPS endpoint."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(FIXTURE_DATA))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_split_can_come_from_an_object_store_url(
    tmp_path: Path, object_store: str, offline: None
) -> None:
    documents = render(merge(IMAGES, {"evaluator": {"testData": {"source": "url", "url": object_store}}}))
    volumes = {"eval": tmp_path / "eval", "tmp": tmp_path / "tmp"}
    for path in volumes.values():
        path.mkdir()
    step = run_data_step(documents, volumes, tmp_path)
    assert step.returncode == 0, step.stderr
    assert first_baseline_problems(documents, volumes) == len(
        read_problems(FIXTURE_DATA / "gsm8k" / "test.jsonl")
    )


def test_a_missing_split_at_the_url_fails_the_step_with_the_value_to_fix(
    tmp_path: Path, object_store: str
) -> None:
    documents = render(
        merge(IMAGES, {"evaluator": {"testData": {"source": "url", "url": f"{object_store}/nowhere"}}})
    )
    volumes = {"eval": tmp_path / "eval", "tmp": tmp_path / "tmp"}
    for path in volumes.values():
        path.mkdir()
    step = run_data_step(documents, volumes, tmp_path)
    assert step.returncode == 1
    assert "evaluator.testData.url" in step.stderr and "/nowhere/gsm8k/test.jsonl" in step.stderr


def test_the_hub_source_gets_its_token_in_the_data_step_only() -> None:
    values = {"evaluator": {"testData": {"hubTokenSecret": "hf-token"}}}
    pod = evaluator_pod(render(merge(IMAGES, values)))
    (step,) = pod["initContainers"]
    env = {e["name"]: e for e in step["env"]}
    assert step["command"] == ["autorl", "test-data", "--task", "gsm8k"]
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert env["HF_HUB_OFFLINE"]["value"] == "0"
    worker_env = {e["name"] for e in pod["containers"][0]["env"]}
    assert "HF_TOKEN" not in worker_env


def test_no_agent_or_other_pod_can_mount_the_test_data() -> None:
    documents = render(merge(IMAGES, FOLDER_ON_CLAIM))
    pod = evaluator_pod(documents)
    (step,) = pod["initContainers"]
    # The source claim: read-only, in the data step only; the worker itself never mounts it.
    source = {v["name"]: v for v in pod["volumes"]}["test-data-source"]["persistentVolumeClaim"]
    assert source == {"claimName": DATA_CLAIM, "readOnly": True}
    assert next(m for m in step["volumeMounts"] if m["name"] == "test-data-source")["readOnly"] is True
    assert "test-data-source" not in mount_paths(pod["containers"][0])
    # The evaluators' storage (where the split is cached) is an emptyDir of the evaluator pod alone.
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}["eval"]
    for name, spec in pod_specs(documents):
        if name == f"{RELEASE}-autorl-evaluator":
            continue
        claims = {v.get("persistentVolumeClaim", {}).get("claimName") for v in spec.get("volumes", [])}
        assert DATA_CLAIM not in claims, name
    # Every pod the controller creates for an experiment, as it builds them from the chart's settings.
    settings = controller_settings(documents)
    jobs = [
        build_agent_job(ExperimentRef("exp", NAMESPACE, "uid-1"), BUILTIN_AGENT, settings),
        build_agent_job(ExperimentRef("exp", NAMESPACE, "uid-1"), CUSTOM_AGENT, settings),
        build_prepare_job(ExperimentRef("exp", NAMESPACE, "uid-1"), BUILTIN_AGENT, settings),
    ]
    for job in jobs:
        spec = job["spec"]["template"]["spec"]
        claims = {
            v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        }
        assert claims == {f"{RELEASE}-autorl-shared"}, job["metadata"]["name"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for mount in container.get("volumeMounts", []):
                assert "eval" not in mount.get("subPath", "") and "test" not in mount.get("subPath", "")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"evaluator": {"testData": {"source": "folder", "existingClaim": f"{RELEASE}-autorl-shared"}}},
            "claim of its own",
        ),
        (
            {
                "shared": {"existingClaim": "rwx"},
                "evaluator": {"testData": {"source": "folder", "existingClaim": "rwx"}},
            },
            "claim of its own",
        ),
        ({"evaluator": {"testData": {"source": "folder"}}}, "evaluator.testData.folder is required"),
        ({"evaluator": {"testData": {"source": "url"}}}, "evaluator.testData.url is required"),
    ],
)
def test_a_data_step_that_cannot_work_is_refused_at_render(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(merge(IMAGES, values))


@pytest.mark.parametrize("url", ["file:///etc", "s3://bucket/data", "ftp://mirror/data"])
def test_the_data_step_fetches_only_over_http(url: str, tmp_path: Path) -> None:
    settings = HomeSettings(home=tmp_path / "home")
    with pytest.raises(ConfigurationError, match="must be http:// or https://"):
        provide(["gsm8k"], settings, source_url=url)
    assert not (tmp_path / "home" / "eval" / "data" / "gsm8k").exists()
