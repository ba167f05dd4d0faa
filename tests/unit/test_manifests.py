"""The pure ``build_*`` functions and lifecycle rules of the controller, without any server."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import kubernetes_validate
import pytest
from pydantic import SecretStr

from autorl.experiment import EvaluationSpec, ExperimentSpec, Phase
from autorl_controller.operator.handlers.create import validation_error
from autorl_controller.operator.handlers.reconcile import is_active, summary
from autorl_controller.operator.lifecycle import (
    JobState,
    JobStatus,
    agent_deadline_s,
    agent_outcome,
    agent_running_since,
    job_status,
    outcome_condition,
    outcome_from_conditions,
    status_from_view,
    status_patch,
)
from autorl_controller.operator.manifests import (
    KUEUE_QUEUE_LABEL,
    ExperimentRef,
    GraderServiceError,
    agent_grading_url,
    agent_run_as_id,
    build_agent_job,
    build_network_policy,
    build_prepare_job,
    build_registration,
    build_token_secret,
    cached_model_subpath,
    check_egress,
    id_collisions,
    needs_dns,
)
from autorl_controller.operator.settings import ControllerSettings
from tests.support.answers import experiment_answer

KUBERNETES_VERSION = kubernetes_validate.latest_version()
#: The oldest Kubernetes the chart installs on (its Chart.yaml's kubeVersion, ">=X.Y.Z-0").
OLDEST_KUBERNETES = re.fullmatch(
    r'">=([\d.]+)-0"',
    next(
        line.split(":", 1)[1].strip()
        for line in (Path(__file__).resolve().parents[2] / "charts" / "autorl" / "Chart.yaml")
        .read_text(encoding="utf-8")
        .splitlines()
        if line.startswith("kubeVersion:")
    ),
)
UID = "5f0c3a9e-2b7d-4c1e-9a8f-0d6e4b3c2a10"
REF = ExperimentRef("gsm8k-grpo", "team-a", UID)
SETTINGS = ControllerSettings(
    admin_token=SecretStr("x" * 32),
    runner_image="registry.example/autorl-agent-runner:0.1.0",
    shared_pvc="autorl-shared",
    grader_namespace="autorl",
    deadline_grace_s=300,
    agent_node_selector={"nvidia.com/gpu.present": "true"},
    agent_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    image_pull_secrets=["registry-a", "registry-b"],
)
BUILTIN = ExperimentSpec.model_validate(
    {
        "task": "gsm8k",
        "model": "Qwen/Qwen2.5-1.5B",
        "agent": {"builtin": "example_grpo", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        "timeoutSeconds": 3600,
    }
)


def tiny_gsm8k_spec(agent: dict[str, Any], **fields: Any) -> ExperimentSpec:
    """A 600 s gsm8k experiment of the tiny model by ``agent``, with the spec's other ``fields``."""
    return ExperimentSpec.model_validate(
        {"task": "gsm8k", "model": "builtin:tiny-qwen2", "agent": agent, "timeoutSeconds": 600, **fields}
    )


CUSTOM = tiny_gsm8k_spec(
    {
        "image": "registry.example/llm-agent:1",
        "command": ["python", "-m", "agent"],
        "args": ["--fast"],
        "env": [{"name": "LOG_LEVEL", "value": "debug"}],
        "envFrom": [{"secretRef": {"name": "llm-api-key"}}],
    },
    egress=[{"host": "api.example.com"}, {"cidr": "203.0.113.0/24", "ports": [8443]}],
    queueName="gpu-queue",
)
SPECS = pytest.mark.parametrize("spec", [BUILTIN, CUSTOM], ids=["builtin", "custom"])


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def all_containers(job: dict[str, Any]) -> list[dict[str, Any]]:
    pod = pod_of(job)
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize(
    "manifest",
    [
        build_agent_job(REF, BUILTIN, SETTINGS),
        build_agent_job(REF, CUSTOM, SETTINGS),
        build_prepare_job(REF, BUILTIN, SETTINGS),
        build_network_policy(REF, CUSTOM, SETTINGS, {"api.example.com": ["198.51.100.7", "2001:db8::7"]}),
        build_token_secret(REF, token="t0k3n", grading_server_url="http://grader/a/t0k3n"),
    ],
    ids=["agent-builtin", "agent-custom", "prepare", "policy", "secret"],
)
def test_every_manifest_passes_strict_kubernetes_validation(manifest: dict[str, Any]) -> None:
    """On the newest Kubernetes and on the oldest the chart installs on: every field the controller
    writes is one that API server knows (none dropped or refused as unknown)."""
    assert OLDEST_KUBERNETES is not None, "Chart.yaml's kubeVersion is no longer >=X.Y.Z-0"
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    # Below 1.31 the operator sets agents.strictSupplementalGroups=false (KUBERNETES.md), which
    # leaves supplementalGroupsPolicy out (test_agent_pods_are_restricted_and_tokenless).
    older = json.loads(
        json.dumps(manifest)
        .replace('"supplementalGroupsPolicy": "Strict", ', "")
        .replace(', "supplementalGroupsPolicy": "Strict"', "")
    )
    kubernetes_validate.validate(older, OLDEST_KUBERNETES[1], strict=True)


@SPECS
def test_agent_pods_are_restricted_and_tokenless(spec: ExperimentSpec) -> None:
    job = build_agent_job(REF, spec, SETTINGS)
    pod = pod_of(job)
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False  # no Postgres/Redis addresses in the environment
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsUser"] == security["runAsGroup"] == agent_run_as_id(REF, SETTINGS)
    # No group shared with anything: no fsGroup (the kubelet would chgrp the shared volume to it),
    # no supplementary groups, none taken from the image's /etc/group.
    assert "fsGroup" not in security and "supplementalGroups" not in security
    assert security["supplementalGroupsPolicy"] == "Strict"
    lenient = SETTINGS.model_copy(update={"agent_strict_groups": False})
    assert "supplementalGroupsPolicy" not in pod_of(build_agent_job(REF, spec, lenient))["securityContext"]
    for container in all_containers(job):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["privileged"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert "runAsUser" not in security
        # The agent keeps its own group; only the platform's sidecar has the platform's (see below).
        sidecar = container in pod["initContainers"]
        assert security.get("runAsGroup") == (SETTINGS.platform_gid if sidecar else None)
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.agent_stop_grace_s
    assert pod["nodeSelector"] == SETTINGS.agent_node_selector
    assert pod["tolerations"] == SETTINGS.agent_tolerations


@SPECS
def test_agent_job_deadline_labels_and_owner_free_manifest(spec: ExperimentSpec) -> None:
    job = build_agent_job(REF, spec, SETTINGS)
    # A custom image is stopped at its budget's end (from the Job's start until the budget is known);
    # the agent runner stops a built-in agent itself and gets the grace period to close.
    grace = 0 if spec.agent.image else SETTINGS.deadline_grace_s
    assert job["spec"]["activeDeadlineSeconds"] == spec.timeoutSeconds + grace
    assert job["metadata"]["namespace"] == REF.namespace
    assert job["metadata"]["name"] == REF.agent_job_name
    assert "ownerReferences" not in job["metadata"]  # the handler adopts it
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["autorl.io/experiment"] == REF.name and pod_labels["autorl.io/role"] == "agent"
    assert job["metadata"]["labels"].get(KUEUE_QUEUE_LABEL) == spec.queueName


@SPECS
def test_agent_sees_its_workspace_read_write_and_only_its_inputs_read_only(spec: ExperimentSpec) -> None:
    job = build_agent_job(REF, spec, SETTINGS)
    for container in pod_of(job)["containers"]:
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert set(mounts) == {
            "/workspace",
            "/workspace/data",
            f"/workspace/models/{mounts_model(spec)}",
            "/tmp",
        }
        assert mounts["/tmp"]["name"] == "tmp"  # an emptyDir: the root file system is read-only
        assert mounts["/workspace"]["subPath"] == f"experiments/team-a/gsm8k-grpo.{UID}"
        assert not mounts["/workspace"].get("readOnly")
        assert mounts["/workspace/data"] == {
            "name": "shared",
            "mountPath": "/workspace/data",
            "subPath": f"cache/data/{spec.task}",
            "readOnly": True,
        }
        model_mount = mounts[f"/workspace/models/{mounts_model(spec)}"]
        assert model_mount["readOnly"] is True
        assert model_mount["subPath"] == f"cache/models/{cached_model_subpath(spec.model)}"


def mounts_model(spec: ExperimentSpec) -> str:
    return {"Qwen/Qwen2.5-1.5B": "Qwen2.5-1.5B", "builtin:tiny-qwen2": "tiny-qwen2"}[spec.model]


@SPECS
def test_agent_environment_is_the_contract_with_credentials_only_by_envfrom(spec: ExperimentSpec) -> None:
    container = pod_of(build_agent_job(REF, spec, SETTINGS))["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["WORKSPACE"] == "/workspace" and env["OUTPUT_DIR"] == "/workspace/output"
    assert env["MODEL_PATH"] == f"/workspace/models/{mounts_model(spec)}"
    assert env["DATA_PATH"] == "/workspace/data"
    assert env["TASK"] == spec.task and env["BASE_MODEL"] == spec.model
    assert env["AUTORL_SEED"] == "0"  # one Experiment is one run, as `autorl run` without --repeat
    assert "AUTORL_TOKEN" not in env and "GRADING_SERVER_URL" not in env
    assert all("valueFrom" not in item for item in container["env"])
    assert container["envFrom"][0] == {"secretRef": {"name": REF.secret_name}}


def test_builtin_agent_runs_under_the_agent_runner() -> None:
    job = build_agent_job(REF, BUILTIN, SETTINGS)
    pod = pod_of(job)
    container = pod["containers"][0]
    assert [sidecar["name"] for sidecar in pod["initContainers"]] == ["group-read"]
    assert container["image"] == SETTINGS.runner_image
    assert container["command"] == ["autorl", "agent-runner"]
    assert container["args"] == [
        "--agent", "example_grpo", "--workspace", "/workspace", "--task", "gsm8k",
        "--base-model", "Qwen/Qwen2.5-1.5B", "--timeout", "3600", "--sandbox", "none",
        "--echo-output",
    ]  # fmt: skip
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_custom_agent_runs_its_own_image_in_the_prepared_workspace() -> None:
    pod = pod_of(build_agent_job(REF, CUSTOM, SETTINGS))
    agent = pod["containers"][0]
    assert agent["image"] == "registry.example/llm-agent:1"
    assert agent["command"] == ["python", "-m", "agent"] and agent["args"] == ["--fast"]
    assert agent["workingDir"] == "/workspace"
    assert {"secretRef": {"name": "llm-api-key"}} in agent["envFrom"]
    assert {"name": "LOG_LEVEL", "value": "debug"} in agent["env"]


def test_prepare_job_fills_the_cache_as_the_platform_then_the_workspace_as_the_experiment() -> None:
    job = build_prepare_job(REF, BUILTIN, SETTINGS)
    pod = pod_of(job)
    run_as = agent_run_as_id(REF, SETTINGS)
    args = [
        "--task", "gsm8k", "--model", "Qwen/Qwen2.5-1.5B",
        "--workspace", f"/shared/experiments/team-a/gsm8k-grpo.{UID}", "--timeout", "3600",
    ]  # fmt: skip
    assert pod["securityContext"]["runAsUser"] == run_as
    # In the platform group (it owns the experiment folders), which also makes a fresh volume writable.
    assert pod["securityContext"]["fsGroup"] == SETTINGS.platform_gid
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert pod["automountServiceAccountToken"] is False

    (cache,) = pod["initContainers"]
    assert cache["command"] == ["autorl", "agent-runner", "prepare"]
    assert cache["args"] == [*args, "--step", "cache"]
    assert cache["securityContext"]["runAsUser"] == SETTINGS.platform_uid
    assert cache["securityContext"]["runAsGroup"] == SETTINGS.platform_gid
    assert {"name": "AUTORL_CACHE_DIR", "value": "/shared/cache"} in cache["env"]
    assert {"name": "shared", "mountPath": "/shared"} in cache["volumeMounts"]
    assert "envFrom" not in cache

    (workspace,) = pod["containers"]
    assert workspace["args"] == [
        *args, "--step", "workspace", "--group", str(SETTINGS.platform_gid),
        "--model-dir", "/shared/cache/models/hub/Qwen--Qwen2.5-1.5B",
    ]  # fmt: skip
    assert "runAsUser" not in workspace["securityContext"]  # the pod's: the experiment's own id
    # Only its namespace's folder (to create its own in) and the cache, read-only.
    assert {
        m["mountPath"]: (m.get("subPath"), m.get("readOnly", False)) for m in workspace["volumeMounts"]
    } == {
        "/shared/experiments/team-a": ("experiments/team-a", False),
        "/shared/cache": ("cache", True),
        "/tmp": (None, False),
    }
    for container in all_containers(job):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True

    with_token = SETTINGS.model_copy(update={"prepare_env_secret": "hf-token"})
    pod = pod_of(build_prepare_job(REF, BUILTIN, with_token))
    assert pod["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "hf-token", "optional": True}}]
    assert "envFrom" not in pod["containers"][0]  # the token never reaches the experiment's user


NEIGHBOURS = [
    ExperimentRef("gsm8k-grpo", "team-a", "uid-1"),
    ExperimentRef("gsm8k-grpo", "team-b", "uid-2"),
    ExperimentRef("gsm8k-grpo-2", "team-a", "uid-3"),
    ExperimentRef("team-a", "gsm8k-grpo", "uid-4"),
    ExperimentRef("a", "b", "uid-5"),
]


@pytest.mark.parametrize("ref", NEIGHBOURS, ids=[f"{r.namespace}/{r.name}" for r in NEIGHBOURS])
def test_each_experiment_runs_as_its_own_stable_id_in_the_documented_range(ref: ExperimentRef) -> None:
    run_as = agent_run_as_id(ref, SETTINGS)
    assert SETTINGS.agent_id_start <= run_as < SETTINGS.agent_id_start + SETTINGS.agent_id_count
    assert run_as not in (SETTINGS.platform_uid, SETTINGS.platform_gid, 0)
    # Stable: another controller (restart, other settings object) derives the same id, and so does a
    # re-applied Experiment of that name (its earlier runs' folders stay its own).
    restarted = ControllerSettings(admin_token=SecretStr("y" * 32))
    assert agent_run_as_id(ExperimentRef(ref.name, ref.namespace), restarted) == run_as
    assert agent_run_as_id(ExperimentRef(ref.name, ref.namespace, "another-run"), SETTINGS) == run_as
    for job in (build_agent_job(ref, BUILTIN, SETTINGS), build_prepare_job(ref, BUILTIN, SETTINGS)):
        assert pod_of(job)["securityContext"]["runAsUser"] == run_as
        assert pod_of(job)["securityContext"]["runAsGroup"] == run_as


def test_id_collisions_name_the_other_experiments_that_share_an_id() -> None:
    tiny = SETTINGS.model_copy(update={"agent_id_count": 3})  # a range this small must collide
    refs = [ExperimentRef(f"exp-{i}", "team-a", f"uid-{i}") for i in range(10)]
    for ref in refs:
        same = id_collisions(ref, refs, tiny)
        assert ref not in same
        assert same == [
            o for o in refs if o != ref and agent_run_as_id(o, tiny) == agent_run_as_id(ref, tiny)
        ]
    assert any(id_collisions(ref, refs, tiny) for ref in refs)
    assert id_collisions(REF, NEIGHBOURS, SETTINGS) == []


def test_experiments_get_distinct_ids() -> None:
    refs = [ExperimentRef(f"exp-{i}", f"team-{i % 7}") for i in range(2000)] + NEIGHBOURS
    ids = {agent_run_as_id(ref, SETTINGS) for ref in refs}
    assert len(ids) == len(refs)


@pytest.mark.parametrize(
    ("update", "fragment"),
    [
        ({"agent_id_start": 2**31 - 10, "agent_id_count": 100}, "lower agent_id_start"),
        (
            {"agent_id_start": 5000, "agent_id_count": 10000},
            "platform_uid 10001 lies in the agents' id range",
        ),
        ({"platform_gid": 1_000_500}, "platform_gid 1000500 lies in the agents' id range"),
        ({"cluster_cidrs": "10.0.0.0/8,10.96.0.1/12"}, "'10.96.0.1/12' is not a network"),
    ],
)
def test_settings_refuse_ids_or_ranges_that_would_mix_agents_and_platform(
    update: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        ControllerSettings.model_validate({"admin_token": "x" * 32, **update})


@pytest.mark.parametrize(
    ("spec", "resolved", "extra_rules"),
    [
        (BUILTIN, {}, []),
        (
            CUSTOM,
            {"api.example.com": ["198.51.100.7", "2001:db8::7"]},
            [
                {
                    "to": [
                        {"ipBlock": {"cidr": "198.51.100.7/32"}},
                        {"ipBlock": {"cidr": "2001:db8::7/128"}},
                    ],
                    "ports": [{"protocol": "TCP", "port": 443}],
                },
                {
                    "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                    "ports": [{"protocol": "TCP", "port": 8443}],
                },
            ],
        ),
        (
            CUSTOM,
            {"api.example.com": []},  # not resolvable: allows nothing rather than everything
            [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"protocol": "TCP", "port": 8443}]}],
        ),
    ],
    ids=["grader-only", "hosts-and-cidrs", "unresolved-host"],
)
def test_network_policy_allows_the_grader_the_spec_and_dns_only_for_names(
    spec: ExperimentSpec, resolved: dict[str, list[str]], extra_rules: list[dict[str, Any]]
) -> None:
    policy = build_network_policy(REF, spec, SETTINGS, resolved)["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {"autorl.io/experiment": REF.name, "autorl.io/role": "agent"}
    }
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    grader, *rest = policy["egress"]
    if needs_dns(spec):
        dns, *rest = rest
        assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        assert dns["to"][0]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
        }
        assert {"protocol": "UDP", "port": 53} in dns["ports"] and {"protocol": "TCP", "port": 53} in dns[
            "ports"
        ]
    # No rule anywhere names port 53 otherwise: cluster DNS forwards outside names (a tunnel out).
    assert not any(port["port"] == 53 for rule in rest for port in rule["ports"])
    assert grader["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "autorl"}}
    assert grader["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "grader"
    assert grader["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rest == extra_rules


@pytest.mark.parametrize(
    ("egress", "dns"),
    [
        (None, False),
        ([{"cidr": "203.0.113.0/24"}], False),
        ([{"host": "api.example.com"}], True),
        ([{"cidr": "203.0.113.0/24"}, {"host": "api.example.com"}], True),
    ],
    ids=["no-egress", "cidrs-only", "a-host", "cidr-and-host"],
)
def test_an_agent_pod_has_a_resolver_only_when_its_egress_names_a_host(
    egress: list[dict[str, Any]] | None, dns: bool
) -> None:
    spec = ExperimentSpec.model_validate(
        {"task": "gsm8k", "model": "m/n", "agent": {"builtin": "example_grpo"}, "egress": egress}
    )
    job = build_agent_job(REF, spec, SETTINGS)
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    pod = pod_of(job)
    policy = build_network_policy(REF, spec, SETTINGS, {"api.example.com": ["198.51.100.7"]})
    to_dns = [rule for rule in policy["spec"]["egress"] if {"protocol": "UDP", "port": 53} in rule["ports"]]
    if dns:
        assert "dnsPolicy" not in pod and "dnsConfig" not in pod  # the cluster's resolver, as by default
        assert len(to_dns) == 1
    else:
        # Not the cluster's resolver: only the pod's own loopback, where nothing of the platform answers.
        assert pod["dnsPolicy"] == "None" and pod["dnsConfig"]["nameservers"] == ["127.0.0.1"]
        assert "searches" not in pod["dnsConfig"] and to_dns == []


@pytest.mark.parametrize(
    ("cluster_ip", "ports", "url"),
    [
        (
            "10.96.12.34",
            [{"name": "http", "port": 8000, "targetPort": "http"}],
            "http://10.96.12.34:8000/a/t0k",
        ),
        (
            "10.96.12.34",
            [
                {"name": "admin", "port": 8001, "targetPort": "admin"},
                {"name": "web", "port": 80, "targetPort": 8000},
            ],
            "http://10.96.12.34:80/a/t0k",
        ),
        ("fd00:10:96::7", [{"port": 8000}], "http://[fd00:10:96::7]:8000/a/t0k"),
    ],
    ids=["named-port", "numbered-target", "ipv6-default-target"],
)
def test_agents_reach_the_grader_at_its_services_address_not_a_name(
    cluster_ip: str, ports: list[dict[str, Any]], url: str
) -> None:
    service = {"metadata": {"name": "autorl-grader"}, "spec": {"clusterIP": cluster_ip, "ports": ports}}
    assert agent_grading_url(service, "t0k", SETTINGS) == url


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"clusterIP": "None", "ports": [{"port": 8000}]}, "has no cluster IP (headless?)"),
        (
            {"clusterIP": "10.96.0.9", "ports": [{"name": "admin", "port": 8001}]},
            "has no port leading to the grader",
        ),
    ],
    ids=["headless", "no-agent-port"],
)
def test_a_grader_service_without_an_address_for_agents_names_the_fix(
    spec: dict[str, Any], fragment: str
) -> None:
    service = {"metadata": {"name": "autorl-grader"}, "spec": spec}
    with pytest.raises(GraderServiceError, match=re.escape(fragment)):
        agent_grading_url(service, "t0k", SETTINGS)


def egress_spec(*rules: dict[str, Any]) -> ExperimentSpec:
    return ExperimentSpec.model_validate({"task": "gsm8k", "model": "m/n", "egress": list(rules)})


@pytest.mark.parametrize(
    ("cidr", "cluster", "holder"),
    [
        ("10.96.0.0/12", None, "10.0.0.0/8"),  # the default: every private range
        ("10.244.3.7/32", None, "10.0.0.0/8"),
        ("192.168.1.0/24", None, "192.168.0.0/16"),
        ("fd12:3456::/64", None, "fc00::/7"),
        ("169.254.169.254/32", None, "169.254.0.0/16"),  # cloud metadata: always refused
        ("169.254.169.254/32", "10.42.0.0/16", "169.254.0.0/16"),
        ("::ffff:10.0.0.0/104", None, "::ffff:0:0/96"),  # 10.0.0.0/8 spelled as IPv6
        ("64:ff9b::10.0.0.0/104", None, "64:ff9b::/96"),  # the same behind a NAT64 translator
        ("64:ff9b:1::/48", None, "64:ff9b:1::/48"),
        ("2002:a00::/24", None, "2002::/16"),  # behind a 6to4 relay
        ("100.70.0.0/16", "100.64.0.0/10,10.43.0.0/16", "100.64.0.0/10"),
        ("10.43.0.5/32", "10.42.0.0/16,10.43.0.0/16", "10.43.0.0/16"),
    ],
)
def test_egress_into_the_cluster_is_refused_with_the_range_and_the_fix(
    cidr: str, cluster: str | None, holder: str
) -> None:
    settings = (
        SETTINGS if cluster is None else SETTINGS.model_copy(update={"cluster_cidrs": cluster.split(",")})
    )
    spec = egress_spec({"host": "api.example.com"}, {"cidr": cidr})
    message = f"spec.egress[1].cidr: {cidr} lies inside {holder}"
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        check_egress(spec, settings)
    assert "outside destinations" in str(refused.value)
    with pytest.raises(ValueError, match="lies inside"):
        build_network_policy(REF, spec, settings)
    error = validation_error("ok", spec.model_dump(exclude_none=True), settings)
    assert error is not None and message in error


@pytest.mark.parametrize(
    ("cidr", "cluster", "excepted"),
    [
        (
            "0.0.0.0/0",
            None,
            ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"],
        ),
        (
            "::/0",
            None,
            [
                "fc00::/7",
                "fe80::/10",
                "::/96",
                "::ffff:0:0/96",
                "64:ff9b::/96",
                "64:ff9b:1::/48",
                "2001::/32",
                "2002::/16",
            ],
        ),
        ("10.0.0.0/8", "10.42.0.0/16,10.43.0.0/16", ["10.42.0.0/16", "10.43.0.0/16"]),
        ("203.0.113.0/24", None, None),
    ],
)
def test_every_allowed_block_excepts_the_cluster_ranges_inside_it(
    cidr: str, cluster: str | None, excepted: list[str] | None
) -> None:
    settings = (
        SETTINGS if cluster is None else SETTINGS.model_copy(update={"cluster_cidrs": cluster.split(",")})
    )
    policy = build_network_policy(REF, egress_spec({"cidr": cidr}), settings)
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    (block,) = policy["spec"]["egress"][1]["to"]  # after the grader; no DNS for addresses
    assert block["ipBlock"].get("except") == excepted


def test_host_addresses_inside_the_cluster_are_never_allowed() -> None:
    """A name may resolve anywhere (a DNS record pointing at a Service): only outside addresses count."""
    spec = egress_spec({"host": "api.example.com"})
    resolved = {"api.example.com": ["10.96.0.10", "198.51.100.7", "169.254.169.254", "fd00::1"]}
    policy = build_network_policy(REF, spec, SETTINGS, resolved)
    allowed = [peer["ipBlock"]["cidr"] for rule in policy["spec"]["egress"][2:] for peer in rule["to"]]
    assert allowed == ["198.51.100.7/32"]
    everything_inside = build_network_policy(REF, spec, SETTINGS, {"api.example.com": ["10.1.1.1"]})
    assert len(everything_inside["spec"]["egress"]) == 2  # the grader and DNS: nothing more


def test_registration_names_the_experiment_per_namespace_and_maps_paths() -> None:
    body = build_registration(REF, BUILTIN, SETTINGS).model_dump(exclude_unset=True)
    assert body == {
        "name": f"team-a.gsm8k-grpo.{UID}",
        "task": "gsm8k",
        "model": "Qwen/Qwen2.5-1.5B",
        "timeout_s": 3600,
        "max_submissions": 100,
        "protocol": "opencompass",
        "feedback": "test",
        "workspace": f"/shared/experiments/team-a/gsm8k-grpo.{UID}",
        "output_dir": f"/shared/experiments/team-a/gsm8k-grpo.{UID}/output",
        "base_model_dir": "/shared/cache/models/hub/Qwen--Qwen2.5-1.5B",
        "agent_workspace": "/workspace",
        "agent": "example_grpo",
        "known_checkpoints": [],
    }


def test_the_experiments_known_checkpoints_are_registered_for_its_lineage() -> None:
    known = ["Qwen/Qwen2.5-1.5B-Instruct", "/shared/models/math"]
    spec = BUILTIN.model_copy(update={"evaluation": EvaluationSpec(knownCheckpoints=known)})
    assert build_registration(REF, spec, SETTINGS).known_checkpoints == known
    with pytest.raises(ValueError, match="at most 16"):
        EvaluationSpec(knownCheckpoints=[f"org/model-{n}" for n in range(17)])


def test_a_sealed_experiment_registers_sealed_and_prepares_its_workspace_without_validation() -> None:
    sealed = BUILTIN.model_copy(update={"evaluation": EvaluationSpec(feedback="sealed")})
    assert build_registration(REF, sealed, SETTINGS).feedback == "sealed"
    workspace = {c["name"]: c for c in all_containers(build_prepare_job(REF, sealed, SETTINGS))}["workspace"]
    flag = workspace["args"].index("--feedback")
    assert workspace["args"][flag + 1] == "sealed"
    # A test experiment's Job is the same as before feedback modes.
    assert all(
        "--feedback" not in c["args"] for c in all_containers(build_prepare_job(REF, BUILTIN, SETTINGS))
    )


def test_a_sealed_agent_sees_the_prepared_train_split_not_the_caches_whole_one() -> None:
    """The cache holds the whole train split, validation problems included: a sealed agent's data/
    is its workspace's own (the prepare step's split without them), read-only as the cache is."""

    def data_mount(spec: ExperimentSpec) -> dict[str, Any]:
        (agent,) = [c for c in all_containers(build_agent_job(REF, spec, SETTINGS)) if c["name"] == "agent"]
        (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"].endswith("/data")]
        return dict(mount)

    sealed = BUILTIN.model_copy(update={"evaluation": EvaluationSpec(feedback="sealed")})
    assert data_mount(sealed)["subPath"] == f"{REF.workspace_subpath}/data"
    assert data_mount(sealed)["readOnly"] is True
    assert data_mount(BUILTIN)["subPath"] == "cache/data/gsm8k"


def test_a_sealed_experiments_status_mirrors_its_one_test_result() -> None:
    view = experiment_answer(
        baseline_score=25.0,
        validation_baseline_score=36.0,
        best_score=40.0,
        improvement=4.0,  # the best on validation over the baseline there
        feedback="sealed",
        test_evaluations=1,
        final={
            "submission_id": 9,
            "of": 7,
            "selection": "nominated",
            "status": "scored",
            "score": 30.0,
            "interval": [27.5, 32.6],
            "comparison": None,
        },
    )
    status = status_patch(status_from_view(view))
    assert (status["finalScore"], status["finalLow"], status["finalHigh"]) == (30.0, 27.5, 32.6)
    assert status["result"] == "30.00 [27.50, 32.60] on test"  # kubectl's Best column
    assert status["improvement"] == 5.0  # beside it: the final over the baseline on test, as results.csv
    assert (status["feedback"], status["finalSelection"], status["testEvaluations"]) == (
        "sealed",
        "nominated",
        1,
    )
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    # The message's best is on validation, and so are the baseline and the improvement beside it.
    assert "best 40.00 vs baseline 36.00 (+4.00) on validation; final 30.00 on test (nominated)" in summary(
        outcome, view
    )
    before = experiment_answer(
        feedback="sealed",
        final={
            "submission_id": None,
            "of": 7,
            "selection": "best_on_validation",
            "status": None,
            "score": None,
        },
    )
    assert (
        status_patch(status_from_view(before))["finalSelection"] is None
        and status_patch(status_from_view(before))["finalScore"] is None
    )
    # Before the final, the Improvement column is the best on validation's, beside "on validation".
    before = before.model_copy(update={"best_score": 40.0, "improvement": 4.0, "baseline_score": 25.0})
    assert status_patch(status_from_view(before))["improvement"] == 4.0


def test_kubectls_best_column_shows_the_result_with_its_interval() -> None:
    """Test mode: the best submission on test with its 95 % interval; sealed, before the final
    evaluation, the best on validation, said so; nothing before a score."""
    best = {"submission_id": 4, "of": 4, "selection": "best_on_test", "status": "scored", "score": 41.2}
    scored = experiment_answer(best_score=41.2, feedback="test", final={**best, "interval": [38.57, 43.89]})
    assert status_patch(status_from_view(scored))["result"] == "41.20 [38.57, 43.89]"
    pending = {
        "submission_id": None,
        "of": 7,
        "selection": "best_on_validation",
        "status": None,
        "score": None,
    }
    sealed = experiment_answer(best_score=40.0, feedback="sealed", final=pending)
    assert status_patch(status_from_view(sealed))["result"] == "40.00 on validation"
    assert status_patch(status_from_view(experiment_answer(feedback="test")))["result"] is None


def test_token_secret_holds_exactly_the_agents_two_variables() -> None:
    secret = build_token_secret(REF, token="t0k3n", grading_server_url="http://grader:8000/a/t0k3n")
    decoded = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert decoded == {"AUTORL_TOKEN": "t0k3n", "GRADING_SERVER_URL": "http://grader:8000/a/t0k3n"}
    assert secret["immutable"] is True


def condition(kind: str, reason: str = "", status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason}


@pytest.mark.parametrize(
    ("status", "state", "reason"),
    [
        (None, JobState.MISSING, ""),
        ({}, JobState.WAITING, ""),
        ({"active": 1}, JobState.ACTIVE, ""),
        ({"conditions": [condition("Complete")], "succeeded": 1}, JobState.SUCCEEDED, "Completed"),
        (
            {"conditions": [condition("Failed", "BackoffLimitExceeded")]},
            JobState.FAILED,
            "BackoffLimitExceeded",
        ),
        (
            {"conditions": [condition("Failed", "DeadlineExceeded")]},
            JobState.DEADLINE_EXCEEDED,
            "DeadlineExceeded",
        ),
        ({"conditions": [condition("Suspended")]}, JobState.WAITING, ""),
        ({"conditions": [condition("Failed", status="False")], "active": 1}, JobState.ACTIVE, ""),
    ],
    ids=["missing", "created", "active", "complete", "failed", "deadline", "suspended", "false-condition"],
)
def test_job_status_reads_the_job_controllers_verdict(
    status: dict[str, Any] | None, state: JobState, reason: str
) -> None:
    job = None if status is None else {"status": status}
    assert job_status(job).state is state
    assert job_status(job).reason == reason


@pytest.mark.parametrize(
    ("state", "past_deadline", "phase"),
    [
        (JobState.ACTIVE, False, None),
        (JobState.WAITING, False, None),
        (JobState.SUCCEEDED, False, Phase.SUCCEEDED),
        (JobState.SUCCEEDED, True, Phase.SUCCEEDED),
        (JobState.FAILED, False, Phase.FAILED),
        (JobState.DEADLINE_EXCEEDED, False, Phase.TIMED_OUT),
        (JobState.ACTIVE, True, Phase.TIMED_OUT),
        (JobState.MISSING, False, Phase.FAILED),
    ],
)
def test_agent_outcome_maps_the_job_to_a_final_phase(
    state: JobState, past_deadline: bool, phase: Phase | None
) -> None:
    outcome = agent_outcome(JobStatus(state, "BackoffLimitExceeded"), past_deadline=past_deadline)
    assert (outcome.phase if outcome else None) is phase


@pytest.mark.parametrize(
    ("start", "end_time", "slack", "deadline"),
    [
        ("2026-01-01T00:00:00Z", 1767225600.0 + 3600, 0, 3600),  # pod started at once
        ("2026-01-01T00:00:00Z", 1767225600.0 + 420 + 3600, 0, 4020),  # 7 minutes of image pull
        ("2026-01-01T00:00:00Z", 1767225600.0 + 3600.2, 300, 3901),
        ("2026-01-01T00:00:00Z", 1767225600.0 - 5, 0, 1),  # already past: stop now
        (None, 1767225600.0, 0, None),  # not started yet
        ("2026-01-01T00:00:00Z", None, 0, None),  # budget not started
    ],
)
def test_agent_deadline_counts_from_the_jobs_start_to_the_budgets_end(
    start: str | None, end_time: float | None, slack: int, deadline: int | None
) -> None:
    job = {"status": {"startTime": start} if start else {}}
    assert agent_deadline_s(job, end_time, slack_s=slack) == deadline


def test_outcome_survives_finishing_in_a_condition() -> None:
    outcome = agent_outcome(JobStatus(JobState.DEADLINE_EXCEEDED, "DeadlineExceeded"), past_deadline=False)
    assert outcome is not None
    condition = outcome_condition(outcome, datetime(2026, 1, 1, tzinfo=UTC))
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert outcome_from_conditions([condition]) == outcome
    assert outcome_from_conditions(None) is None


def test_status_mirrors_the_graders_view() -> None:
    view = experiment_answer(
        baseline_score=25.0,
        best_score=31.5,
        best_submission=7,
        improvement=6.5,
        submissions=3,
        start_time=1767225600.0,
        end_time=1767232800.0,
        remaining_s=3900.0,
        in_flight=2,
        evaluators=1,
    )
    assert status_patch(status_from_view(view)) == {
        "budgetLeft": "1h05m",
        "queue": "2 in flight, 1 evaluator",
        "evaluators": 1,
        "baselineScore": 25.0,
        "bestScore": 31.5,
        "bestSubmission": 7,
        "improvement": 6.5,
        "submissions": 3,
        "startTime": "2026-01-01T00:00:00Z",
        "deadline": "2026-01-01T02:00:00Z",
        "feedback": "test",
        "finalScore": None,
        "finalLow": None,
        "finalHigh": None,
        "finalSelection": None,
        "testEvaluations": 0,
        "result": "31.50",
    }
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    assert summary(outcome, view).endswith("best 31.50 vs baseline 25.00 (+6.50) over 3 scored submission(s)")
    assert "no submission was scored" in summary(outcome, experiment_answer(baseline_score=25.0))


@pytest.mark.parametrize(
    ("name", "spec", "fragment"),
    [
        ("ok", {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B"}, None),
        ("ok", {"task": "gsm8k", "model": "/data/my-model"}, "local folders do not exist inside a cluster"),
        (
            "ok",
            {"task": "gsm8k", "model": "m/n", "agent": {"builtin": "example_grpo", "image": "b"}},
            "exactly one of builtin",
        ),
        ("ok", {"task": "gsm8k", "model": "m/n", "timeoutSecs": 1}, "spec.timeoutSecs: unknown field"),
        ("x" * 60, {"task": "gsm8k", "model": "m/n"}, "at most 50 characters"),
    ],
)
def test_validation_errors_name_the_field_and_the_fix(
    name: str, spec: dict[str, Any], fragment: str | None
) -> None:
    error = validation_error(name, spec, SETTINGS)
    if fragment is None:
        assert error is None
    else:
        assert error is not None and fragment in error


@pytest.mark.parametrize(
    ("phase", "active"),
    [(None, False), ("Pending", True), ("Running", True), ("Finishing", True)]
    + [(phase.value, False) for phase in Phase if phase.terminal],
)
def test_reconcile_timer_runs_only_between_validation_and_the_end(phase: str | None, active: bool) -> None:
    status = kopf.Status(kopf.Body({"status": {"phase": phase} if phase else {}}))
    assert is_active(status=status) is active


def test_a_reapplied_experiment_is_a_new_run_with_its_own_record_and_workspace() -> None:
    again = ExperimentRef(REF.name, REF.namespace, "0b1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f")
    first, second = build_registration(REF, BUILTIN, SETTINGS), build_registration(again, BUILTIN, SETTINGS)
    assert first.name != second.name and first.workspace != second.workspace
    assert second.name == f"team-a.gsm8k-grpo.{again.uid}"
    # Children keep their names (kubectl logs job/<name>-agent); what tells runs apart is the owner.
    assert again.agent_job_name == REF.agent_job_name and again.secret_name == REF.secret_name
    with pytest.raises(ValueError, match="its uid is needed"):
        _ = ExperimentRef(REF.name, REF.namespace).grader_name


@pytest.mark.parametrize(
    "job",
    [
        build_prepare_job(REF, BUILTIN, SETTINGS),
        build_agent_job(REF, BUILTIN, SETTINGS),
        build_agent_job(REF, CUSTOM, SETTINGS),
    ],
    ids=["prepare", "agent-builtin", "agent-custom"],
)
def test_every_job_pulls_its_images_with_the_configured_secrets(job: dict[str, Any]) -> None:
    assert pod_of(job)["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    public = SETTINGS.model_copy(update={"image_pull_secrets": []})
    build = build_prepare_job if job["metadata"]["name"] == REF.prepare_job_name else build_agent_job
    spec = CUSTOM if pod_of(job)["containers"][0]["image"] == "registry.example/llm-agent:1" else BUILTIN
    assert "imagePullSecrets" not in pod_of(build(REF, spec, public))


def test_pull_secret_names_are_checked_when_the_controller_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORL_ADMIN_TOKEN", "x" * 32)
    monkeypatch.setenv("AUTORL_IMAGE_PULL_SECRETS", "ghcr-pull,quay.io-pull")
    assert ControllerSettings().image_pull_secrets == ["ghcr-pull", "quay.io-pull"]
    monkeypatch.setenv("AUTORL_IMAGE_PULL_SECRETS", "Bad_Name")
    with pytest.raises(ValueError, match="'Bad_Name' is not a Secret name"):
        ControllerSettings()


BUILTIN_WITH_ENV = tiny_gsm8k_spec(
    {
        "builtin": "example_grpo",
        "args": ["--learning-rate", "1e-6", "-v"],
        "env": [{"name": "WANDB_MODE", "value": "offline"}],
        "envFrom": [
            {"secretRef": {"name": "llm-api-key"}},
            {"configMapRef": {"name": "tuning"}, "prefix": "TUNE_"},
        ],
    }
)


def test_builtin_agent_gets_what_the_spec_declares_through_the_runner() -> None:
    job = build_agent_job(REF, BUILTIN_WITH_ENV, SETTINGS)
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    container = pod_of(job)["containers"][0]
    # The runner passes on exactly the variables under its prefix, under their own names.
    assert {"name": "AUTORL_AGENT_ENV_WANDB_MODE", "value": "offline"} in container["env"]
    assert not any(item["name"] == "WANDB_MODE" for item in container["env"])
    assert container["envFrom"] == [
        {"secretRef": {"name": REF.secret_name}},  # the contract's token and URL: not prefixed
        {"secretRef": {"name": "llm-api-key"}, "prefix": "AUTORL_AGENT_ENV_"},
        {"configMapRef": {"name": "tuning"}, "prefix": "AUTORL_AGENT_ENV_TUNE_"},
    ]
    assert container["args"][-4:] == [
        "--echo-output",
        "--agent-arg=--learning-rate",
        "--agent-arg=1e-6",
        "--agent-arg=-v",
    ]


def test_custom_agent_gets_a_mirror_sidecar_of_the_platform_image() -> None:
    job = build_agent_job(REF, CUSTOM, SETTINGS)
    pod = pod_of(job)
    (sidecar,) = pod["initContainers"]
    # A native sidecar: started before the agent, ended with it (the Job completes with the agent).
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == SETTINGS.runner_image
    assert sidecar["command"] == ["autorl", "agent-runner", "mirror"]
    assert sidecar["args"] == ["--workspace", "/workspace", "--group-readable"]
    # Only the agent's own token and its workspace: none of the spec's secrets, no model, no data.
    assert sidecar["envFrom"] == [{"secretRef": {"name": REF.secret_name}}]
    assert {m["mountPath"]: m.get("subPath") for m in sidecar["volumeMounts"]} == {
        "/tmp": None,
        "/workspace": REF.workspace_subpath,
    }
    assert {"name": "BASE_MODEL", "value": CUSTOM.model} in sidecar["env"]
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    # The custom image's own variables keep their names: nothing strips a prefix there.
    agent = pod["containers"][0]
    assert {"name": "LOG_LEVEL", "value": "debug"} in agent["env"]
    assert {"secretRef": {"name": "llm-api-key"}} in agent["envFrom"]


@pytest.mark.parametrize(("spec", "command"), [(BUILTIN, "group-read"), (CUSTOM, "mirror")])
def test_a_sidecar_keeps_the_agents_files_readable_by_the_graders_group(
    spec: ExperimentSpec, command: str
) -> None:
    job = build_agent_job(REF, spec, SETTINGS)
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    pod = pod_of(job)
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["image"] == SETTINGS.runner_image
    assert sidecar["command"] == ["autorl", "agent-runner", command]
    assert sidecar["args"][:2] == ["--workspace", "/workspace"]
    # The agent's own user (the pod's: it may change the modes of the agent's files) with the
    # platform's group as its own (a folder it changes keeps its setgid bit) ...
    security = sidecar["securityContext"]
    assert "runAsUser" not in security
    assert pod["securityContext"]["runAsUser"] == agent_run_as_id(REF, SETTINGS)
    assert security["runAsGroup"] == SETTINGS.platform_gid
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    # ... which opens nothing but this experiment's workspace, writable since modes change there.
    volume = pod["volumes"][0]["name"]
    shared = [m for m in sidecar["volumeMounts"] if m["name"] == volume]
    assert shared == [{"name": volume, "mountPath": "/workspace", "subPath": REF.workspace_subpath}]
    # Its scratch space (the root file system is read-only) is its own: an emptyDir no other
    # container of the pod mounts, so nothing the agent leaves in its /tmp is in the sidecar's.
    volumes = {v["name"]: v for v in pod["volumes"]}
    (scratch,) = [m for m in sidecar["volumeMounts"] if m["name"] != volume]
    assert scratch["mountPath"] == "/tmp" and volumes[scratch["name"]] == {
        "name": scratch["name"],
        "emptyDir": {},
    }
    others = [c for c in [*pod["initContainers"], *pod["containers"]] if c is not sidecar]
    assert all(m["name"] != scratch["name"] for c in others for m in c["volumeMounts"])
    # The agent itself never gets the platform's group.
    agent = pod["containers"][0]
    assert "runAsGroup" not in agent["securityContext"]
    assert pod["securityContext"]["runAsGroup"] == agent_run_as_id(REF, SETTINGS)
    assert "supplementalGroups" not in pod["securityContext"] and "fsGroup" not in pod["securityContext"]
    # The agent never sees the sidecar's process (its user's process with the platform's group).
    assert "shareProcessNamespace" not in pod


def pod(job_uid: str, *statuses: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"ownerReferences": [{"kind": "Job", "uid": job_uid}]},
        "status": {"containerStatuses": list(statuses)},
    }


def container_state(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "state": state}


def test_the_budget_starts_when_the_agent_container_runs() -> None:
    at = "2026-11-30T12:00:05Z"
    epoch = datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC).timestamp()
    pending = {"waiting": {"reason": "ContainerCreating"}}
    # Pending, pulling, or only the sidecar running: not yet.
    assert agent_running_since([], "job-1", "agent") is None
    assert agent_running_since([pod("job-1", container_state("agent", pending))], "job-1", "agent") is None
    sidecar_only = pod(
        "job-1",
        container_state("mirrors", {"running": {"startedAt": "2026-11-30T11:59:00Z"}}),
        container_state("agent", {"waiting": {"reason": "ErrImagePull"}}),
    )
    assert agent_running_since([sidecar_only], "job-1", "agent") is None
    running = pod("job-1", container_state("agent", {"running": {"startedAt": at}}))
    assert agent_running_since([running], "job-1", "agent") == epoch
    # Already over by the time it is seen: its start still counts.
    ended = pod("job-1", container_state("agent", {"terminated": {"startedAt": at, "exitCode": 0}}))
    assert agent_running_since([ended], "job-1", "agent") == epoch
    # An earlier run's pod (another Job of the same name) is not this run's start.
    stale = pod("job-0", container_state("agent", {"running": {"startedAt": "2026-11-30T10:00:00Z"}}))
    assert agent_running_since([stale, running], "job-1", "agent") == epoch
