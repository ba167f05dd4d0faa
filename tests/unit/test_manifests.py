"""The pure ``build_*`` functions and lifecycle rules of the controller, without any server."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from typing import Any

import kopf
import kubernetes_validate
import pytest

from autorl.experiment import ExperimentSpec, Phase
from autorl_controller.operator.handlers.create import validation_error
from autorl_controller.operator.handlers.reconcile import is_active, summary
from autorl_controller.operator.lifecycle import (
    JobState,
    JobStatus,
    agent_deadline_s,
    agent_outcome,
    job_status,
    outcome_condition,
    outcome_from_conditions,
    status_from_view,
)
from autorl_controller.operator.manifests import (
    KUEUE_QUEUE_LABEL,
    ExperimentRef,
    agent_run_as_id,
    build_agent_job,
    build_network_policy,
    build_prepare_job,
    build_registration,
    build_token_secret,
    cached_model_subpath,
    check_egress,
    id_collisions,
)
from autorl_controller.operator.settings import ControllerSettings

KUBERNETES_VERSION = kubernetes_validate.latest_version()
REF = ExperimentRef("gsm8k-grpo", "team-a")
SETTINGS = ControllerSettings(
    admin_token="x" * 32,
    runner_image="registry.example/autorl-agent-runner:0.1.0",
    shared_pvc="autorl-shared",
    grader_namespace="autorl",
    deadline_grace_s=300,
    agent_node_selector={"nvidia.com/gpu.present": "true"},
    agent_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)
BUILTIN = ExperimentSpec.model_validate(
    {
        "task": "gsm8k",
        "model": "Qwen/Qwen2.5-1.5B",
        "agent": {"builtin": "example_grpo", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        "timeoutSeconds": 3600,
    }
)
CUSTOM = ExperimentSpec.model_validate(
    {
        "task": "gsm8k",
        "model": "builtin:tiny-qwen2",
        "agent": {
            "image": "registry.example/llm-agent:1",
            "command": ["python", "-m", "agent"],
            "args": ["--fast"],
            "env": [{"name": "LOG_LEVEL", "value": "debug"}],
            "envFrom": [{"secretRef": {"name": "llm-api-key"}}],
        },
        "timeoutSeconds": 600,
        "egress": [{"host": "api.example.com"}, {"cidr": "203.0.113.0/24", "ports": [8443]}],
        "queueName": "gpu-queue",
    }
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
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


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
        assert "runAsUser" not in security and "runAsGroup" not in security
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
    for container in all_containers(job):
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert set(mounts) == {
            "/workspace",
            "/workspace/data",
            f"/workspace/models/{mounts_model(spec)}",
            "/tmp",
        }
        assert mounts["/tmp"]["name"] == "tmp"  # an emptyDir: the root file system is read-only
        assert mounts["/workspace"]["subPath"] == "experiments/team-a/gsm8k-grpo"
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
    assert "AUTORL_TOKEN" not in env and "GRADING_SERVER_URL" not in env
    assert all("valueFrom" not in item for item in container["env"])
    assert container["envFrom"][0] == {"secretRef": {"name": REF.secret_name}}


def test_builtin_agent_runs_under_the_agent_runner() -> None:
    job = build_agent_job(REF, BUILTIN, SETTINGS)
    pod = pod_of(job)
    container = pod["containers"][0]
    assert "initContainers" not in pod
    assert container["image"] == SETTINGS.runner_image
    assert container["command"] == ["autorl", "agent-runner"]
    assert container["args"] == [
        "--agent", "example_grpo", "--workspace", "/workspace", "--task", "gsm8k",
        "--base-model", "Qwen/Qwen2.5-1.5B", "--timeout", "3600", "--sandbox", "none",
    ]  # fmt: skip
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_custom_agent_runs_its_own_image_in_the_prepared_workspace() -> None:
    pod = pod_of(build_agent_job(REF, CUSTOM, SETTINGS))
    agent = pod["containers"][0]
    assert "initContainers" not in pod
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
        "--workspace", "/shared/experiments/team-a/gsm8k-grpo", "--timeout", "3600",
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
    ExperimentRef("gsm8k-grpo", "team-a"),
    ExperimentRef("gsm8k-grpo", "team-b"),
    ExperimentRef("gsm8k-grpo-2", "team-a"),
    ExperimentRef("team-a", "gsm8k-grpo"),
    ExperimentRef("a", "b"),
]


@pytest.mark.parametrize("ref", NEIGHBOURS, ids=[f"{r.namespace}/{r.name}" for r in NEIGHBOURS])
def test_each_experiment_runs_as_its_own_stable_id_in_the_documented_range(ref: ExperimentRef) -> None:
    run_as = agent_run_as_id(ref, SETTINGS)
    assert SETTINGS.agent_id_start <= run_as < SETTINGS.agent_id_start + SETTINGS.agent_id_count
    assert run_as not in (SETTINGS.platform_uid, SETTINGS.platform_gid, 0)
    # Stable: another controller (restart, other settings object) derives the same id.
    assert agent_run_as_id(ExperimentRef(ref.name, ref.namespace), ControllerSettings()) == run_as
    for job in (build_agent_job(ref, BUILTIN, SETTINGS), build_prepare_job(ref, BUILTIN, SETTINGS)):
        assert pod_of(job)["securityContext"]["runAsUser"] == run_as
        assert pod_of(job)["securityContext"]["runAsGroup"] == run_as


def test_id_collisions_name_the_other_experiments_that_share_an_id() -> None:
    tiny = SETTINGS.model_copy(update={"agent_id_count": 3})  # a range this small must collide
    refs = [ExperimentRef(f"exp-{i}", "team-a") for i in range(10)]
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
    ids=["dns-and-grader-only", "hosts-and-cidrs", "unresolved-host"],
)
def test_network_policy_allows_dns_the_grader_and_the_spec_only(
    spec: ExperimentSpec, resolved: dict[str, list[str]], extra_rules: list[dict[str, Any]]
) -> None:
    policy = build_network_policy(REF, spec, SETTINGS, resolved)["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {"autorl.io/experiment": REF.name, "autorl.io/role": "agent"}
    }
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    dns, grader, *rest = policy["egress"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {"protocol": "UDP", "port": 53} in dns["ports"]
    assert grader["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "autorl"}}
    assert grader["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "grader"
    assert grader["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rest == extra_rules


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
        ("::/0", None, ["fc00::/7", "fe80::/10", "::ffff:0:0/96"]),
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
    (block,) = policy["spec"]["egress"][2]["to"]
    assert block["ipBlock"].get("except") == excepted


def test_host_addresses_inside_the_cluster_are_never_allowed() -> None:
    """A name may resolve anywhere (a DNS record pointing at a Service): only outside addresses count."""
    spec = egress_spec({"host": "api.example.com"})
    resolved = {"api.example.com": ["10.96.0.10", "198.51.100.7", "169.254.169.254", "fd00::1"]}
    policy = build_network_policy(REF, spec, SETTINGS, resolved)
    allowed = [peer["ipBlock"]["cidr"] for rule in policy["spec"]["egress"][2:] for peer in rule["to"]]
    assert allowed == ["198.51.100.7/32"]
    everything_inside = build_network_policy(REF, spec, SETTINGS, {"api.example.com": ["10.1.1.1"]})
    assert len(everything_inside["spec"]["egress"]) == 2  # DNS and the grader: nothing more


def test_registration_names_the_experiment_per_namespace_and_maps_paths() -> None:
    body = build_registration(REF, BUILTIN, SETTINGS)
    assert body == {
        "name": "team-a.gsm8k-grpo",
        "task": "gsm8k",
        "model": "Qwen/Qwen2.5-1.5B",
        "timeout_s": 3600,
        "max_submissions": 100,
        "protocol": "opencompass",
        "workspace": "/shared/experiments/team-a/gsm8k-grpo",
        "output_dir": "/shared/experiments/team-a/gsm8k-grpo/output",
        "base_model_dir": "/shared/cache/models/hub/Qwen--Qwen2.5-1.5B",
        "agent_workspace": "/workspace",
        "agent": "example_grpo",
    }


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
    view = {
        "baseline_score": 25.0,
        "best_score": 31.5,
        "best_submission": 7,
        "improvement": 6.5,
        "submissions": 3,
        "start_time": 1767225600.0,
        "end_time": 1767232800.0,
    }
    assert status_from_view(view) == {
        "baselineScore": 25.0,
        "bestScore": 31.5,
        "bestSubmission": 7,
        "improvement": 6.5,
        "submissions": 3,
        "startTime": "2026-01-01T00:00:00Z",
        "deadline": "2026-01-01T02:00:00Z",
    }
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    assert summary(outcome, view).endswith("best 31.50 vs baseline 25.00 (+6.50) over 3 scored submission(s)")
    assert "no submission was scored" in summary(outcome, {"baseline_score": 25.0})


@pytest.mark.parametrize(
    ("name", "spec", "fragment"),
    [
        ("ok", {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B"}, None),
        ("ok", {"task": "gsm8k", "model": "/data/my-model"}, "local folders do not exist inside a cluster"),
        (
            "ok",
            {"task": "gsm8k", "model": "m/n", "agent": {"builtin": "a", "image": "b"}},
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
