"""A stand-in for the cluster the operator runs in: kmock's Kubernetes API emulator, with what the
tests play where a cluster would (the Job controller, the scheduler, the kubelet, the prepare pod),
beside the real grader and the real kopf operator loop (:func:`operator_platform`).

The emulator has no kubelet, Job controller or garbage collector: :class:`Platform` does what the
prepare Job's pod does (fill the shared cache), runs the evaluator on the queued baseline, and
patches Jobs' status and creates pods and Events as those controllers would. Everything the
operator does goes through the emulated API.

The emulated API server refuses what a real one would refuse the controller
(:meth:`ApiServerEmulator._refusal`): RBAC from the chart's own rendered Role and bindings
(tests/support/kube_rbac.py), the Kubernetes schema of every object it writes (kubernetes-validate),
and Pod Security "restricted" in :data:`NAMESPACE` (tests/support/pod_security.py); a CRD whose CEL
rules read an unbounded string, list or map, and from anyone a custom resource past its CRD's
``maxLength``, ``maxItems`` or ``maxProperties`` (tests/support/crd_bounds.py). A request with
:data:`CLUSTER_TOKEN` is the cluster's own components' (what the tests play) and passes RBAC and the
schema; any other is the controller's, as its ServiceAccount's token would make it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import itertools
import json
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import httpx
import jsonschema
import kmock
import kubernetes_validate
import yaml

from autorl.crd import crd_manifest
from autorl.layout import cached_model_subpath
from autorl.models.sources import model_dir_name
from autorl.tasks import get_task
from autorl_controller.operator.main import run_operator
from autorl_controller.operator.manifests import ExperimentRef
from autorl_controller.operator.settings import ControllerSettings
from autorl_grader.main import create_app
from tests.support.chart import render_chart
from tests.support.crd_bounds import crd_refusal, object_refusal
from tests.support.infra import serve
from tests.support.kube_rbac import (
    Attributes,
    Authorizer,
    ServiceAccountUser,
    forbidden_path_status,
    forbidden_status,
    request_verb,
)
from tests.support.kube_status import failure
from tests.support.pod_security import forbidden_pod_status, violations, would_violate_warning
from tests.support.settings import DeploymentSettings

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DATA = REPO / "tests" / "data"
NAMESPACE = "autorl-e2e"
EXPERIMENTS = "/apis/autorl.io/v1alpha1/namespaces/autorl-e2e/experiments"
JOBS = "/apis/batch/v1/namespaces/autorl-e2e/jobs"
SECRETS = "/api/v1/namespaces/autorl-e2e/secrets"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/autorl-e2e/networkpolicies"
EVENTS = "/api/v1/namespaces/autorl-e2e/events"
PODS = "/api/v1/namespaces/autorl-e2e/pods"
CONFIGMAPS = "/api/v1/namespaces/autorl-e2e/configmaps"
#: Where the grader's Service lives (the platform's namespace, not the experiments').
GRADER_NAMESPACE = "autorl"
GRADER_SERVICE = f"/api/v1/namespaces/{GRADER_NAMESPACE}/services"
PULL_SECRETS = ["registry-pull"]
RUNNER_IMAGE = "registry.example/autorl-agent-runner:0.1.0"
TICK_S = 0.2
WAIT_S = 60.0


#: The bearer token of the cluster's own components that the tests play (the Job controller, the
#: kubelet, the scheduler, an administrator's kubectl): they are not the controller, and RBAC and the
#: schema check pass them by.
CLUSTER_TOKEN = "emulated-cluster-admin"
#: The chart's release the controller's ServiceAccount and Roles come from (in the grader's namespace).
RELEASE = "autorl"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
#: Groups whose objects the Kubernetes OpenAPI schema describes (not the CRD's).
BUILTIN_GROUPS = frozenset({"", "batch", "networking.k8s.io", "apps", "rbac.authorization.k8s.io"})
#: CustomResourceDefinitions: their group and resource.
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
#: Resources whose pod template the PodSecurity admission checks (warns; their pods are refused).
POD_TEMPLATES = {"jobs": ("spec", "template", "spec")}


def controller_rbac() -> list[dict[str, Any]]:
    """The chart's objects for a release whose controller watches :data:`NAMESPACE`, as Helm renders
    them: the controller's ServiceAccount and Deployment, its Roles and RoleBindings among them."""
    return render_chart(
        {"controller": {"watchNamespaces": [NAMESPACE]}}, release=RELEASE, namespace=GRADER_NAMESPACE
    )


def controller_user(manifests: list[dict[str, Any]]) -> ServiceAccountUser:
    """The user the controller's pod is: its Deployment's ServiceAccount in the release's namespace."""
    (deployment,) = [
        doc
        for doc in manifests
        if doc["kind"] == "Deployment"
        and doc["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"
    ]
    return ServiceAccountUser(GRADER_NAMESPACE, deployment["spec"]["template"]["spec"]["serviceAccountName"])


def chart_authorizer(manifests: list[dict[str, Any]] | None = None) -> Authorizer:
    """RBAC for the controller's ServiceAccount from the chart's rendered manifests (None: render them)."""
    documents = controller_rbac() if manifests is None else manifests
    return Authorizer(documents, controller_user(documents))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what the API server stores after a merge-patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def field_path(error: jsonschema.ValidationError) -> str:
    """A schema error's place as the API server writes it: ``spec.template.spec.containers[0].image``."""
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def schema_status(obj: dict[str, Any], group: str, error: jsonschema.ValidationError) -> dict[str, Any]:
    """The API server's refusal of an object its schema does not admit: an unknown field as strict field
    validation answers it (400), any other error as validation does (422)."""
    kind = obj.get("kind", "")
    name = obj.get("metadata", {}).get("name", "")
    where = field_path(error)
    if error.validator == "additionalProperties":
        fields = [f"{where}.{field}" if where else field for field in re.findall(r"'([^']+)'", error.message)]
        version = str(obj.get("apiVersion", "")).rsplit("/", 1)[-1]
        unknown = ", ".join(f'unknown field "{field}"' for field in fields)
        message = (
            f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {unknown}'
        )
        return failure(400, "BadRequest", message)
    qualified = f"{kind}.{group}" if group else kind
    cause = f"Invalid value: {json.dumps(error.instance)}: {error.message}"
    causes = [{"reason": "FieldValueInvalid", "message": cause, "field": where}]
    return failure(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {where}: {cause}',
        {"name": name, "group": group, "kind": kind, "causes": causes},
    )


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what an API server does on create (uid, resourceVersion, timestamps, a
    name from ``generateName``: kopf posts Events that way) and what it refuses (:meth:`_refusal`)."""

    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    #: RBAC of the controller's ServiceAccount; None: every request is allowed.
    authorizer: Authorizer | None = None
    #: Namespaces labelled ``pod-security.kubernetes.io/enforce: restricted``.
    restricted_namespaces: frozenset[str] = frozenset()
    #: The CRDs admitted, by the group and plural of their resources.
    crds: dict[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)
    #: Seconds a slow API server takes to answer the controller's GET of a path.
    slow_reads: dict[str, float] = attrs.field(factory=dict)
    #: How many of those slow reads have begun.
    slow_reads_begun: int = 0

    async def _handle(self, request: kmock.Request) -> Any:
        delay = self.slow_reads.get(request.url.path)
        if delay is not None and str(request.method.value) == "GET" and not self._is_cluster(request):
            self.slow_reads_begun += 1
            await asyncio.sleep(delay)
        refusal = self._refusal(request)
        if refusal is not None:
            return aiohttp.web.json_response(refusal, status=refusal["code"])
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).isoformat())
            meta["resourceVersion"] = str(next(self._versions))
        response = await super()._handle(request)
        warning = self._pod_template_warning(request)
        if warning is not None and not response.prepared:
            response.headers.add("Warning", warning)
        return response

    def _is_cluster(self, request: kmock.Request) -> bool:
        return any(
            key.lower() == "authorization" and value == f"Bearer {CLUSTER_TOKEN}"
            for key, value in request.headers.items()
        )

    def _attributes(self, request: kmock.Request) -> Attributes | None:
        """The authorizer's attributes of a resource request; None: a non-resource path."""
        resource = request.resource
        if resource is None or resource.group is None or resource.version is None:
            return None
        verb = request_verb(str(request.method.value), named=request.name is not None, params=request.params)
        if resource.plural is None:
            if request.namespace is None:
                return None  # /api/v1, /apis/group/version: discovery
            # /api/v1/namespaces/NAME: the Namespace object itself
            verb = request_verb(str(request.method.value), named=True, params=request.params)
            return Attributes(verb, "", "namespaces", None, request.namespace)
        return Attributes(
            verb,
            str(resource.group),
            str(resource.plural),
            request.namespace,
            request.name or "",
            request.subresource or "",
        )

    def _refusal(self, request: kmock.Request) -> dict[str, Any] | None:
        """The Status a real API server answers instead of serving the request, or None."""
        controller = self.authorizer is not None and not self._is_cluster(request)
        attributes = self._attributes(request)
        if controller and self.authorizer is not None:
            if attributes is None:
                verb = request_verb(str(request.method.value), named=True, params=request.params)
                if not self.authorizer.allows_path(verb, request.url.path):
                    return forbidden_path_status(verb, request.url.path, self.authorizer.user)
            elif not self.authorizer.allows(attributes):
                return forbidden_status(attributes, self.authorizer.user)
        if attributes is None or not isinstance(request.data, dict):
            return None
        creates_pod = attributes.verb == "create" and attributes.combined_resource == "pods"
        if creates_pod and request.namespace in self.restricted_namespaces:
            found = violations(request.data.get("spec") or {})
            if found:
                return forbidden_pod_status(request.data.get("metadata", {}).get("name") or "", found)
        writes = attributes.verb in ("create", "patch", "update")
        if writes and (attributes.group, attributes.resource) == CRDS:
            crd = self._written(request, attributes)
            refused = None if crd is None else crd_refusal(crd)
            if crd is not None and refused is None:
                self.crds[(crd["spec"]["group"], crd["spec"]["names"]["plural"])] = crd
            return refused
        if writes and (attributes.group, attributes.resource) in self.crds:
            written = self._written(request, attributes)
            if written is not None:
                return object_refusal(self.crds[(attributes.group, attributes.resource)], written)
        if (
            controller
            and attributes.group in BUILTIN_GROUPS
            and attributes.verb in ("create", "patch", "update")
        ):
            written = self._written(request, attributes)
            if written is not None:
                try:
                    kubernetes_validate.validate(written, KUBERNETES_VERSION, strict=True)
                except jsonschema.ValidationError as error:
                    return schema_status(written, attributes.group, error)
        return None

    def _written(self, request: kmock.Request, attributes: Attributes) -> dict[str, Any] | None:
        """The object as the API server would store it after this request."""
        resource = request.resource
        assert resource is not None
        if attributes.verb == "patch":
            key = (resource, request.namespace, str(request.name))
            if key not in self.objects or self.objects[key].deleted:
                return None  # the emulator answers 404
            written = dict(merge_patch(self.objects[key].raw, request.data))
        else:
            written = dict(request.data)
        # A body may leave its type out: the API server takes it from the path (kopf's Events do).
        group_version = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
        written.setdefault("apiVersion", group_version)
        written.setdefault("kind", self.resources[f"{group_version}/{resource.plural}"].kind)
        return written

    def _pod_template_warning(self, request: kmock.Request) -> str | None:
        """The PodSecurity admission's warning for a workload whose pods it would refuse."""
        resource = request.resource
        if (
            resource is None
            or request.namespace not in self.restricted_namespaces
            or request.action != kmock.action.CREATE
            or not isinstance(request.data, dict)
            or resource.plural not in POD_TEMPLATES
        ):
            return None
        found = violations(_dig(request.data, POD_TEMPLATES[str(resource.plural)]) or {})
        return would_violate_warning(found) if found else None


def declare_resources(emulator: kmock.KubernetesEmulator) -> None:
    verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    for path, kind, namespaced, subresources in (
        ("autorl.io/v1alpha1/experiments", "Experiment", True, {"status"}),
        ("batch/v1/jobs", "Job", True, {"status"}),
        ("v1/secrets", "Secret", True, set()),
        ("v1/services", "Service", True, set()),
        ("v1/configmaps", "ConfigMap", True, set()),
        ("v1/pods", "Pod", True, {"status"}),
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
    grader_settings: DeploymentSettings
    shared: Path
    emulator: ApiServerEmulator

    async def apply(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"]["namespace"] = NAMESPACE
        response = await self.kube.post(EXPERIMENTS, json=manifest)
        assert response.status_code < 300, response.text

    async def ref(self, name: str) -> ExperimentRef:
        """The Experiment's identity as the controller sees it: namespace, name and uid."""
        experiment = await self.get(f"{EXPERIMENTS}/{name}")
        assert experiment is not None, name
        return ExperimentRef(name, NAMESPACE, experiment["metadata"]["uid"])

    async def create(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        manifest["metadata"]["namespace"] = NAMESPACE
        response = await self.kube.post(path, json=manifest)
        assert response.status_code < 300, response.text
        body: dict[str, Any] = response.json()
        return body

    async def run_agent_pod(
        self, ref: ExperimentRef, *, started: datetime.datetime | None = None, pending: bool = False
    ) -> str:
        """What the Job controller and the kubelet do: a pod of the agent's Job, Pending (scheduled,
        pulling its image) or with the agent's container running since ``started``; returns its name."""
        job = await self.get(f"{JOBS}/{ref.agent_job_name}")
        assert job is not None
        uid = job["metadata"]["uid"]
        name = f"{ref.agent_job_name}-{uuid.uuid4().hex[:5]}"
        state = (
            {"waiting": {"reason": "ContainerCreating"}}
            if pending
            else {"running": {"startedAt": iso(started or datetime.datetime.now(datetime.UTC))}}
        )
        await self.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {"batch.kubernetes.io/controller-uid": uid, "job-name": ref.agent_job_name},
                    "ownerReferences": [
                        {"apiVersion": "batch/v1", "kind": "Job", "name": ref.agent_job_name, "uid": uid}
                    ],
                },
                "spec": job["spec"]["template"]["spec"],
                "status": {
                    "phase": "Pending" if pending else "Running",
                    "containerStatuses": [{"name": "agent", "state": state}],
                },
            },
        )
        await self.patch_job_status(ref.agent_job_name, {"active": 1})
        return name

    async def set_agent_running(self, pod: str, started: datetime.datetime) -> None:
        response = await self.kube.patch(
            f"{PODS}/{pod}/status",
            json={
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "agent", "state": {"running": {"startedAt": iso(started)}}}
                    ],
                }
            },
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()

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

    async def end_agent_job(self, ref: ExperimentRef, condition: dict[str, str]) -> None:
        """The agent's Job ended as the Job controller writes it: no pod active, one succeeded
        (``complete()``) or failed (``failed(...)``), and the condition."""
        ended = "succeeded" if condition["type"] == "Complete" else "failed"
        await self.patch_job_status(ref.agent_job_name, {"active": 0, ended: 1, "conditions": [condition]})

    async def grader_view(self, ref: ExperimentRef) -> dict[str, Any]:
        """The grader's admin view of the experiment."""
        response = await self.grader.get(f"/v1/experiments/{ref.grader_name}", headers=admin(self))
        result: dict[str, Any] = response.json()
        return result

    async def events(self, name: str) -> list[tuple[str, str]]:
        """The (reason, message) of each Event about ``name`` posted so far."""
        body = await self.get(EVENTS)
        assert body is not None
        return _events_about(body, name)

    async def wait_events(
        self, name: str, check: Callable[[list[tuple[str, str]]], bool], what: str
    ) -> list[tuple[str, str]]:
        """The Events about ``name`` once they satisfy ``check``: the operator posts an Event after
        the status it reports (kopf posts them from a queue of its own)."""
        body = await self.wait_for(EVENTS, lambda body: check(_events_about(body, name)), what)
        return _events_about(body, name)

    def run_prepare_pod(self, spec: dict[str, Any], ref: ExperimentRef, tiny_model: Path) -> None:
        """What the prepare Job's pod leaves on the shared volume: the model and train split in the
        cache, and the laid-out workspace (the agent runner's own code).

        The hub is out of reach here, so a tiny model stands in for the hub id under its cache path.
        """
        from autorl_agent_runner.workspace.layout import create_workspace

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
        from autorl.store import Database, experiments
        from autorl_evaluator.jobs import evaluate

        db = Database(self.grader_settings.database_url or "")
        try:
            with db.session() as session:
                submission_id = experiments.get_experiment(session, ref.grader_name).baseline_submission_id
        finally:
            db.dispose()
        assert submission_id is not None, f"{ref.grader_name} has no baseline submission"
        await asyncio.to_thread(evaluate, submission_id, self.grader_settings)

    async def agent_credentials(self, name: str) -> tuple[str, str]:
        secret = await self.get(f"{SECRETS}/{ExperimentRef(name, NAMESPACE).secret_name}")
        assert secret is not None
        data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        return data["GRADING_SERVER_URL"], data["AUTORL_TOKEN"]

    async def prepare_job(self, ref: ExperimentRef) -> dict[str, Any]:
        """This run's prepare Job, once the controller has created it."""
        return await self.wait_for(
            f"{JOBS}/{ref.prepare_job_name}",
            lambda job: job["metadata"]["ownerReferences"][0]["uid"] == ref.uid,
            "this run's prepare Job",
        )

    async def applied(self, manifest: dict[str, Any]) -> ExperimentRef:
        """Apply an Experiment and wait for the controller's prepare Job: the Experiment's identity."""
        await self.apply(manifest)
        ref = await self.ref(manifest["metadata"]["name"])
        await self.prepare_job(ref)
        return ref

    async def start_running(
        self, manifest: dict[str, Any], tiny_model: Path
    ) -> tuple[ExperimentRef, dict[str, Any]]:
        """Apply an Experiment and drive it to Running (:meth:`through_baseline`): its identity and
        the Experiment as it is then."""
        await self.apply(manifest)
        ref = await self.ref(manifest["metadata"]["name"])
        return ref, await self.through_baseline(manifest, tiny_model)

    async def through_baseline(self, manifest: dict[str, Any], tiny_model: Path) -> dict[str, Any]:
        """Drive an applied Experiment to Running, playing the prepare pod and the evaluator."""
        name = manifest["metadata"]["name"]
        ref = await self.ref(name)
        await self.prepare_job(ref)
        self.run_prepare_pod(manifest["spec"], ref, tiny_model)
        await self.patch_job_status(ref.prepare_job_name, {"succeeded": 1, "conditions": [complete()]})
        await self.wait_phase(name, "Baseline")
        await self.run_evaluator(ref)
        return await self.wait_phase(name, "Running")


def iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def complete() -> dict[str, str]:
    return {"type": "Complete", "status": "True", "reason": "CompletionsReached"}


def failed(reason: str, message: str) -> dict[str, str]:
    return {"type": "Failed", "status": "True", "reason": reason, "message": message}


def load_example(name: str, *, rename: str | None = None) -> dict[str, Any]:
    """An Experiment of examples/, optionally under another name."""
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    if rename:
        manifest["metadata"]["name"] = rename
    return manifest


def admin(platform: Platform) -> dict[str, str]:
    """The headers of the grader's admin API."""
    token = platform.grader_settings.admin_token
    assert token is not None
    return {"Authorization": f"Bearer {token.get_secret_value()}"}


async def runs_named(platform: Platform, name: str) -> dict[str, dict[str, Any]]:
    """The grader's records of every run of ``name`` in this namespace, by grader name."""
    listed = await platform.grader.get("/v1/experiments", headers=admin(platform))
    assert listed.status_code == 200, listed.text
    prefix = f"{NAMESPACE}.{name}."
    return {view["name"]: view for view in listed.json() if view["name"].startswith(prefix)}


async def job_pod(platform: Platform, job_name: str, status: dict[str, Any]) -> str:
    """A pod of that Job as the Job controller creates it, with the status the scheduler or kubelet
    reports; returns its name."""
    job = await platform.get(f"{JOBS}/{job_name}")
    assert job is not None
    uid = job["metadata"]["uid"]
    name = f"{job_name}-{uuid.uuid4().hex[:5]}"
    await platform.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"batch.kubernetes.io/controller-uid": uid, "job-name": job_name},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid}],
            },
            "spec": job["spec"]["template"]["spec"],
            "status": status,
        },
    )
    return name


async def warning_event(platform: Platform, about: str, kind: str, reason: str, message: str) -> None:
    """A Warning Event as the Job controller, scheduler or kubelet posts it."""
    await platform.create(
        EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about}."},
            "involvedObject": {"kind": kind, "name": about, "namespace": NAMESPACE},
            "type": "Warning",
            "reason": reason,
            "message": message,
            "lastTimestamp": iso(datetime.datetime.now(datetime.UTC)),
        },
    )


def waiting_container(name: str, image: str, reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "state": {"waiting": {"reason": reason, "message": message}},
        **extra,
    }


async def finish_agent(platform: Platform, ref: ExperimentRef) -> dict[str, Any]:
    """What the Job controller writes when the agent's Job succeeds; returns the Succeeded Experiment."""
    await platform.patch_job_status(
        ref.agent_job_name, {"active": 0, "succeeded": 1, "conditions": [complete()]}
    )
    return await platform.wait_phase(ref.name, "Succeeded")


#: What the scheduler says of a pod no node has the GPUs for, and the kubelet of an image it cannot pull.
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available"
PULL_ERROR = f'failed to pull "{RUNNER_IMAGE}": not found'


async def cause_unschedulable(platform: Platform, job: str) -> None:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": UNSCHEDULABLE,
    }
    await job_pod(platform, job, {"phase": "Pending", "conditions": [condition]})


async def waiting_prepare_pod(
    platform: Platform, job: str, reason: str, message: str, *, init: bool = False, **extra: Any
) -> None:
    """A Pending prepare pod whose (init) container waits for ``reason``, as the kubelet reports it."""
    status = waiting_container("prepare", RUNNER_IMAGE, reason, message, **extra)
    statuses = "initContainerStatuses" if init else "containerStatuses"
    await job_pod(platform, job, {"phase": "Pending", statuses: [status]})


async def cause_image_pull(platform: Platform, job: str) -> None:
    await waiting_prepare_pod(platform, job, "ImagePullBackOff", PULL_ERROR)


async def cause_missing_secret(platform: Platform, job: str) -> None:
    await waiting_prepare_pod(platform, job, "CreateContainerConfigError", 'secret "hf-token" not found')


async def cause_crash_loop(platform: Platform, job: str) -> None:
    await waiting_prepare_pod(
        platform,
        job,
        "CrashLoopBackOff",
        "back-off 40s",
        init=True,
        restartCount=4,
        lastState={"terminated": {"exitCode": 3}},
    )


async def cause_refused_pod(platform: Platform, job: str) -> None:
    quota = (
        'pods "x" is forbidden: exceeded quota: compute, requested: requests.cpu=8, limited: requests.cpu=4'
    )
    await warning_event(platform, job, "Job", "FailedCreate", f"Error creating: {quota}")


async def cause_failed_mount(platform: Platform, job: str) -> None:
    pod = await job_pod(
        platform,
        job,
        {"phase": "Pending", "containerStatuses": [waiting_container("prepare", "x", "ContainerCreating")]},
    )
    await warning_event(
        platform,
        pod,
        "Pod",
        "FailedMount",
        'MountVolume.SetUp failed for volume "shared": pvc "autorl-shared" not found',
    )


async def cause_suspended(platform: Platform, job: str) -> None:
    """What Kueue does to a Job its queue has no quota for."""
    response = await platform.kube.patch(
        f"{JOBS}/{job}",
        json={"spec": {"suspend": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()


def grader_service(port: int) -> dict[str, Any]:
    """The grader's Service as the chart makes it, with the address a cluster would give it: here
    the grader's own, 127.0.0.1, where the test's grader listens."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "autorl-grader", "namespace": GRADER_NAMESPACE},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "127.0.0.1",
            "ports": [
                {"name": "http", "port": port, "targetPort": "http"},
                {"name": "admin", "port": port + 1, "targetPort": "admin"},
            ],
        },
    }


@contextlib.asynccontextmanager
async def operator_platform(
    grader_settings: DeploymentSettings, grader_port: int, shared: Path, *, provenance_wait_s: float = 0.0
) -> AsyncIterator[Platform]:
    """The grader on ``grader_port``, the emulated API with the CRD, and the operator watching
    :data:`NAMESPACE` with ``shared`` as its shared volume, ready; stopped on exit. No evaluator
    takes the provenance check of a closed experiment unless a test plays it: the controller waits
    ``provenance_wait_s`` for it (none by default)."""
    with serve(create_app(grader_settings), port=grader_port) as grader:
        emulator = ApiServerEmulator(
            authorizer=chart_authorizer(), restricted_namespaces=frozenset({NAMESPACE})
        )
        async with emulator, kmock.Server(emulator):
            declare_resources(emulator)
            api_url = str(emulator.url).rstrip("/")
            cluster = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
            async with httpx.AsyncClient(base_url=api_url, headers=cluster) as kube:
                crd = await kube.post(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd_manifest()
                )
                assert crd.status_code < 300, crd.text
                service = await kube.post(GRADER_SERVICE, json=grader_service(grader_port))
                assert service.status_code < 300, service.text
                settings = ControllerSettings(
                    grader_url=grader.url,
                    admin_token=grader_settings.admin_token,
                    kube_api_url=api_url,
                    watch_namespaces=[NAMESPACE],
                    shared_mount=str(shared),
                    shared_pvc="autorl-shared",
                    runner_image=RUNNER_IMAGE,
                    grader_namespace=GRADER_NAMESPACE,
                    sync_interval_s=TICK_S,
                    deadline_grace_s=0,
                    finish_wait_s=30.0,
                    provenance_wait_s=provenance_wait_s,
                    request_timeout_s=10.0,
                    image_pull_secrets=PULL_SECRETS,
                )
                stop, ready = asyncio.Event(), asyncio.Event()
                operator = asyncio.create_task(
                    run_operator(settings, stop_flag=stop, ready_flag=ready, liveness=False)
                )
                await asyncio.wait_for(ready.wait(), timeout=30)
                async with httpx.AsyncClient(base_url=grader.url) as grader_client:
                    try:
                        yield Platform(kube, grader_client, grader_settings, shared, emulator)
                    finally:
                        stop.set()
                        # kopf ends its own tasks by cancelling them, which the awaiting side then sees.
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait_for(operator, timeout=30)


def _events_about(body: dict[str, Any], name: str) -> list[tuple[str, str]]:
    return [
        (event.get("reason", ""), event.get("message", ""))
        for event in body["items"]
        if event.get("involvedObject", {}).get("name") == name
    ]
