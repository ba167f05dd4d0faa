"""The real kopf operator loop against the kmock Kubernetes API emulator and a real grader.

The grader is the real FastAPI app over HTTP on this run's own Postgres database. The emulator has no
kubelet, Job controller or garbage collector, so the test plays them where a cluster would: it does
what the prepare Job's pod does (fill the shared cache), runs the evaluator on the queued baseline,
submits like an agent, and patches Jobs' status as the Job controller would. Everything the operator
does — registering, Secrets, Jobs, NetworkPolicy, status, Events, cleanup — goes through the API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import math
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
import httpx
import kmock
import pytest
import pytest_asyncio
import yaml

from autorl.checkpoints import model_dir_name
from autorl.experiment import crd_manifest
from autorl.settings import Settings, load_settings
from autorl.tasks import get_task
from autorl_controller.operator.main import run_operator
from autorl_controller.operator.manifests import ExperimentRef, agent_run_as_id, cached_model_subpath
from autorl_controller.operator.settings import ControllerSettings
from autorl_grader.main import create_app
from tests.support.infra import free_port, serve

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DATA = REPO / "tests" / "data"
NAMESPACE = "autorl-e2e"
EXPERIMENTS = "/apis/autorl.io/v1alpha1/namespaces/autorl-e2e/experiments"
JOBS = "/apis/batch/v1/namespaces/autorl-e2e/jobs"
SECRETS = "/api/v1/namespaces/autorl-e2e/secrets"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/autorl-e2e/networkpolicies"
EVENTS = "/api/v1/namespaces/autorl-e2e/events"
TICK_S = 0.2
WAIT_S = 60.0


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what an API server does on create: uid, resourceVersion, timestamps,
    and a name from ``generateName`` (kopf posts Events that way)."""

    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).isoformat())
            meta["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)


def declare_resources(emulator: kmock.KubernetesEmulator) -> None:
    verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    for path, kind, namespaced, subresources in (
        ("autorl.io/v1alpha1/experiments", "Experiment", True, {"status"}),
        ("batch/v1/jobs", "Job", True, {"status"}),
        ("v1/secrets", "Secret", True, set()),
        ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy", True, set()),
        ("v1/events", "Event", True, set()),
        # kopf's start-up waits for these two core resources to be discoverable.
        ("v1/namespaces", "Namespace", False, set()),
        ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, set()),
    ):
        emulator.resources[path] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs=verbs, subresources=subresources
        )


@dataclass
class Platform:
    kube: httpx.AsyncClient
    grader: httpx.AsyncClient
    grader_settings: Settings
    shared: Path

    async def apply(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"]["namespace"] = NAMESPACE
        response = await self.kube.post(EXPERIMENTS, json=manifest)
        assert response.status_code < 300, response.text

    async def get(self, path: str) -> dict[str, Any] | None:
        response = await self.kube.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def wait_for(self, path: str, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Poll the emulator until the object satisfies ``check`` (the operator reacts asynchronously)."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        last: dict[str, Any] | None = None
        while asyncio.get_running_loop().time() < deadline:
            last = await self.get(path)
            if last is not None and check(last):
                return last
            await asyncio.sleep(TICK_S / 2)
        raise AssertionError(f"timed out waiting for {what}; last seen: {last}")

    async def wait_phase(self, name: str, phase: str) -> dict[str, Any]:
        return await self.wait_for(
            f"{EXPERIMENTS}/{name}",
            lambda obj: (obj.get("status") or {}).get("phase") == phase,
            f"{name} {phase}",
        )

    async def wait_gone(self, path: str) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while await self.get(path) is not None:
            assert asyncio.get_running_loop().time() < deadline, f"{path} still exists"
            await asyncio.sleep(TICK_S / 2)

    async def patch_job_status(self, name: str, status: dict[str, Any]) -> None:
        """What the Job controller would write."""
        response = await self.kube.patch(
            f"{JOBS}/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()

    async def events(self, name: str) -> list[tuple[str, str]]:
        body = await self.get(EVENTS)
        assert body is not None
        return [
            (event.get("reason", ""), event.get("message", ""))
            for event in body["items"]
            if event.get("involvedObject", {}).get("name") == name
        ]

    def run_prepare_pod(self, spec: dict[str, Any], ref: ExperimentRef, tiny_model: Path) -> None:
        """What the prepare Job's pod leaves on the shared volume: the model and train split in the
        cache, and the laid-out workspace (the agent runner's own code).

        The hub is out of reach here, so a tiny model stands in for the hub id under its cache path.
        """
        from autorl_agent_runner.workspace import create_workspace

        model_dir = self.shared / "cache" / "models" / cached_model_subpath(spec["model"])
        if not model_dir.exists():
            shutil.copytree(tiny_model, model_dir)
        task = get_task(spec["task"])
        data_dir = self.shared / "cache" / "data" / task.name
        task.download_train_data(data_dir, source_dir=FIXTURE_DATA)
        create_workspace(
            self.shared / ref.workspace_subpath,
            run_id=ref.grader_name,
            task_name=task.name,
            description=task.description(),
            base_model_dir=model_dir,
            base_model_name=model_dir_name(spec["model"]),
            train_data_dir=data_dir,
            timeout_s=spec["timeoutSeconds"],
        )

    async def run_evaluator(self, ref: ExperimentRef) -> None:
        """One evaluator pass over this experiment's baseline, for real. Not simply the oldest
        claimable row: another test's experiment may have left its baseline queued."""
        from autorl.store import Database
        from autorl.store import repository as repo
        from autorl_evaluator.jobs import evaluate

        db = Database(self.grader_settings.database_url or "")
        try:
            with db.session() as session:
                submission_id = repo.get_experiment(session, ref.grader_name).baseline_submission_id
        finally:
            db.dispose()
        assert submission_id is not None, f"{ref.grader_name} has no baseline submission"
        await asyncio.to_thread(evaluate, submission_id, self.grader_settings)

    async def agent_credentials(self, name: str) -> tuple[str, str]:
        secret = await self.get(f"{SECRETS}/{ExperimentRef(name, NAMESPACE).secret_name}")
        assert secret is not None
        data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        return data["GRADING_SERVER_URL"], data["AUTORL_TOKEN"]

    async def through_baseline(self, manifest: dict[str, Any], tiny_model: Path) -> dict[str, Any]:
        """Drive an applied Experiment to Running, playing the prepare pod and the evaluator."""
        name = manifest["metadata"]["name"]
        ref = ExperimentRef(name, NAMESPACE)
        await self.wait_for(f"{JOBS}/{ref.prepare_job_name}", lambda _: True, "the prepare Job")
        self.run_prepare_pod(manifest["spec"], ref, tiny_model)
        await self.patch_job_status(ref.prepare_job_name, {"succeeded": 1, "conditions": [complete()]})
        await self.wait_phase(name, "Baseline")
        await self.run_evaluator(ref)
        return await self.wait_phase(name, "Running")


def complete() -> dict[str, str]:
    return {"type": "Complete", "status": "True", "reason": "CompletionsReached"}


def failed(reason: str, message: str) -> dict[str, str]:
    return {"type": "Failed", "status": "True", "reason": reason, "message": message}


def load_example(name: str, *, rename: str | None = None) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    if rename:
        manifest["metadata"]["name"] = rename
    return manifest


@pytest.fixture(scope="module")
def grader_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def grader_settings(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, run_id: str, grader_port: int
) -> Settings:
    home = tmp_path_factory.mktemp("grader-home")
    return load_settings(
        home=home,
        # As the chart does: the URL agents are given is the grader's own address.
        public_url=f"http://127.0.0.1:{grader_port}",
        database_url=pg_url,
        admin_token=secrets.token_hex(16),
        data_source_dir=FIXTURE_DATA,
        eval_device="cpu",
        eval_limit=4,
        eval_max_new_tokens=24,
        eval_batch_size=4,
        submit_wait_s=30.0,
        redis_key_prefix=f"autorl-test-{run_id}",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def platform(
    grader_settings: Settings, grader_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Platform]:
    shared = tmp_path_factory.mktemp("shared")
    with serve(create_app(grader_settings), port=grader_port) as grader:
        async with ApiServerEmulator() as emulator, kmock.Server(emulator):
            declare_resources(emulator)
            api_url = str(emulator.url).rstrip("/")
            async with httpx.AsyncClient(base_url=api_url) as kube:
                crd = await kube.post(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd_manifest()
                )
                assert crd.status_code < 300, crd.text
                settings = ControllerSettings(
                    grader_url=grader.url,
                    admin_token=grader_settings.admin_token,
                    kube_api_url=api_url,
                    watch_namespaces=[NAMESPACE],
                    shared_mount=str(shared),
                    shared_pvc="autorl-shared",
                    runner_image="registry.example/autorl-agent-runner:0.1.0",
                    grader_namespace="autorl",
                    sync_interval_s=TICK_S,
                    deadline_grace_s=0,
                    finish_wait_s=30.0,
                    request_timeout_s=10.0,
                )
                stop, ready = asyncio.Event(), asyncio.Event()
                operator = asyncio.create_task(
                    run_operator(settings, stop_flag=stop, ready_flag=ready, liveness=False)
                )
                await asyncio.wait_for(ready.wait(), timeout=30)
                async with httpx.AsyncClient(base_url=grader.url) as grader_client:
                    try:
                        yield Platform(kube, grader_client, grader_settings, shared)
                    finally:
                        stop.set()
                        # kopf ends its own tasks by cancelling them, which the awaiting side then sees.
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait_for(operator, timeout=30)


async def test_example_experiment_runs_to_succeeded_with_grader_scores(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-grpo"
    ref = ExperimentRef(name, NAMESPACE)
    manifest = load_example("experiment-gsm8k.yaml")
    await platform.apply(manifest)

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
    assert policy["spec"]["ingress"] == [] and len(policy["spec"]["egress"]) == 2  # DNS and the grader only

    # The pod starts: the budget starts with it.
    await platform.patch_job_status(ref.agent_job_name, {"active": 1})
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

    await platform.patch_job_status(
        ref.agent_job_name, {"active": 0, "succeeded": 1, "conditions": [complete()]}
    )
    done = await platform.wait_phase(name, "Succeeded")
    status = done["status"]
    assert status["baselineScore"] == pytest.approx(baseline)
    assert status["bestScore"] == pytest.approx(baseline)
    assert status["improvement"] == pytest.approx(0.0)
    assert status["submissions"] == 1
    assert status["completionTime"] and "best" in status["message"]

    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
    assert view["status"] == "completed"
    reasons = [reason for reason, _ in await platform.events(name)]
    for phase in ("Pending", "Preparing", "Baseline", "Running", "Finishing", "Succeeded"):
        assert phase in reasons, reasons

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


def admin(platform: Platform) -> dict[str, str]:
    token = platform.grader_settings.admin_token
    assert token is not None
    return {"Authorization": f"Bearer {token.get_secret_value()}"}


async def test_failed_agent_job_ends_failed_with_reason_and_scores(
    platform: Platform, tiny_base_model: Path
) -> None:
    name = "gsm8k-llm-agent"
    ref = ExperimentRef(name, NAMESPACE)
    manifest = load_example("experiment-custom-agent.yaml")
    await platform.apply(manifest)
    running = await platform.through_baseline(manifest, tiny_base_model)

    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    pod = job["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert agent["image"] == manifest["spec"]["agent"]["image"]
    assert agent["command"] == ["python", "-m", "llm_agent"]
    assert {"secretRef": {"name": "llm-api-key"}} in agent["envFrom"]

    await platform.patch_job_status(ref.agent_job_name, {"active": 1})
    await platform.patch_job_status(
        ref.agent_job_name,
        {
            "active": 0,
            "failed": 1,
            "conditions": [failed("BackoffLimitExceeded", "Job has reached the specified backoff limit")],
        },
    )
    done = await platform.wait_phase(name, "Failed")
    assert "BackoffLimitExceeded" in done["status"]["message"]
    assert done["status"]["baselineScore"] == pytest.approx(running["status"]["baselineScore"])
    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
    assert view["status"] == "failed"
    assert ("Failed", done["status"]["message"]) in await platform.events(name)


@pytest.mark.parametrize("how", ["job-deadline-exceeded", "controller-clock"])
async def test_agent_past_its_deadline_ends_timed_out(
    platform: Platform, tiny_base_model: Path, how: str
) -> None:
    name = f"gsm8k-late-{how}"[:50]
    ref = ExperimentRef(name, NAMESPACE)
    manifest = load_example("experiment-gsm8k.yaml", rename=name)
    if how == "controller-clock":
        manifest["spec"]["timeoutSeconds"] = 1
    await platform.apply(manifest)
    await platform.through_baseline(manifest, tiny_base_model)
    await platform.patch_job_status(ref.agent_job_name, {"active": 1})
    if how == "job-deadline-exceeded":
        # Kubernetes itself stops the Job at activeDeadlineSeconds.
        await platform.patch_job_status(
            ref.agent_job_name,
            {
                "active": 0,
                "failed": 1,
                "conditions": [failed("DeadlineExceeded", "Job was active longer than specified")],
            },
        )
    done = await platform.wait_phase(name, "TimedOut")
    assert "end of its budget" in done["status"]["message"]
    assert done["status"]["baselineScore"] is not None and done["status"]["deadline"]
    if how == "controller-clock":
        # The Job still ran past the budget and its grace: the controller stopped it.
        assert await platform.get(f"{JOBS}/{ref.agent_job_name}") is None
    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
    assert view["status"] == "timed_out"


async def test_custom_image_agent_is_stopped_by_kubernetes_at_its_budgets_end(
    platform: Platform, tiny_base_model: Path
) -> None:
    """Nothing inside a custom image keeps time: the Job's own deadline is moved to the budget's end,
    so the Job controller deletes the pod then (SIGTERM), and the kubelet kills it a grace period
    later (SIGKILL), whether or not the controller is running at that moment."""
    name = "gsm8k-custom-deadline"
    ref = ExperimentRef(name, NAMESPACE)
    manifest = load_example("experiment-custom-agent.yaml", rename=name)
    manifest["spec"]["timeoutSeconds"] = 600
    await platform.apply(manifest)
    await platform.through_baseline(manifest, tiny_base_model)
    job = await platform.get(f"{JOBS}/{ref.agent_job_name}")
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert (
        pod["terminationGracePeriodSeconds"] == ControllerSettings().agent_stop_grace_s
    )  # SIGTERM → SIGKILL
    backstop = job["spec"]["activeDeadlineSeconds"]
    assert backstop == 600  # from the Job's start, before the budget is known: never past its end

    # The Job started 95 s ago (scheduling, a slow image pull); its pod runs now: the budget starts.
    job_start = datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(seconds=95)
    await platform.patch_job_status(
        ref.agent_job_name, {"active": 1, "startTime": job_start.strftime("%Y-%m-%dT%H:%M:%SZ")}
    )
    tightened = await platform.wait_for(
        f"{JOBS}/{ref.agent_job_name}",
        lambda obj: obj["spec"]["activeDeadlineSeconds"] != backstop,
        "the Job's deadline to follow the budget",
    )
    seen_at = time.time()
    view = (await platform.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(platform))).json()
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
    await platform.patch_job_status(
        ref.agent_job_name,
        {
            "active": 0,
            "failed": 1,
            "conditions": [failed("DeadlineExceeded", "Job was active longer than specified")],
        },
    )
    done = await platform.wait_phase(name, "TimedOut")
    assert "end of its budget" in done["status"]["message"]
    assert await platform.get(f"{JOBS}/{ref.agent_job_name}") is not None


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
    ref = ExperimentRef(name, NAMESPACE)
    # It never passed through Pending, the only phase in which anything is created or registered.
    assert await platform.get(f"{SECRETS}/{ref.secret_name}") is None
    assert await platform.get(f"{JOBS}/{ref.prepare_job_name}") is None
    events = await platform.events(name)
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
    first, second = colliding_names(ControllerSettings())
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
