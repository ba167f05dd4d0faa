"""The platform's services as containers, talking to each other, end to end.

The grader and an evaluator worker (cpu variant) run as the chart renders their Deployments, and the
prepare and agent Jobs as the controller builds them (build_prepare_job, build_agent_job with the
controller's settings read from the chart's environment): same images, commands, environment,
users, read-only root file systems and mounts, a host folder standing in for each PersistentVolumeClaim
(tests/support/podman_pods.py). They use this test's own Postgres database and its own Redis key
prefix (the release name), on the host's network: a Service name resolves to 127.0.0.1.

The sequence is the controller's: register the experiment with the grader's admin API, run the
prepare Job, request the baseline (the worker container scores it), start the budget, run the agent
Job: the agent container trains the tiny model on `arith` with the built-in GRPO agent against its
grading URL and saves its checkpoints.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest

from autorl.experiment import ExperimentSpec
from autorl_controller.operator.manifests import (
    ExperimentRef,
    build_agent_job,
    build_prepare_job,
    build_registration,
)
from autorl_controller.operator.settings import ControllerSettings
from tests.containers.conftest import CPU_TAGS, EXTERNAL_STORES, NAMESPACE, merge, render_chart, workload
from tests.support.infra import free_port, new_run_id
from tests.support.podman_pods import PodHost, logs, remove, run_to_completion, running, start

pytestmark = [pytest.mark.slow, pytest.mark.containers]

BUDGET_S = 240
#: SFT for one epoch then GRPO for one, on 64 train problems: a few steps of each.
AGENT_ARGS = "--sft always --sft-epochs 1 --max-train-problems 64"
#: The evaluator's data step reads GSM8K's test split from a claim (no hub here): the suite's fixture.
DATA_CLAIM = "gsm8k-data"
FIXTURE_DATA = Path(__file__).resolve().parents[1] / "data"
#: Evaluation kept small on CPU: the recorded config comes from the grader's settings.
EVAL_ENV = {"AUTORL_EVAL_LIMIT": "8", "AUTORL_EVAL_MAX_NEW_TOKENS": "16", "AUTORL_EVAL_BATCH_SIZE": "8"}


@dataclass
class Platform:
    release: str
    host: PodHost
    documents: list[dict[str, Any]]
    admin_url: str
    admin_token: str
    controller: ControllerSettings
    containers: list[str]


def chart_secrets(documents: list[dict[str, Any]], values: dict[str, str]) -> dict[str, dict[str, str]]:
    """Every Secret key the rendered pods read, filled from ``values`` (by Secret name) — the Secrets
    an operator creates (external stores) or the chart generates (the admin token)."""
    found: dict[str, dict[str, str]] = {}
    for doc in documents:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for item in container.get("env", []):
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        found.setdefault(ref["name"], {})[ref["key"]] = values[ref["name"]]
    return found


@pytest.fixture
def platform(
    podman_ready: None,
    chart_images: set[str],
    fresh_pg_url: str,
    redis_url: str,
    tmp_path: Path,
) -> Iterator[Platform]:
    release = f"c{new_run_id()[:10]}".lower()
    port, admin_port = free_port(), free_port()
    values = merge(
        EXTERNAL_STORES,
        CPU_TAGS,
        {
            "grader": {
                "port": port,
                "adminPort": admin_port,
                "service": {"port": port, "adminPort": admin_port},
                "extraEnv": EVAL_ENV,
            },
            "evaluator": {
                "extraEnv": EVAL_ENV,
                "testData": {"source": "folder", "existingClaim": DATA_CLAIM, "folder": "/"},
            },
        },
    )
    documents = render_chart(values, release)
    admin_token = secrets.token_hex(16)
    # The Secrets an operator creates for external stores, and the chart's generated admin token.
    secret_values = {"pg-url": fresh_pg_url, "redis-url": redis_url}
    secret_values.update(
        {doc["metadata"]["name"]: admin_token for doc in documents if doc["kind"] == "Secret"}
    )
    # Stand-ins for the PersistentVolumeClaims, with what the kubelet's fsGroup gives the volume's root.
    claims = {"shared": tmp_path / "shared", "snapshots": tmp_path / "snapshots"}
    for folder in claims.values():
        folder.mkdir()
        os.chown(folder, 0, 10001)
        folder.chmod(0o2775)
    claim_names = {
        volume["persistentVolumeClaim"]["claimName"]: claims[volume["name"]]
        for doc in documents
        if doc["kind"] == "Deployment"
        for volume in doc["spec"]["template"]["spec"].get("volumes", [])
        if "persistentVolumeClaim" in volume and volume["name"] in claims
    }
    claim_names[DATA_CLAIM] = FIXTURE_DATA
    services = [
        f"{doc['metadata']['name']}{suffix}"
        for doc in documents
        if doc["kind"] == "Service"
        for suffix in ("", f".{NAMESPACE}", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local")
    ]
    host = PodHost(
        claims=claim_names, secrets=chart_secrets(documents, secret_values), service_names=services
    )
    controller_container = workload(documents, "Deployment", f"{release}-autorl-controller")["containers"][0]
    with mock.patch.dict(os.environ, host.environment(controller_container)):
        controller = ControllerSettings()
    containers: list[str] = []
    try:
        # The grader now; the evaluator once the prepare Job has filled the cache (see the test).
        pod = workload(documents, "Deployment", f"{release}-autorl-grader")
        containers += start(pod, host, f"{release}-grader")
        admin_url = f"http://127.0.0.1:{admin_port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert running(containers[0]), logs(containers[0])
            assert time.monotonic() < deadline, logs(containers[0])
            time.sleep(1)
        yield Platform(release, host, documents, admin_url, admin_token, controller, containers)
    finally:
        remove(*containers)
        # Files the containers wrote belong to their users; the temporary folder is removed as root.
        shutil.rmtree(tmp_path / "shared", ignore_errors=True)


def test_agent_container_trains_submits_and_the_worker_container_scores(platform: Platform) -> None:
    spec = ExperimentSpec.model_validate(
        {
            "task": "arith",
            "model": "builtin:tiny-qwen2",
            # Both phases, each kept short (the agent ends once they are done): what is proved here is
            # that the images train, submit and score, not how much the model learns (test_local_run.py).
            "agent": {"builtin": "example_grpo", "env": [{"name": "AUTORL_AGENT_ARGS", "value": AGENT_ARGS}]},
            "timeoutSeconds": BUDGET_S,
        }
    )
    ref = ExperimentRef("arith-grpo", NAMESPACE, "uid-1")
    admin = httpx.Client(
        base_url=platform.admin_url, headers={"Authorization": f"Bearer {platform.admin_token}"}, timeout=60
    )
    registered = admin.post(
        "/v1/experiments",
        json=build_registration(ref, spec, platform.controller).model_dump(exclude_unset=True),
    )
    assert registered.status_code in (200, 201), registered.text
    answer = registered.json()
    platform.host.secrets[ref.secret_name] = {
        "AUTORL_TOKEN": answer["token"],
        "GRADING_SERVER_URL": answer["grading_server_url"],
    }

    prepare = build_prepare_job(ref, spec, platform.controller)["spec"]["template"]["spec"]
    results = run_to_completion(prepare, platform.host, f"{platform.release}-prepare", timeout=600)
    assert [code for _, code, _ in results] == [0, 0], results

    # Started after the cache exists: a missing subPath folder is created by root (as the kubelet
    # does), and the cache step could not write into a cache/models made so by the evaluator's mount.
    evaluator = workload(platform.documents, "Deployment", f"{platform.release}-autorl-evaluator")
    platform.containers += start(evaluator, platform.host, f"{platform.release}-evaluator")
    assert admin.post(f"/v1/experiments/{ref.grader_name}/baseline").status_code < 300
    done = wait_for(
        admin, ref.grader_name, lambda v: v["baseline_status"] in {"scored", "failed"}, platform, 600
    )
    assert done["baseline_status"] == "scored", (done, logs(platform.containers[1])[-5000:])
    assert 0.0 <= done["baseline_score"] <= 100.0
    assert done["eval_config"]["limit"] == int(EVAL_ENV["AUTORL_EVAL_LIMIT"]), done["eval_config"]

    assert admin.post(f"/v1/experiments/{ref.grader_name}/start", json={}).status_code < 300
    agent = build_agent_job(ref, spec, platform.controller)["spec"]["template"]["spec"]
    results = run_to_completion(agent, platform.host, f"{platform.release}-agent", timeout=BUDGET_S + 120)
    ((_, code, agent_logs),) = results
    assert code == 0, agent_logs

    # The agent trained in its container, with its budget read from the grader through its URL.
    workspace = platform.host.claims[platform.controller.shared_pvc] / ref.workspace_subpath
    agent_log = (workspace / "agent.log").read_text(errors="replace")
    for event in (
        "event=start task=arith",
        "event=phase_end phase=sft",
        "event=phase_end phase=grpo",
        "event=done",
    ):
        assert event in agent_log, f"{event}\n{agent_logs[-2000:]}\n{agent_log[-6000:]}"
    # The runner's own events are the pod's stream, never among the agent's output.
    assert "event=agent_finished exit_code=0" in agent_logs and "event=agent_finished" not in agent_log
    assert list((workspace / "output").iterdir()), "no checkpoint saved"

    # It submitted through the grader's URL, and the worker container scored every submission.
    scored = wait_for(admin, ref.grader_name, lambda v: v["in_flight"] == 0, platform, 600)
    assert scored["total_submissions"] >= 1, (scored, agent_log[-6000:])
    assert scored["failed_submissions"] == 0, (scored, logs(platform.containers[1])[-5000:])
    assert scored["best_score"] is not None and 0.0 <= scored["best_score"] <= 100.0, scored
    assert scored["improvement"] == pytest.approx(scored["best_score"] - scored["baseline_score"]), scored


def wait_for(
    admin: httpx.Client, name: str, check: Any, platform: Platform, timeout_s: float = 600
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        view: dict[str, Any] = admin.get(f"/v1/experiments/{name}").json()
        if check(view):
            return view
        for container in platform.containers:
            assert running(container), logs(container)[-5000:]
        assert time.monotonic() < deadline, (view, logs(platform.containers[1])[-5000:])
        time.sleep(2)
