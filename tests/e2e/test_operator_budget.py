"""An Experiment's budget and a reason for every wait of its pods, through the real kopf operator
loop against the kmock Kubernetes API emulator and a real grader (tests/support/kube_emulator.py;
the `platform` fixture: tests/e2e/conftest.py, one per module, so these stay one module): when the
budget starts, how the agent is stopped at its end, and what an Experiment says while its prepare or
agent pod waits or its prepare step fails. Its lifecycle, what reaches its agent and the
controller's refusals: tests/e2e/test_operator.py."""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import pytest

from autorl_controller.operator.settings import ControllerSettings
from tests.support.agent_pods import (
    agent_pod_spec,
    command_here,
    environment_here,
    start_here,
    token_secret_data,
)
from tests.support.kube_emulator import (
    EXPERIMENTS,
    JOBS,
    PODS,
    TICK_S,
    Platform,
    admin,
    cause_crash_loop,
    cause_failed_mount,
    cause_image_pull,
    cause_missing_secret,
    cause_refused_pod,
    cause_suspended,
    cause_unschedulable,
    failed,
    finish_agent,
    iso,
    job_pod,
    load_example,
    waiting_container,
)
from tests.support.kubelet import failed_pod_status

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("how", ["job-deadline-exceeded", "controller-clock"])
async def test_agent_past_its_deadline_ends_timed_out(
    platform: Platform, tiny_base_model: Path, how: str
) -> None:
    name = f"gsm8k-late-{how}"[:50]
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    if how == "controller-clock":
        manifest["spec"]["timeoutSeconds"] = 1
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    await platform.run_agent_pod(ref)
    if how == "job-deadline-exceeded":
        # Kubernetes itself stops the Job at activeDeadlineSeconds.
        await platform.end_agent_job(ref, failed("DeadlineExceeded", "Job was active longer than specified"))
    done = await platform.wait_phase(name, "TimedOut")
    assert "end of its budget" in done["status"]["message"]
    assert done["status"]["baselineScore"] is not None and done["status"]["deadline"]
    if how == "controller-clock":
        # The Job still ran past the budget and its grace: the controller stopped it.
        assert await platform.get(f"{JOBS}/{ref.agent_job_name}") is None
    view = await platform.grader_view(ref)
    assert view["status"] == "timed_out"


async def test_custom_image_agent_is_stopped_by_kubernetes_at_its_budgets_end(
    platform: Platform, tiny_base_model: Path
) -> None:
    """Nothing inside a custom image keeps time: the Job's own deadline is moved to the budget's end,
    so the Job controller deletes the pod then (SIGTERM), and the kubelet kills it a grace period
    later (SIGKILL), whether or not the controller is running at that moment."""
    name = "gsm8k-custom-deadline"
    manifest = load_example("experiment-custom-agent.yaml", rename=name)
    manifest["spec"]["timeoutSeconds"] = 600
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert (
        pod["terminationGracePeriodSeconds"]
        == ControllerSettings(admin_token=platform.grader_settings.admin_token).agent_stop_grace_s
    )  # SIGTERM → SIGKILL
    backstop = job["spec"]["activeDeadlineSeconds"]
    assert backstop == 600  # from the Job's start, before the budget is known: never past its end

    # The Job started 95 s ago (scheduling, a slow image pull); its agent runs now: the budget starts.
    job_start = datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(seconds=95)
    await platform.patch_job_status(ref.agent_job_name, {"startTime": iso(job_start)})
    await platform.run_agent_pod(ref)
    tightened = await platform.wait_for(
        f"{JOBS}/{ref.agent_job_name}",
        lambda obj: obj["spec"]["activeDeadlineSeconds"] != backstop,
        "the Job's deadline to follow the budget",
    )
    seen_at = time.time()
    view = await platform.grader_view(ref)
    until_end = view["end_time"] - job_start.timestamp()
    # The budget started once the controller saw the pod run: after the patch, before we saw it.
    assert 95 + 600 <= until_end <= seen_at - job_start.timestamp() + 600
    assert tightened["spec"]["activeDeadlineSeconds"] == math.ceil(until_end)
    # Later ticks leave it alone (no patch per tick).
    await asyncio.sleep(TICK_S * 5)
    again = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert again is not None
    assert again["metadata"]["resourceVersion"] == tightened["metadata"]["resourceVersion"]

    # At that deadline the Job controller stops it: the experiment ends TimedOut, its Job kept for logs.
    await platform.end_agent_job(ref, failed("DeadlineExceeded", "Job was active longer than specified"))
    done = await platform.wait_phase(name, "TimedOut")
    assert "end of its budget" in done["status"]["message"]
    assert await platform.get(f"{JOBS}/{ref.agent_job_name}") is not None


async def test_the_budget_starts_when_the_agent_container_runs_not_while_pending(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-slow-pull"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    ref, _ = await platform.start_running(manifest, tiny_base_model)

    # The Job has an active pod, Pending: scheduled, pulling a large image. No budget yet.
    pod = await platform.run_agent_pod(ref, pending=True)
    await asyncio.sleep(TICK_S * 10)
    view = await platform.grader_view(ref)
    assert view["start_time"] is None and view["end_time"] is None
    status = (await platform.get(f"{EXPERIMENTS}/{name}") or {})["status"]
    assert status["message"] == "the agent Job is waiting for its pod" and not status.get("deadline")

    # The container starts; the controller sees it a little later. The clock counts from the start
    # (which is after registration: the grader clamps an earlier start to it).
    started = datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(seconds=1)
    await platform.set_agent_running(pod, started)
    running = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
    )
    view = await platform.grader_view(ref)
    assert view["start_time"] == pytest.approx(started.timestamp(), abs=1e-3)
    assert view["end_time"] == pytest.approx(
        started.timestamp() + manifest["spec"]["timeoutSeconds"], abs=1e-3
    )
    assert running["status"]["startTime"] == iso(started)
    await finish_agent(platform, ref)


async def test_without_access_to_pods_the_budget_starts_with_a_ready_pod(
    platform: Platform, tiny_base_model: Path
) -> None:
    """A Role that does not grant reading pods (403): the Job's count of ready pods stands in."""
    name = "gsm8k-no-pod-access"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    forbidden = platform.emulator[f"GET {PODS}"] << 403
    assert isinstance(forbidden, kmock.Reaction)
    try:
        await platform.patch_job_status(ref.agent_job_name, {"active": 1})  # Pending: active, not ready
        await asyncio.sleep(TICK_S * 10)
        status = (await platform.get(f"{EXPERIMENTS}/{name}") or {})["status"]
        assert status["phase"] == "Running" and not status.get("deadline")
        before = time.time()
        await platform.patch_job_status(ref.agent_job_name, {"active": 1, "ready": 1})
        await platform.wait_for(
            f"{EXPERIMENTS}/{name}", lambda obj: bool(obj["status"].get("deadline")), "the budget to start"
        )
    finally:
        platform.emulator._payloads.remove(forbidden)
    view = await platform.grader_view(ref)
    assert before - 1 <= view["start_time"] <= time.time()
    await finish_agent(platform, ref)


async def test_a_builtin_agents_runner_follows_the_budget_the_grader_starts_later(
    platform: Platform, tiny_base_model: Path, tmp_path: Path
) -> None:
    """In a pod the runner may start before the controller starts the grader's clock: it runs on its
    own ``--timeout`` until the grader reports the budget, then ends the agent at the grader's end."""
    name = "gsm8k-runner-clock"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    ref, _ = await platform.start_running(manifest, tiny_base_model)
    container = (await agent_pod_spec(platform, ref))["containers"][0]
    env = environment_here(container, await token_secret_data(platform, ref), {}, tmp_path / "home")
    agent = tmp_path / "agent"
    agent.write_text("#!/usr/bin/env python3\nimport time\ntime.sleep(600)\n")
    agent.chmod(0o755)
    workspace = platform.shared / ref.workspace_subpath
    runner = start_here(command_here(container, workspace, "--grace-period", "1", agent=agent), env)
    try:
        # The runner opens agent.log just before it starts the agent.
        log = workspace / "agent.log"
        while not log.exists():
            assert runner.poll() is None, runner.communicate()
            await asyncio.sleep(TICK_S)
        # The grader's clock starts now, with a budget far shorter than the runner's own --timeout.
        started = await platform.grader.post(
            f"/v1/experiments/{ref.grader_name}/start", json={"timeout_s": 2}, headers=admin(platform)
        )
        assert started.status_code == 200, started.text
        _out, err = await asyncio.to_thread(runner.communicate, timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, err
    # The runner's own events are the pod's own stream (kubectl logs), not the agent's agent.log.
    assert "event=budget_from_grader" in err and "event=deadline action=SIGTERM" in err
    assert "ended at the deadline" in err
    assert "event=" not in log.read_text()
    await platform.wait_phase(name, "TimedOut")


# --- a reason for every wait of a pod -------------------------------------------------------------


@pytest.mark.parametrize(
    ("cause", "reason", "says"),
    [
        (
            cause_unschedulable,
            "Unschedulable",
            ["cannot be scheduled", "Insufficient nvidia.com/gpu", "add or free nodes"],
        ),
        (
            cause_image_pull,
            "ImagePullFailed",
            [
                "cannot pull image registry.example/autorl-agent-runner:0.1.0",
                "ImagePullBackOff",
                "not found",
                "imagePullSecrets",
            ],
        ),
        (cause_missing_secret, "ContainerConfigError", ['secret "hf-token" not found', "create the Secret"]),
        (cause_crash_loop, "CrashLoopBackOff", ["keeps failing", "4 restarts, exit code 3", "--previous"]),
        (
            cause_refused_pod,
            "PodCreateFailed",
            ["does not create the prepare pod", "exceeded quota", "ResourceQuota"],
        ),
        (cause_failed_mount, "PodStarting", ["FailedMount", 'pvc "autorl-shared" not found']),
        (cause_suspended, "JobSuspended", ["suspended", "kubectl get workloads"]),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
async def test_a_waiting_prepare_pod_names_its_cause_and_the_fix(
    platform: Platform, cause: Callable[[Platform, str], Any], reason: str, says: list[str]
) -> None:
    name = f"wait-{reason.lower()}"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    ref = await platform.applied(manifest)
    await cause(platform, ref.prepare_job_name)
    waiting = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: obj["status"].get("reason") == reason, f"reason {reason}"
    )
    assert waiting["status"]["phase"] == "Preparing"
    for words in says:
        assert words in waiting["status"]["message"], waiting["status"]["message"]
    await platform.kube.delete(f"{EXPERIMENTS}/{name}")  # the controller cleans up in its own time


HUB_REFUSAL = (
    "no-such-org/no-such-model is not a model on the Hugging Face hub (or is private); check the id, "
    "set HF_TOKEN for a private model, or pass a local folder that holds config.json"
)


async def test_a_hub_id_the_hub_does_not_know_fails_the_experiment_with_the_steps_words(
    platform: Platform,
) -> None:
    """The prepare step's refusal reaches status.message, not only the Job's log: the controller reads
    the failed container's termination message (its log's tail), escaped."""
    name = "hub-id-unknown"
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    manifest["spec"]["model"] = "no-such-org/no-such-model"
    ref = await platform.applied(manifest)
    log = (
        "preparing no-such-org/no-such-model in /shared/cache/models\n"
        "\x1b[2J\n"  # what a library printed before is not the step's last word
        f"autorl agent-runner: error: {HUB_REFUSAL}\x1b]8;;\n"
    )
    await job_pod(platform, ref.prepare_job_name, failed_pod_status("cache", 2, log))
    verdict = "Container cache for pod x failed with exit code 2 matching FailJob rule at index 0"
    await platform.patch_job_status(
        ref.prepare_job_name, {"failed": 1, "conditions": [failed("PodFailurePolicy", verdict)]}
    )
    done = await platform.wait_phase(name, "Failed")
    status = done["status"]
    assert status["reason"] == "PrepareFailed"
    assert status["message"].startswith(
        "the prepare Job failed (PodFailurePolicy): container cache exited with code 2: "
        f"autorl agent-runner: error: {HUB_REFUSAL}"
    ), status["message"]
    assert f"kubectl logs job/{ref.prepare_job_name}" in status["message"]
    assert "\x1b" not in status["message"] and "\\x1b]8;;" in status["message"]
    await platform.wait_events(
        name, lambda events: any(r == "Failed" and HUB_REFUSAL in m for r, m in events), "the Failed Event"
    )
    for path in (f"{JOBS}/{ref.agent_job_name}",):
        assert await platform.get(path) is None


async def test_a_waiting_agent_pod_names_its_cause_then_training(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "wait-agent-image"
    manifest = load_example("experiment-custom-agent.yaml", rename=name)
    ref, running = await platform.start_running(manifest, tiny_base_model)
    assert running["status"]["reason"] == "PodStarting"
    image = manifest["spec"]["agent"]["image"]
    pod = await job_pod(
        platform,
        ref.agent_job_name,
        {
            "phase": "Pending",
            "containerStatuses": [waiting_container("agent", image, "ErrImagePull", "unauthorized")],
        },
    )
    pulling = await platform.wait_for(
        f"{EXPERIMENTS}/{name}",
        lambda obj: obj["status"].get("reason") == "ImagePullFailed",
        "the pull failure",
    )
    assert (
        f"the agent pod cannot pull image {image} (ErrImagePull: unauthorized)"
        in pulling["status"]["message"]
    )
    assert not pulling["status"].get("deadline")  # no budget is spent while the image is not there
    await platform.set_agent_running(pod, datetime.datetime.now(datetime.UTC))
    training = await platform.wait_for(
        f"{EXPERIMENTS}/{name}", lambda obj: obj["status"].get("reason") == "Training", "training"
    )
    assert training["status"]["message"] == "the agent is training"
    assert training["status"]["budgetLeft"] and training["status"]["queue"].startswith("0 in flight")
    await finish_agent(platform, ref)
