"""Pure functions from an Experiment to the objects the controller creates for it.

Nothing here talks to a server: each ``build_*`` takes the validated spec and the controller's
settings and returns a manifest (or the grader's registration payload), so every security-relevant
field is unit-tested. Handlers adopt the manifests (owner references) and create them if missing.

Layout of the shared ReadWriteMany volume (mounted at ``settings.shared_mount`` in the grader and
evaluators, which see the same paths)::

    cache/models/<hub|builtin>/<dir>    base models, filled by the prepare Job
    cache/data/<task>/train.jsonl       train split only; the test split never is on this volume
    experiments/<namespace>/<name>/     one workspace per Experiment; an agent pod mounts only this,
                                        its base model and its train split (read-only)
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autorl.checkpoints import BUILTIN_BUILD_VERSION, BUILTIN_PREFIX, model_dir_name
from autorl.experiment import ExperimentSpec
from autorl_controller.operator.settings import AGENT_WORKSPACE, ControllerSettings

LABEL_EXPERIMENT = "autorl.io/experiment"
LABEL_ROLE = "autorl.io/role"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SECRET_TOKEN_KEY = "AUTORL_TOKEN"
SECRET_URL_KEY = "GRADING_SERVER_URL"
#: A prepare Job downloads a model once per cache; retrying covers a flaky hub connection.
PREPARE_BACKOFF_LIMIT = 3
PREPARE_DEADLINE_S = 7200
SHARED_VOLUME = "shared"


@dataclass(frozen=True)
class ExperimentRef:
    """An Experiment's identity and the names of everything derived from it."""

    name: str
    namespace: str

    @property
    def grader_name(self) -> str:
        # Kubernetes names are unique per namespace, the grader's across the deployment; a '.' never
        # occurs in a namespace, so "<namespace>.<name>" cannot collide.
        return f"{self.namespace}.{self.name}"

    @property
    def secret_name(self) -> str:
        return f"{self.name}-agent-token"

    @property
    def prepare_job_name(self) -> str:
        return f"{self.name}-prepare"

    @property
    def agent_job_name(self) -> str:
        return f"{self.name}-agent"

    @property
    def policy_name(self) -> str:
        return f"{self.name}-agent"

    @property
    def workspace_subpath(self) -> str:
        return f"experiments/{self.namespace}/{self.name}"


def cached_model_subpath(model: str) -> str:
    """Where the prepare Job leaves a model source under ``cache/models`` (``autorl.checkpoints``' layout)."""
    if model.startswith(BUILTIN_PREFIX):
        return f"builtin/{model[len(BUILTIN_PREFIX) :]}-v{BUILTIN_BUILD_VERSION}"
    return f"hub/{model.replace('/', '--')}"


def check_cluster_model(model: str) -> None:
    """In a cluster only hub ids and built-in models exist: a local folder is on nobody's disk."""
    if model.startswith(BUILTIN_PREFIX):
        return
    org, _, name = model.partition("/")
    if not org or not name or "/" in name or model.startswith((".", "/", "~")):
        raise ValueError(
            f"model {model!r}: use a Hugging Face hub id such as Qwen/Qwen2.5-1.5B or builtin:tiny-qwen2 "
            "(local folders do not exist inside a cluster)"
        )


def labels(ref: ExperimentRef, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "autorl",
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "autorl-controller",
        LABEL_EXPERIMENT: ref.name,
        LABEL_ROLE: role,
    }


def _metadata(ref: ExperimentRef, name: str, role: str) -> dict[str, Any]:
    return {"name": name, "namespace": ref.namespace, "labels": labels(ref, role)}


def shared_path(settings: ControllerSettings, subpath: str) -> str:
    return f"{settings.shared_mount.rstrip('/')}/{subpath}"


def build_registration(
    ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings
) -> dict[str, Any]:
    """The body of ``POST /v1/experiments``: paths as the grader and evaluators see the shared volume."""
    workspace = shared_path(settings, ref.workspace_subpath)
    return {
        "name": ref.grader_name,
        "task": spec.task,
        "model": spec.model,
        "timeout_s": spec.timeoutSeconds,
        "max_submissions": spec.evaluation.maxSubmissions,
        "protocol": spec.evaluation.protocol,
        "workspace": workspace,
        "output_dir": f"{workspace}/output",
        "base_model_dir": shared_path(settings, f"cache/models/{cached_model_subpath(spec.model)}"),
        "agent_workspace": AGENT_WORKSPACE,
        "agent": spec.agent.display_name,
    }


def build_token_secret(ref: ExperimentRef, *, token: str, grading_server_url: str) -> dict[str, Any]:
    """The agent's credentials, passed to its pod by ``envFrom`` (keys are the variable names)."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(ref, ref.secret_name, "token"),
        "type": "Opaque",
        "immutable": True,
        "data": {SECRET_TOKEN_KEY: b64(token), SECRET_URL_KEY: b64(grading_server_url)},
    }


def _pod_security(settings: ControllerSettings) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.agent_uid,
        "runAsGroup": settings.agent_uid,
        "fsGroup": settings.agent_uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    # Pod Security "restricted": what an untrusted agent container may not do.
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _shared_volume(settings: ControllerSettings) -> dict[str, Any]:
    return {"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": settings.shared_pvc}}


def build_prepare_job(
    ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings
) -> dict[str, Any]:
    """Fill the shared cache with the base model and the train split, and create the workspace folder.

    Platform code, not the agent's: it mounts the whole shared volume, so that it can create the
    workspace owned by the agent's user (a subPath that does not exist yet would be created by
    the kubelet as root, unwritable for the agent).
    """
    cache = shared_path(settings, "cache")
    container: dict[str, Any] = {
        "name": "prepare",
        "image": settings.runner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["autorl", "agent-runner", "prepare"],
        "args": [
            "--task",
            spec.task,
            "--model",
            spec.model,
            "--workspace",
            shared_path(settings, ref.workspace_subpath),
            "--timeout",
            str(spec.timeoutSeconds),
        ],
        "env": [
            {"name": "AUTORL_CACHE_DIR", "value": cache},
            {"name": "AUTORL_HOME", "value": "/tmp/autorl"},
            {"name": "HF_HOME", "value": f"{cache}/huggingface"},
            {"name": "HOME", "value": "/tmp"},
        ],
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": SHARED_VOLUME, "mountPath": settings.shared_mount}],
    }
    if settings.prepare_env_secret:
        container["envFrom"] = [{"secretRef": {"name": settings.prepare_env_secret, "optional": True}}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(ref, ref.prepare_job_name, "prepare"),
        "spec": {
            "backoffLimit": PREPARE_BACKOFF_LIMIT,
            "activeDeadlineSeconds": PREPARE_DEADLINE_S,
            "template": {
                "metadata": {"labels": labels(ref, "prepare")},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(settings),
                    "containers": [container],
                    "volumes": [_shared_volume(settings)],
                },
            },
        },
    }


def agent_environment(spec: ExperimentSpec) -> list[dict[str, str]]:
    """The workspace contract of DESIGN.md (token and URL come from the Secret), then the spec's own."""
    base = model_dir_name(spec.model)
    contract = {
        "WORKSPACE": AGENT_WORKSPACE,
        "OUTPUT_DIR": f"{AGENT_WORKSPACE}/output",
        "MODEL_PATH": f"{AGENT_WORKSPACE}/models/{base}",
        "DATA_PATH": f"{AGENT_WORKSPACE}/data",
        "TASK": spec.task,
        "BASE_MODEL": spec.model,
        "HOME": AGENT_WORKSPACE,
        "HF_HUB_OFFLINE": "1",
    }
    env = [{"name": name, "value": value} for name, value in contract.items()]
    env += [{"name": var.name, "value": var.value} for var in spec.agent.env or []]
    return env


def _agent_mounts(ref: ExperimentRef, spec: ExperimentSpec) -> list[dict[str, Any]]:
    base = model_dir_name(spec.model)
    return [
        {"name": SHARED_VOLUME, "mountPath": AGENT_WORKSPACE, "subPath": ref.workspace_subpath},
        {
            "name": SHARED_VOLUME,
            "mountPath": f"{AGENT_WORKSPACE}/models/{base}",
            "subPath": f"cache/models/{cached_model_subpath(spec.model)}",
            "readOnly": True,
        },
        {
            "name": SHARED_VOLUME,
            "mountPath": f"{AGENT_WORKSPACE}/data",
            "subPath": f"cache/data/{spec.task}",
            "readOnly": True,
        },
    ]


def build_agent_job(ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings) -> dict[str, Any]:
    """The agent's Job: a built-in agent under the agent runner, or a custom image of its own.

    Restricted Pod Security, no service-account token, no service links (no addresses of Postgres or
    Redis in its environment), credentials only by ``envFrom``, and a hard deadline.
    """
    env_from: list[dict[str, Any]] = [{"secretRef": {"name": ref.secret_name}}]
    env_from += [source.model_dump(exclude_none=True) for source in spec.agent.envFrom or []]
    container: dict[str, Any] = {
        "name": "agent",
        "imagePullPolicy": settings.image_pull_policy,
        "workingDir": AGENT_WORKSPACE,
        "env": agent_environment(spec),
        "envFrom": env_from,
        "securityContext": _container_security(),
        "volumeMounts": _agent_mounts(ref, spec),
    }
    if spec.agent.resources is not None:
        container["resources"] = spec.agent.resources.model_dump(exclude_none=True)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(settings),
        "volumes": [_shared_volume(settings)],
    }
    if spec.agent.builtin is not None:
        container["image"] = settings.runner_image
        container["command"] = ["autorl", "agent-runner"]
        container["args"] = [
            "--agent",
            spec.agent.builtin,
            "--workspace",
            AGENT_WORKSPACE,
            "--task",
            spec.task,
            "--base-model",
            spec.model,
            "--timeout",
            str(spec.timeoutSeconds),
            # The pod is the sandbox (restricted, own user, NetworkPolicy); no nested one.
            "--sandbox",
            "none",
        ]
    else:
        # The prepare Job laid out the workspace and its mirrors; the custom image runs as it is.
        container["image"] = spec.agent.image
        if spec.agent.command:
            container["command"] = list(spec.agent.command)
        if spec.agent.args:
            container["args"] = list(spec.agent.args)
    pod["containers"] = [container]
    if settings.agent_node_selector:
        pod["nodeSelector"] = dict(settings.agent_node_selector)
    if settings.agent_tolerations:
        pod["tolerations"] = [dict(t) for t in settings.agent_tolerations]

    metadata = _metadata(ref, ref.agent_job_name, "agent")
    if spec.queueName:
        metadata["labels"][KUEUE_QUEUE_LABEL] = spec.queueName
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            # A retried agent would start its budget over; one attempt, like a local run.
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.timeoutSeconds + settings.deadline_grace_s,
            "template": {"metadata": {"labels": labels(ref, "agent")}, "spec": pod},
        },
    }


def _cidr_for(address: str) -> str:
    return f"{address}/128" if ":" in address else f"{address}/32"


def build_network_policy(
    ref: ExperimentRef,
    spec: ExperimentSpec,
    settings: ControllerSettings,
    resolved_hosts: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Agent pods: no ingress; egress only to DNS, the grader, and the spec's ``egress`` rules.

    A NetworkPolicy knows addresses, not names: a ``host`` rule allows the addresses it resolved to
    (``resolved_hosts``, refreshed by the controller while the experiment runs).
    """
    egress: list[dict[str, Any]] = [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": settings.dns_namespace}
                    },
                    "podSelector": {"matchLabels": dict(settings.dns_pod_labels)},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": settings.grader_namespace}
                    },
                    "podSelector": {"matchLabels": dict(settings.grader_pod_labels)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": settings.grader_port}],
        },
    ]
    resolved_hosts = resolved_hosts or {}
    for rule in spec.egress or []:
        if rule.cidr is not None:
            blocks = [rule.cidr]
        else:
            assert rule.host is not None
            blocks = sorted({_cidr_for(address) for address in resolved_hosts.get(rule.host, ())})
        if not blocks:
            continue
        egress.append(
            {
                "to": [{"ipBlock": {"cidr": block}} for block in blocks],
                "ports": [{"protocol": "TCP", "port": port} for port in rule.tcp_ports],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(ref, ref.policy_name, "agent-policy"),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_EXPERIMENT: ref.name, LABEL_ROLE: "agent"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }
