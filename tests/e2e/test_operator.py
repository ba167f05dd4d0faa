"""The real kopf operator loop against the kmock Kubernetes API emulator and a real grader
(tests/support/kube_emulator.py; the `platform` fixture: tests/e2e/conftest.py, one per module, so
these stay one module): an Experiment's lifecycle (its baseline waiting for an evaluator too), what
reaches its agent and the refusals the controller alone makes. Its budget and a reason for every
wait of its pods: tests/e2e/test_operator_budget.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from autorl.layout import cached_model_subpath
from autorl_controller.operator.manifests import ExperimentRef, agent_run_as_id
from autorl_controller.operator.settings import ControllerSettings
from tests.support.agent_pods import (
    agent_pod_spec,
    command_here,
    environment_here,
    start_here,
    token_secret_data,
)
from tests.support.broken_experiments import CASES as BROKEN
from tests.support.broken_experiments import manifest as broken_manifest
from tests.support.grading import row_id
from tests.support.kube_emulator import (
    CONFIGMAPS,
    EXPERIMENTS,
    JOBS,
    NAMESPACE,
    PODS,
    POLICIES,
    RELEASE,
    SECRETS,
    TICK_S,
    WAIT_S,
    Platform,
    admin,
    chart_authorizer,
    complete,
    controller_rbac,
    failed,
    finish_agent,
    load_example,
    runs_named,
)
from tests.support.runs import fail_evaluation

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_example_experiment_runs_to_succeeded_with_grader_scores(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-grpo"
    manifest = load_example("experiment-gsm8k.yaml")
    await platform.apply(manifest)
    ref = await platform.ref(name)

    await platform.wait_phase(name, "Preparing")
    secret = await platform.get(f"{SECRETS}/{ref.secret_name}")
    assert secret is not None and set(secret["data"]) == {"AUTORL_TOKEN", "GRADING_SERVER_URL"}
    experiment = await platform.get(f"{EXPERIMENTS}/{name}")
    assert experiment is not None
    owner = {"kind": "Experiment", "name": name, "uid": experiment["metadata"]["uid"]}
    assert {k: secret["metadata"]["ownerReferences"][0][k] for k in owner} == owner

    running = await platform.through_baseline(manifest, tiny_base_model)
    baseline = running["status"]["baselineScore"]
    assert isinstance(baseline, float) and 0.0 <= baseline <= 100.0

    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    assert {k: job["metadata"]["ownerReferences"][0][k] for k in owner} == owner
    # Every Job the controller creates pulls its images with the chart's pull secrets.
    prepare = await platform.get(f"{JOBS}/{ref.prepare_job_name}")
    assert prepare is not None
    for created in (prepare, job):
        assert created["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-pull"}]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["autorl", "agent-runner"]
    assert container["args"][:2] == ["--agent", "example_grpo"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["spec"]["activeDeadlineSeconds"] == manifest["spec"]["timeoutSeconds"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"secretRef": {"name": ref.secret_name}} in container["envFrom"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/workspace"]["subPath"] == ref.workspace_subpath and not mounts["/workspace"].get(
        "readOnly"
    )
    assert mounts["/workspace/data"]["readOnly"] is True
    assert mounts["/workspace/models/Qwen2.5-1.5B"]["readOnly"] is True
    assert not any("test" in m.get("subPath", "") for m in container["volumeMounts"])

    policy = await platform.get(f"{POLICIES}/{ref.policy_name}")
    assert policy is not None
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "autorl.io/experiment": name,
        "autorl.io/role": "agent",
    }
    assert policy["spec"]["ingress"] == [] and len(policy["spec"]["egress"]) == 1  # the grader only
    # No egress host names: no resolver, and a grader URL that needs none (the Service's cluster IP,
    # not the grader's own URL, a name that resolves nowhere here).
    assert pod["dnsPolicy"] == "None" and pod["dnsConfig"]["nameservers"] == ["127.0.0.1"]
    url, token = await platform.agent_credentials(name)
    assert url == f"{str(platform.grader.base_url).rstrip('/')}/a/{token}"  # http://127.0.0.1:PORT
    assert platform.grader_settings.public_url.startswith("http://autorl-grader.autorl.svc:")

    # The agent's container runs: the budget starts with it.
    await platform.run_agent_pod(ref)
    started = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
    )
    assert started["status"]["message"] == "the agent is training"

    # The agent submits a copy of the base model through its capability URL, as reference agents do.
    url, _ = await platform.agent_credentials(name)
    shutil.copytree(
        platform.shared / "cache" / "models" / cached_model_subpath(manifest["spec"]["model"]),
        platform.shared / ref.workspace_subpath / "output" / "ckpt-1",
    )
    submitted = await platform.grader.post(f"{url}/submit", json={"model_path": "output/ckpt-1"})
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["score"] == pytest.approx(baseline)

    await platform.end_agent_job(ref, complete())
    done = await platform.wait_phase(name, "Succeeded")
    status = done["status"]
    assert status["baselineScore"] == pytest.approx(baseline)
    assert status["bestScore"] == pytest.approx(baseline)
    assert status["improvement"] == pytest.approx(0.0)
    assert status["submissions"] == 1
    assert status["completionTime"] and "best" in status["message"]

    view = await platform.grader_view(ref)
    assert view["status"] == "completed"
    phases = {"Pending", "Preparing", "Baseline", "Running", "Finishing", "Succeeded"}
    await platform.wait_events(name, lambda events: phases <= {r for r, _ in events}, "an Event a phase")

    # Deletion removes every child; the results stay in the grader's database.
    await platform.kube.delete(f"{EXPERIMENTS}/{name}")
    await platform.wait_gone(f"{EXPERIMENTS}/{name}")
    for path in (
        f"{JOBS}/{ref.agent_job_name}",
        f"{JOBS}/{ref.prepare_job_name}",
        f"{SECRETS}/{ref.secret_name}",
        f"{POLICIES}/{ref.policy_name}",
    ):
        assert await platform.get(path) is None, path
    kept = await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))
    assert kept.status_code == 200 and kept.json()["submissions"] == 1


async def test_failed_agent_job_ends_failed_with_reason_and_scores(
    platform: Platform, tiny_base_model: Path
) -> None:
    manifest = load_example("experiment-custom-agent.yaml")
    name = manifest["metadata"]["name"]
    ref, running = await platform.start_running(manifest, tiny_base_model)

    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    assert job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == manifest["spec"].get("queueName")
    pod = job["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert agent["image"] == manifest["spec"]["agent"]["image"]
    # Without a command in the spec the image's own entrypoint runs.
    assert agent.get("command") == manifest["spec"]["agent"].get("command")
    assert {"secretRef": {"name": "llm-api-key"}} in agent["envFrom"]

    await platform.run_agent_pod(ref)
    # A message with control characters (as a pod's termination message could carry): it
    # reaches status and the Event escaped, one line, never driving `kubectl`'s terminal.
    await platform.end_agent_job(ref, failed("BackoffLimitExceeded", "backoff limit\n\x1b]0;pwned\x07\u202e"))
    done = await platform.wait_phase(name, "Failed")
    assert "BackoffLimitExceeded): backoff limit\\n\\x1b]0;pwned\\x07\\u202e" in done["status"]["message"]
    assert done["status"]["message"].isprintable()
    assert done["status"]["baselineScore"] == pytest.approx(running["status"]["baselineScore"])
    view = await platform.grader_view(ref)
    assert view["status"] == "failed"
    failure = ("Failed", done["status"]["message"])
    await platform.wait_events(name, lambda events: failure in events, "the Failed Event")


async def test_invalid_experiment_ends_failed_with_a_clear_message(platform: Platform) -> None:
    name = "both-agents"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    manifest["spec"]["agent"]["image"] = "registry.example/agent:1"
    manifest["spec"]["timeoutSecs"] = 60
    await platform.apply(manifest)
    done = await platform.wait_phase(name, "Failed")
    message = done["status"]["message"]
    assert "exactly one of builtin" in message
    assert "spec.timeoutSecs: unknown field" in message
    ref = ExperimentRef(name, NAMESPACE, done["metadata"]["uid"])
    # It never passed through Pending, the only phase in which anything is created or registered.
    assert await platform.get(f"{SECRETS}/{ref.secret_name}") is None
    assert await platform.get(f"{JOBS}/{ref.prepare_job_name}") is None
    events = await platform.wait_events(name, lambda events: "Failed" in dict(events), "the Failed Event")
    assert [reason for reason, _ in events].count("Failed") == 1, events
    registered = await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))
    assert registered.status_code == 404


async def test_egress_into_the_cluster_ends_failed_before_anything_runs(platform: Platform) -> None:
    name = "egress-into-cluster"
    manifest = load_example("experiment-custom-agent.yaml", rename=name)
    manifest["spec"]["egress"].append({"cidr": "10.96.0.0/12", "ports": [443]})  # the Service range
    await platform.apply(manifest)
    done = await platform.wait_phase(name, "Failed")
    assert "spec.egress[1].cidr: 10.96.0.0/12 lies inside 10.0.0.0/8" in done["status"]["message"]
    ref = ExperimentRef(name, NAMESPACE)
    for path in (
        f"{SECRETS}/{ref.secret_name}",
        f"{JOBS}/{ref.prepare_job_name}",
        f"{POLICIES}/{ref.policy_name}",
    ):
        assert await platform.get(path) is None, path


def colliding_names(settings: ControllerSettings) -> tuple[str, str]:
    """Two Experiment names of this namespace whose hashed user ids are equal (a birthday search)."""
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"same-id-{i}"
        run_as = agent_run_as_id(ExperimentRef(name, NAMESPACE), settings)
        if run_as in seen:
            return seen[run_as], name
        seen[run_as] = name
    raise AssertionError("unreachable")


async def test_the_younger_of_two_experiments_with_one_user_id_yields(platform: Platform) -> None:
    first, second = colliding_names(ControllerSettings(admin_token=platform.grader_settings.admin_token))
    await platform.apply(load_example("experiment-gsm8k.yaml", rename=first))
    await platform.wait_phase(first, "Preparing")
    await platform.apply(load_example("experiment-gsm8k.yaml", rename=second))
    done = await platform.wait_phase(second, "Failed")
    assert f"experiment {NAMESPACE}/{first} already has" in done["status"]["message"]
    assert "apply it under another name" in done["status"]["message"]
    ref = ExperimentRef(second, NAMESPACE)
    assert await platform.get(f"{JOBS}/{ref.prepare_job_name}") is None  # no folder, no pod for it
    assert (await platform.get(f"{EXPERIMENTS}/{first}") or {})["status"]["phase"] == "Preparing"
    # Leave nothing for the controller to keep reconciling every tick while the module's other
    # tests run (its deletion is the example test's subject; here it only has to be asked for).
    for name in (first, second):
        response = await platform.kube.delete(f"{EXPERIMENTS}/{name}")
        assert response.status_code < 300, response.text


async def test_reapplying_a_deleted_experiment_makes_a_new_run_and_keeps_the_old_one(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-again"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    await platform.apply(copy.deepcopy(manifest))
    first = await platform.ref(name)
    await platform.through_baseline(manifest, tiny_base_model)
    await platform.run_agent_pod(first)
    await finish_agent(platform, first)
    await platform.kube.delete(f"{EXPERIMENTS}/{name}")
    await platform.wait_gone(f"{EXPERIMENTS}/{name}")
    # A child of the earlier run that a cluster's garbage collector has not removed yet: a finished
    # prepare Job of the same name. The new run must neither take it for its own nor stall on it.
    stale_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": first.prepare_job_name,
            "ownerReferences": [
                {"apiVersion": "autorl.io/v1alpha1", "kind": "Experiment", "name": name, "uid": first.uid}
            ],
        },
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"succeeded": 1, "conditions": [complete()]},
    }
    await platform.create(JOBS, stale_job)

    # The same manifest again, as the docs advise after a change: a new run, not the old record.
    await platform.apply(copy.deepcopy(manifest))
    second = await platform.ref(name)
    assert second.uid != first.uid
    preparing = await platform.wait_phase(name, "Preparing")
    assert preparing["status"].get("startTime") is None  # not the old run's clock
    running = await platform.through_baseline(manifest, tiny_base_model)
    assert running["status"]["message"] == "the agent Job is waiting for its pod"
    secret = await platform.get(f"{SECRETS}/{second.secret_name}")
    assert secret is not None and secret["metadata"]["ownerReferences"][0]["uid"] == second.uid
    job = await platform.get(f"{JOBS}/{second.agent_job_name}")
    assert job is not None
    mounts = {m["mountPath"]: m for m in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/workspace"]["subPath"] == second.workspace_subpath != first.workspace_subpath
    assert (
        platform.shared / first.workspace_subpath / "run_meta.json"
    ).is_file()  # the earlier run's files stay

    await platform.run_agent_pod(second)
    trained = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the new run's budget"
    )
    assert trained["status"]["phase"] == "Running"
    assert trained["status"]["message"] == "the agent is training"
    await finish_agent(platform, second)

    # Both runs are in the grader's history, each with its own outcome.
    runs = await runs_named(platform, name)
    assert set(runs) == {first.grader_name, second.grader_name}
    assert [runs[run.grader_name]["status"] for run in (first, second)] == ["completed", "completed"]


async def test_declared_env_secrets_and_args_reach_a_builtin_agent_and_platform_secrets_do_not(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    name = "gsm8k-with-env"
    api_key = {"LLM_API_KEY": "sk-declared", "AUTORL_DATABASE_URL": "postgresql://smuggled"}
    await platform.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "llm-api-key"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in api_key.items()},
        },
    )
    await platform.create(
        CONFIGMAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tuning"}, "data": {"STEPS": "12"}},
    )
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    manifest["spec"]["agent"].update(
        {
            "args": ["--learning-rate", "1e-6", "-v"],
            "env": [{"name": "WANDB_MODE", "value": "offline"}],
            "envFrom": [
                {"secretRef": {"name": "llm-api-key"}},
                {"configMapRef": {"name": "tuning"}, "prefix": "TUNE_"},
            ],
        }
    )
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    container = (await agent_pod_spec(platform, ref))["containers"][0]
    assert {"secretRef": {"name": "llm-api-key"}, "prefix": "AUTORL_AGENT_ENV_"} in container["envFrom"]

    # Run the pod's entry point with the environment the kubelet would give it, plus what an image or
    # a node adds: GPU runtime variables (kept) and platform credentials (never passed on).
    secrets_by_name = {**await token_secret_data(platform, ref), "llm-api-key": api_key}
    env = environment_here(container, secrets_by_name, {"tuning": {"STEPS": "12"}}, tmp_path / "home")
    env.update(
        {
            "AUTORL_ADMIN_TOKEN": "admin-token-of-the-platform",
            "NVIDIA_VISIBLE_DEVICES": "GPU-4f2a",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        }
    )
    agent = tmp_path / "agent"
    agent.write_text(
        "#!/usr/bin/env python3\n"
        "import os, sys\n"
        "environ = open('/proc/self/environ', 'rb').read()\n"
        "open(os.path.join(os.environ['OUTPUT_DIR'], 'env.bin'), 'wb').write(environ)\n"
        "print('step 1 loss 0.731 args', sys.argv[1:], flush=True)\n"
    )
    agent.chmod(0o755)
    workspace = platform.shared / ref.workspace_subpath
    done = await asyncio.to_thread(
        subprocess.run,
        command_here(container, workspace, agent=agent),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    raw = (workspace / "output" / "env.bin").read_bytes().decode()
    seen = dict(item.split("=", 1) for item in raw.split("\0") if item)
    assert seen["LLM_API_KEY"] == "sk-declared"
    assert seen["WANDB_MODE"] == "offline" and seen["TUNE_STEPS"] == "12"
    assert (
        seen["NVIDIA_VISIBLE_DEVICES"] == "GPU-4f2a"
        and seen["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    )
    assert seen["AUTORL_TOKEN"] == secrets_by_name[ref.secret_name]["AUTORL_TOKEN"]
    assert "admin-token-of-the-platform" not in raw and "smuggled" not in raw
    assert not [key for key in seen if key.startswith("AUTORL_AGENT_ENV_")]
    assert "AUTORL_DATABASE_URL is not passed to the agent" in done.stderr
    # The training output is in the container's stdout (kubectl logs), marked as the agent's, and
    # in agent.log.
    line = "step 1 loss 0.731 args ['--learning-rate', '1e-6', '-v']"
    assert f"[agent] {line}" in done.stdout
    assert line in (workspace / "agent.log").read_text()
    await platform.run_agent_pod(ref)
    await finish_agent(platform, ref)


async def test_a_custom_images_mirror_sidecar_keeps_run_meta_and_scores_fresh(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    name = "custom-mirrors"
    manifest = load_example("experiment-custom-agent.yaml", rename=name)
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    (sidecar,) = (await agent_pod_spec(platform, ref))["initContainers"]
    env = environment_here(sidecar, await token_secret_data(platform, ref), {}, tmp_path / "home")
    workspace = platform.shared / ref.workspace_subpath
    mirror = start_here(command_here(sidecar, workspace, "--interval", "0.2"), env)
    try:
        await platform.run_agent_pod(ref)
        await platform.wait_for(
            f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
        )
        url, _ = await platform.agent_credentials(name)
        shutil.copytree(
            platform.shared / "cache" / "models" / cached_model_subpath(manifest["spec"]["model"]),
            workspace / "output" / "ckpt-1",
        )
        submitted = await platform.grader.post(f"{url}/submit", json={"model_path": "output/ckpt-1"})
        assert submitted.status_code == 200, submitted.text
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            meta = json.loads((workspace / "run_meta.json").read_text())
            scores = (
                json.loads((workspace / "scores.json").read_text())
                if (workspace / "scores.json").exists()
                else []
            )
            if meta.get("start_time") and len(scores) == 1:
                break
            assert asyncio.get_running_loop().time() < deadline, (meta, scores, mirror.poll())
            await asyncio.sleep(TICK_S)
        view = (
            await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))
        ).json()
        # The budget's end is run_meta.json's deadline; its end_time stays null while the agent runs.
        assert meta["deadline"] == pytest.approx(view["end_time"]) and meta["end_time"] is None
        assert scores[0]["submission_id"] == submitted.json()["submission_id"]
    finally:
        mirror.send_signal(signal.SIGTERM)  # the pod ends: the kubelet stops the sidecar
        _, err = mirror.communicate(timeout=30)
    assert mirror.returncode == 0, err
    await finish_agent(platform, ref)


async def test_a_role_without_its_jobs_rule_leaves_the_controller_forbidden_and_saying_so(
    platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    """The emulated API server authorizes the controller by the chart's rendered Role: without the
    rule for Jobs, it answers 403, the controller's log quotes the refusal and nothing is created."""
    documents = controller_rbac()
    (role,) = [
        doc for doc in documents if doc["kind"] == "Role" and doc["metadata"]["namespace"] == NAMESPACE
    ]
    role["rules"] = [rule for rule in role["rules"] if "jobs" not in rule["resources"]]
    charts = platform.emulator.authorizer
    platform.emulator.authorizer = chart_authorizer(documents)
    name = "gsm8k-no-jobs-rule"
    try:
        await platform.apply(load_example("experiment-gsm8k.yaml", rename=name))
        ref = await platform.ref(name)
        refusal = (
            f'jobs.batch "{ref.prepare_job_name}" is forbidden: User '
            f'"system:serviceaccount:{RELEASE}:{RELEASE}-controller" cannot get resource "jobs" '
            f'in API group "batch" in the namespace "{NAMESPACE}"'
        )
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not any(refusal in record.getMessage() for record in caplog.records):
            assert asyncio.get_running_loop().time() < deadline, caplog.text
            await asyncio.sleep(TICK_S)
        assert await platform.get(f"{JOBS}/{ref.prepare_job_name}") is None
        experiment = await platform.get(f"{EXPERIMENTS}/{name}")
        assert experiment is not None and experiment["status"]["phase"] == "Pending"
    finally:
        platform.emulator.authorizer = charts
    # With the rule back, the controller's next pass goes on (as after fixing the Role on a cluster).
    await platform.wait_for(f"{JOBS}/{ref.prepare_job_name}", lambda job: True, "the prepare Job")
    await platform.kube.delete(f"{EXPERIMENTS}/{name}")
    await platform.wait_gone(f"{EXPERIMENTS}/{name}")


async def test_an_experiment_deleted_during_a_reconcile_pass_goes_once_the_pass_ends(
    platform: Platform,
) -> None:
    """kubectl delete while the controller's pass waits on a slow API server: the Experiment is gone
    seconds after the pass ends, not a minute later."""
    name = "gsm8k-deleted-mid-pass"
    await platform.apply(load_example("experiment-gsm8k.yaml", rename=name))
    ref = await platform.ref(name)
    job = f"{JOBS}/{ref.prepare_job_name}"
    await platform.wait_for(job, lambda job: True, "the prepare Job")
    platform.emulator.slow_reads[job] = 3.0
    try:
        begun = platform.emulator.slow_reads_begun
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while platform.emulator.slow_reads_begun == begun:  # a pass now waits on the Job's read
            assert asyncio.get_running_loop().time() < deadline, "no reconcile pass read the Job"
            await asyncio.sleep(TICK_S / 4)
        deleted = asyncio.get_running_loop().time()
        await platform.kube.delete(f"{EXPERIMENTS}/{name}")
    finally:
        platform.emulator.slow_reads.clear()
    await platform.wait_gone(f"{EXPERIMENTS}/{name}")
    assert asyncio.get_running_loop().time() - deleted < 15


async def test_the_emulated_api_server_refuses_the_controller_what_a_cluster_would(
    platform: Platform,
) -> None:
    """Small direct requests, as the controller's ServiceAccount (no cluster token): RBAC's 403
    Status, the schema's 400 and 422, Pod Security's 403 for a pod and its warning for a Job."""
    user = f"system:serviceaccount:{RELEASE}:{RELEASE}-controller"
    async with httpx.AsyncClient(base_url=platform.kube.base_url) as controller:
        logs = await controller.get(f"{PODS}/some-pod/log")
        assert logs.status_code == 403
        assert logs.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'pods "some-pod" is forbidden: User "{user}" cannot get resource "pods/log" '
            f'in API group "" in the namespace "{NAMESPACE}"',
            "reason": "Forbidden",
            "details": {"name": "some-pod", "group": "", "kind": "pods"},
            "code": 403,
        }
        for refused in (
            controller.get(SECRETS),  # list
            controller.get(PODS, params={"watch": "true"}),  # list is granted, watch is not
            controller.get("/api/v1/namespaces/default/pods"),  # the Role is namespaced
            controller.get("/api/v1/namespaces/autorl/services/autorl-postgres"),  # only the grader's
        ):
            answer = await refused
            assert (answer.status_code, answer.json()["reason"]) == (403, "Forbidden"), answer.text

        def job(name: str, **change: Any) -> dict[str, Any]:
            container = {"name": "main", "image": "busybox", **change}
            template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
            return {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name},
                "spec": {"template": template},
            }

        unknown = await controller.post(JOBS, json=job("unknown-field", imagePullPolcy="Always"))
        assert unknown.status_code == 400, unknown.text
        assert (
            'strict decoding error: unknown field "spec.template.spec.containers[0].imagePullPolcy"'
            in (unknown.json()["message"])
        )
        invalid = await controller.post(JOBS, json=job("bad-type", args="--fast"))
        assert (invalid.status_code, invalid.json()["reason"]) == (422, "Invalid"), invalid.text
        assert invalid.json()["message"].startswith(
            'Job.batch "bad-type" is invalid: spec.template.spec.containers[0].args: Invalid value: "--fast"'
        )
        # Not restricted (root allowed, no seccomp, privileges kept): the Job is admitted with the
        # admission's warning, its pod is refused, whoever creates it (here the Job controller's part).
        created = await controller.post(JOBS, json=job("unrestricted"))
        assert created.status_code < 300, created.text
        assert 'would violate PodSecurity \\"restricted:latest\\": ' in created.headers["Warning"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unrestricted-x"},
        "spec": job("-")["spec"]["template"]["spec"],
    }
    refused_pod = await platform.kube.post(PODS, json=pod)
    assert refused_pod.status_code == 403, refused_pod.text
    message = refused_pod.json()["message"]
    assert message.startswith(
        'pods "unrestricted-x" is forbidden: violates PodSecurity "restricted:latest": '
    )
    for rule in (
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "seccompProfile",
    ):
        assert rule in message, message
    await platform.kube.delete(f"{JOBS}/unrestricted")


async def test_a_baseline_no_evaluator_takes_becomes_a_condition_and_clears_when_one_appears(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    """No evaluator runs: the Experiment stays in Baseline, says so with the fix and the queue; a real
    `autorl worker` then starts, reports itself, takes the baseline, and the condition clears."""
    from tests.support.service_processes import running

    name = "wait-evaluators"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    # A base model no earlier test scored: its baseline is not answered from the cache.
    manifest["spec"]["model"] = "example-org/never-evaluated-1.5B"
    ref = await platform.applied(manifest)
    platform.run_prepare_pod(manifest["spec"], ref, tiny_base_model)
    await platform.patch_job_status(ref.prepare_job_name, {"succeeded": 1, "conditions": [complete()]})
    stuck = await platform.wait_for(
        f"{EXPERIMENTS}/{name}",
        lambda obj: obj["status"].get("reason") == "EvaluatorsUnavailable",
        "EvaluatorsUnavailable",
    )
    status = stuck["status"]
    assert status["phase"] == "Baseline"
    assert "no evaluator takes hf work" in status["message"] and "queue position 1" in status["message"]
    assert "kubectl get pods -l app.kubernetes.io/component=evaluator" in status["message"]
    assert status["queue"] == "baseline #1, 0 evaluators" and status["evaluators"] == 0
    (condition,) = [c for c in status["conditions"] if c["type"] == "EvaluatorsUnavailable"]
    assert condition["status"] == "True" and condition["message"] == status["message"]
    await asyncio.sleep(TICK_S * 5)
    assert (await platform.get(f"{EXPERIMENTS}/{name}") or {})["status"]["phase"] == "Baseline"  # not Failed

    with running(["worker"], platform.grader_settings, tmp_path / "worker.log"):
        started = await platform.wait_phase(name, "Running")
    (condition,) = [c for c in started["status"]["conditions"] if c["type"] == "EvaluatorsUnavailable"]
    assert condition["status"] == "False"
    assert started["status"]["baselineScore"] is not None
    events = [reason for reason, _ in await platform.events(name)]
    assert "Failed" not in events
    await platform.run_agent_pod(ref)
    await finish_agent(platform, ref)


ONLY_THE_CONTROLLER_SEES = [case for case in BROKEN if case.schema is None]


async def test_what_no_schema_sees_fails_at_once_before_any_job(platform: Platform) -> None:
    """The broken Experiments the CRD's schema lets through (tests/support/broken_experiments.py)
    end Failed on the controller's first look, with the message naming the fix, and nothing is
    created for them: no Secret, no Job, no registration with the grader."""
    names = {}
    for case in ONLY_THE_CONTROLLER_SEES:
        resource = broken_manifest(case)
        if case.name == "broken":
            resource["metadata"]["name"] = f"refused-{case.id}"
        names[case.id] = resource["metadata"]["name"]
        await platform.apply(resource)
    for case in ONLY_THE_CONTROLLER_SEES:
        done = await platform.wait_phase(names[case.id], "Failed")
        assert case.controller in done["status"]["message"], (case.id, done["status"]["message"])
        ref = ExperimentRef(names[case.id], NAMESPACE, done["metadata"]["uid"])
        for path in (
            f"{SECRETS}/{ref.secret_name}",
            f"{JOBS}/{ref.prepare_job_name}",
            f"{JOBS}/{ref.agent_job_name}",
        ):
            assert await platform.get(path) is None, (case.id, path)
        registered = await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))
        assert registered.status_code == 404, case.id


async def test_a_sealed_experiment_is_evaluated_on_test_once_after_its_agent(
    platform: Platform, tiny_base_model: Path
) -> None:
    """spec.evaluation.feedback: sealed, through the operator: both baselines, a submission scored
    on validation, and in Finishing the one test evaluation the controller asks for (again, when
    the first fails for the evaluator's own fault), mirrored into the status before the
    experiment succeeds."""
    from autorl.errors import EVALUATOR_FAULT_PREFIX
    from autorl.store import (
        Database,
        Split,
        experiments,
        sealed_final,
        submissions,
    )
    from autorl_evaluator.jobs import evaluate
    from tests.support.grading import make_unique

    name = "gsm8k-sealed"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    manifest["spec"]["evaluation"]["feedback"] = "sealed"
    await platform.apply(manifest)
    ref = await platform.ref(name)

    def waiting_ids() -> list[int]:
        db = Database(platform.grader_settings.database_url or "")
        try:
            with db.session() as session:
                experiment = experiments.get_experiment(session, ref.grader_name)
                return [
                    s.id
                    for s in submissions.experiment_submissions(session, experiment)
                    if not s.status.final
                ]
        finally:
            db.dispose()

    async def evaluate_waiting() -> list[int]:
        """Evaluate every evaluation of this experiment still waiting, for real."""
        waiting = waiting_ids()
        for submission_id in waiting:
            await asyncio.to_thread(evaluate, submission_id, platform.grader_settings)
        return waiting

    await platform.prepare_job(ref)
    platform.run_prepare_pod(manifest["spec"], ref, tiny_base_model)
    await platform.patch_job_status(ref.prepare_job_name, {"succeeded": 1, "conditions": [complete()]})
    await platform.wait_phase(name, "Baseline")
    await evaluate_waiting()  # the baseline on validation (on test, too, unless another run cached it)
    running = await platform.wait_phase(name, "Running")
    assert running["status"]["feedback"] == "sealed"
    db = Database(platform.grader_settings.database_url or "")
    try:
        with db.session() as session:
            experiment = experiments.get_experiment(session, ref.grader_name)
            for split in (Split.TEST, Split.VALIDATION):
                baseline = submissions.baseline_submission(session, experiment, split)
                assert baseline is not None and baseline.split == split and baseline.status.final
    finally:
        db.dispose()
    await platform.run_agent_pod(ref)
    await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
    )
    url, _ = await platform.agent_credentials(name)
    checkpoint = platform.shared / ref.workspace_subpath / "output" / "ckpt-1"
    shutil.copytree(
        platform.shared / "cache" / "models" / cached_model_subpath(manifest["spec"]["model"]), checkpoint
    )
    make_unique(checkpoint)
    submitted = await platform.grader.post(f"{url}/submit?wait=false", json={"model_path": "output/ckpt-1"})
    assert submitted.status_code == 202, submitted.text
    submitted_id = row_id(
        platform.grader_settings.database_url, ref.grader_name, submitted.json()["submission_id"]
    )
    assert await evaluate_waiting() == [submitted_id]
    shown = (await platform.grader.get(f"{url}/submissions/{submitted.json()['submission_id']}")).json()
    assert shown["split"] == "validation"

    await platform.end_agent_job(ref, complete())
    finishing = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: obj["status"].get("phase") == "Finishing", "Finishing"
    )
    assert finishing["status"]["feedback"] == "sealed"

    async def fail_waiting_as_the_evaluator() -> list[int]:
        """The worker's result path for an engine that would not start: the evaluator's fault."""
        waiting = waiting_ids()
        db = Database(platform.grader_settings.database_url or "")
        try:
            for submission_id in waiting:
                fail_evaluation(
                    db, submission_id, f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault): no engine"
                )
        finally:
            db.dispose()
        return waiting

    # The controller asks for the final evaluation on its next ticks; the first fails for the
    # evaluator's own fault, so it asks again, and the second is the result.
    for attempt in (fail_waiting_as_the_evaluator, evaluate_waiting):
        for _ in range(60):
            if await attempt():
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"no final evaluation to take for {attempt.__name__}")
    done = await platform.wait_phase(name, "Succeeded")
    status = done["status"]
    assert status["finalSelection"] == "best_on_validation" and status["testEvaluations"] == 1
    assert (
        isinstance(status["finalScore"], float)
        and status["finalLow"] <= status["finalScore"] <= status["finalHigh"]
    )
    assert "on test (best_on_validation)" in status["message"]
    db = Database(platform.grader_settings.database_url or "")
    try:
        with db.session() as session:
            experiment = experiments.get_experiment(session, ref.grader_name)
            final = sealed_final.final_submission(session, experiment)
            assert final is not None and final.split == Split.TEST and final.score == status["finalScore"]
    finally:
        db.dispose()
