"""The chart's side of the trust boundary, rendered by Helm: who may reach Postgres, Redis and the
grader's admin port (NetworkPolicies evaluated against every pod the chart and the controller
create), credentials that are always set, and storage that agents never see."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from autorl.experiment import ExperimentSpec
from autorl_controller.operator.manifests import ExperimentRef, build_agent_job, build_network_policy
from autorl_controller.operator.settings import ControllerSettings
from tests.integration.test_chart import (
    BUNDLED_EXISTING,
    EXTERNAL,
    IMAGES,
    NAMESPACE,
    RELEASE,
    merge,
    of_kind,
    pod_specs,
    render,
)

AGENT = ExperimentSpec.model_validate(
    {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B", "agent": {"image": "registry.example/agent:1"}}
)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) applied to a pod's labels."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def pod_labels(documents: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Every pod the chart runs, by workload name, with its labels."""
    out = {}
    for doc in documents:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            out[doc["metadata"]["name"]] = doc["spec"]["template"]["metadata"]["labels"]
        elif doc["kind"] == "Pod":
            out[doc["metadata"]["name"]] = doc["metadata"]["labels"]
    return out


def controller_settings(documents: list[dict[str, Any]]) -> ControllerSettings:
    """The controller's settings exactly as the chart sets them."""
    deployment = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-controller"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    plain = {e["name"].removeprefix("AUTORL_").lower(): e["value"] for e in env if "value" in e}
    return ControllerSettings.model_validate(
        {k: json.loads(v) if v[:1] in "{[" else v for k, v in plain.items()} | {"admin_token": "x" * 32}
    )


def agent_pod_labels(documents: list[dict[str, Any]], namespace: str) -> dict[str, str]:
    job = build_agent_job(ExperimentRef("exp", namespace, "uid-1"), AGENT, controller_settings(documents))
    labels: dict[str, str] = job["spec"]["template"]["metadata"]["labels"]
    return labels


def allowed_sources(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The peers of every ingress rule that opens ``port`` (an empty list: any source)."""
    peers: list[dict[str, Any]] = []
    for rule in policy["spec"]["ingress"]:
        if any(p["port"] == port for p in rule.get("ports", [])) or not rule.get("ports"):
            if not rule.get("from"):
                return []
            peers.extend(rule["from"])
    return peers


def reaches(peers: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a pod of the release's namespace with ``labels`` is one of ``peers``."""
    for peer in peers:
        assert "ipBlock" not in peer  # pod addresses change; only selectors mean something
        if "namespaceSelector" in peer:
            continue  # an operator's own extra peer (networkPolicy.adminFrom)
        if selects(peer["podSelector"], labels):
            return True
    return False


@pytest.mark.parametrize(("store", "port"), [("postgres", 5432), ("redis", 6379)])
def test_only_the_grader_and_evaluators_reach_postgres_and_redis(store: str, port: int) -> None:
    documents = render(IMAGES)
    policy = of_kind(documents, "NetworkPolicy")[f"{RELEASE}-autorl-{store}"]
    pods = pod_labels(documents)
    assert selects(policy["spec"]["podSelector"], pods[f"{RELEASE}-autorl-{store}"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = allowed_sources(policy, port)
    assert peers, "an empty peer list would let every pod in"
    assert all(set(peer) == {"podSelector"} for peer in peers)  # this namespace only
    reached = {name for name, labels in pods.items() if reaches(peers, labels)}
    assert reached == {f"{RELEASE}-autorl-grader", f"{RELEASE}-autorl-evaluator"}
    # An agent pod, even in the release's own namespace (the default one it runs in), is not let in.
    assert not reaches(peers, agent_pod_labels(documents, NAMESPACE))
    # Nothing else of the policy's port is open.
    assert [rule["ports"] for rule in policy["spec"]["ingress"]] == [[{"protocol": "TCP", "port": port}]]


def test_the_admin_port_is_the_controllers_and_the_agent_port_everyones() -> None:
    documents = render(IMAGES)
    policy = of_kind(documents, "NetworkPolicy")[f"{RELEASE}-autorl-grader"]
    pods = pod_labels(documents)
    grader = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-grader"]["spec"]["template"]["spec"]
    container = grader["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["command"][-4:] == ["--port", str(ports["http"]), "--admin-port", str(ports["admin"])]
    # The kubelet probes the admin port: agents filling the agent port's connections fail no probe.
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    assert {container[probe]["httpGet"]["port"] for probe in probes} == {"admin"}
    assert selects(policy["spec"]["podSelector"], pods[f"{RELEASE}-autorl-grader"])
    assert allowed_sources(policy, ports["http"]) == []  # agents of every namespace submit here
    admin_peers = allowed_sources(policy, ports["admin"])
    reached = {name for name, labels in pods.items() if reaches(admin_peers, labels)}
    assert reached == {f"{RELEASE}-autorl-controller"}
    assert not reaches(admin_peers, agent_pod_labels(documents, NAMESPACE))
    # The agents' own policy (built by the controller from the chart's settings) opens only the agent port.
    settings = controller_settings(documents)
    agent_policy = build_network_policy(ExperimentRef("exp", "team-a", "uid-1"), AGENT, settings)
    (to_grader,) = [rule for rule in agent_policy["spec"]["egress"] if rule["ports"][0]["port"] != 53]
    assert to_grader["ports"] == [{"protocol": "TCP", "port": ports["http"]}]
    assert selects(to_grader["to"][0]["podSelector"], pods[f"{RELEASE}-autorl-grader"])


def test_network_policies_can_be_left_to_the_operator() -> None:
    documents = render(merge(IMAGES, {"networkPolicy": {"enabled": False}}))
    assert of_kind(documents, "NetworkPolicy") == {}
    assert not [d for d in render(merge(IMAGES, EXTERNAL)) if d["kind"] == "NetworkPolicy"
                and d["metadata"]["name"].endswith(("-postgres", "-redis"))]  # fmt: skip


def credential_sources(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Where each of AUTORL_DATABASE_URL and AUTORL_REDIS_URL gets its secret part from."""
    env = container["env"]
    names = [e["name"] for e in env]
    out = {}
    for variable, password in (
        ("AUTORL_DATABASE_URL", "POSTGRES_PASSWORD"),
        ("AUTORL_REDIS_URL", "REDIS_PASSWORD"),
    ):
        item = env[names.index(variable)]
        if "valueFrom" in item:
            out[variable] = item["valueFrom"]["secretKeyRef"]
        else:
            # Composed by Kubernetes from a password defined earlier in the same list.
            assert f":$({password})@" in item["value"], item
            assert names.index(password) < names.index(variable)
            out[variable] = env[names.index(password)]["valueFrom"]["secretKeyRef"]
    return out


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"AUTORL_DATABASE_URL": ("lab-autorl-postgres", "password"),
              "AUTORL_REDIS_URL": ("lab-autorl-redis", "password")}),
        (BUNDLED_EXISTING, {"AUTORL_DATABASE_URL": ("pg-pass", "pw"),
                            "AUTORL_REDIS_URL": ("redis-pass", "password")}),
        (EXTERNAL, {"AUTORL_DATABASE_URL": ("pg-url", "url"),
                    "AUTORL_REDIS_URL": ("redis-url", "redis-url")}),
    ],
    ids=["generated", "bundled-existing-secrets", "external"],
)  # fmt: skip
def test_redis_and_postgres_credentials_are_always_set(
    values: dict[str, Any], expected: dict[str, tuple[str, str]]
) -> None:
    documents = render(merge(IMAGES, values))
    secrets = of_kind(documents, "Secret")
    for component in ("grader", "evaluator"):
        pod = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-{component}"]["spec"]["template"]["spec"]
        sources = credential_sources(pod["containers"][0])
        assert {k: (v["name"], v["key"]) for k, v in sources.items()} == expected
        assert all(not v.get("optional") for v in sources.values())
    for name, key in expected.values():
        if name.startswith(RELEASE):  # generated by the chart: it must hold a real password
            assert len(secrets[name]["data"][key]) >= 40
        else:
            assert name not in secrets  # the operator's own Secret is never overwritten
    statefulsets = of_kind(documents, "StatefulSet")
    if values is not EXTERNAL:
        # The bundled servers take the very password the services use.
        redis = statefulsets[f"{RELEASE}-autorl-redis"]["spec"]["template"]["spec"]["containers"][0]
        assert "--requirepass" in redis["command"][-1]
        env = {e["name"]: e for e in redis["env"]}
        ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == expected["AUTORL_REDIS_URL"]
        postgres = statefulsets[f"{RELEASE}-autorl-postgres"]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in postgres["env"]}
        ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == expected["AUTORL_DATABASE_URL"]


@pytest.mark.parametrize("store", ["postgresql", "redis"])
def test_an_external_store_without_its_secret_is_refused(store: str) -> None:
    # The schema refuses it first; the templates' `required` says the same if the schema is skipped.
    with pytest.raises(helm.HelmError, match=f"{store}.external.existingSecret"):
        render(merge(IMAGES, {store: {"enabled": False}}))


def mounts_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    return {
        mount["mountPath"]: {**mount, "volume": volumes[mount["name"]]}
        for mount in pod["containers"][0]["volumeMounts"]
    }


def test_only_the_grader_and_the_controller_hold_the_admin_token() -> None:
    """The admin API's token reaches the pods that serve or call that API, and no other: an
    evaluator runs submitted weights and OpenCompass, an agent runs anything, neither needs it."""
    documents = render(merge(IMAGES, BUNDLED_EXISTING))
    secret = f"{RELEASE}-autorl-admin-token"
    holders = {
        name
        for name, pod in pod_specs(documents)
        for container in [*pod.get("initContainers", []), *pod["containers"]]
        for variable in [*container.get("env", []), *container.get("envFrom", [])]
        if json.dumps(variable).find(secret) >= 0
    }
    assert holders == {f"{RELEASE}-autorl-grader", f"{RELEASE}-autorl-controller"}
    for name, pod in pod_specs(documents):
        mounted = {v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])}
        assert secret not in mounted, name
    job = build_agent_job(ExperimentRef("exp", NAMESPACE, "uid-1"), AGENT, controller_settings(documents))
    assert secret not in json.dumps(job)


@pytest.mark.parametrize("values", [{}, BUNDLED_EXISTING], ids=["chart-claims", "existing-claims"])
def test_snapshots_are_written_by_the_grader_and_read_by_evaluators_only(values: dict[str, Any]) -> None:
    documents = render(merge(IMAGES, values))
    snapshot_claim = values.get("snapshots", {}).get("existingClaim") or f"{RELEASE}-autorl-snapshots"
    deployments = of_kind(documents, "Deployment")
    grader = deployments[f"{RELEASE}-autorl-grader"]["spec"]["template"]["spec"]
    evaluator = deployments[f"{RELEASE}-autorl-evaluator"]["spec"]["template"]["spec"]
    for pod, writable in ((grader, True), (evaluator, False)):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        mount = mounts_of(pod)[env["AUTORL_SNAPSHOT_DIR"]]
        assert mount["volume"]["persistentVolumeClaim"]["claimName"] == snapshot_claim
        assert bool(mount.get("readOnly")) is not writable
        assert bool(mount["volume"]["persistentVolumeClaim"].get("readOnly")) is not writable
    # The evaluator mounts no workspace: of the shared volume only the base models, read-only.
    shared = [m for m in mounts_of(evaluator).values() if m["name"] == "shared"]
    assert [
        (m["subPath"], m["readOnly"], m["volume"]["persistentVolumeClaim"]["readOnly"]) for m in shared
    ] == [("cache/models", True, True)]
    # The grader reads every workspace but writes none (read-only at the source: no fsGroup applied).
    (grader_shared,) = [m for m in mounts_of(grader).values() if m["name"] == "shared"]
    assert grader_shared["readOnly"] is True and grader_shared["volume"]["persistentVolumeClaim"]["readOnly"]
    # The evaluators' own storage (the test split) is mounted nowhere else.
    for name, pod in pod_specs(documents):
        claims = {v.get("persistentVolumeClaim", {}).get("claimName") for v in pod.get("volumes", [])}
        if name != f"{RELEASE}-autorl-evaluator":
            assert "eval-only" not in claims and "eval" not in {v["name"] for v in pod.get("volumes", [])}
    # Agent pods, as the controller builds them from the chart's settings: only their own workspace.
    job = build_agent_job(ExperimentRef("exp", NAMESPACE, "uid-1"), AGENT, controller_settings(documents))
    agent = job["spec"]["template"]["spec"]
    claims = {
        v["persistentVolumeClaim"]["claimName"] for v in agent["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims == {f"{RELEASE}-autorl-shared"}
    assert {m["subPath"] for m in agent["containers"][0]["volumeMounts"] if m["name"] == "shared"} == {
        f"experiments/{NAMESPACE}/exp.uid-1",
        "cache/models/hub/Qwen--Qwen2.5-1.5B",
        "cache/data/gsm8k",
    }


def test_platform_pods_run_as_the_platform_and_agents_outside_its_ids() -> None:
    documents = render(IMAGES)
    settings = controller_settings(documents)
    for name in ("grader", "evaluator", "controller"):
        pod = of_kind(documents, "Deployment")[f"{RELEASE}-autorl-{name}"]["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert (security["runAsUser"], security["runAsGroup"]) == (
            settings.platform_uid,
            settings.platform_gid,
        )
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    start, end = settings.agent_id_start, settings.agent_id_start + settings.agent_id_count
    assert not start <= settings.platform_gid < end
    assert settings.cluster_cidrs == [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
    ]
    narrowed = controller_settings(
        render(merge(IMAGES, {"agents": {"clusterCIDRs": ["10.42.0.0/16", "10.43.0.0/16"]}}))
    )
    assert narrowed.cluster_cidrs == ["10.42.0.0/16", "10.43.0.0/16"]
    roles = [doc for doc in documents if doc["kind"] == "Role"]
    jobs = next(rule for rule in roles[0]["rules"] if rule["resources"] == ["jobs"])
    assert "patch" in jobs["verbs"]  # the agent's deadline is tightened to its budget's end
