"""Pure functions from an Experiment to the objects the controller creates for it.

Nothing here talks to a server: each ``build_*`` takes the validated spec and the controller's
settings and returns a manifest (or the grader's registration payload), so every security-relevant
field is unit-tested. Handlers adopt the manifests (owner references) and create them if missing.

Layout of the shared ReadWriteMany volume (mounted read-only at ``settings.shared_mount`` in the
grader, which sees the same paths) and who owns what on it::

    cache/models/<hub|builtin>/<dir>    base models        platform uid, 0755/0644
    cache/data/<task>/train.jsonl       train split only   (the test split never is on this volume)
    experiments/<namespace>/            1733: any experiment's prepare step may add its folder there,
                                        none may list or remove another's
    experiments/<namespace>/<name>/     the workspace: the experiment's own uid, the platform group,
                                        2750; an agent pod mounts only this, its base model and its
                                        train split (read-only)

Each experiment runs as its own user and group id (``agent_run_as_id``), so no agent can read
another's files even past its mounts; the grader reads submissions through the platform group,
which no agent pod is ever in.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autorl.agent_env import DECLARED_ENV_PREFIX
from autorl.api.request_bodies import RegisterExperiment
from autorl.cli import EXIT_BAD_INPUT
from autorl.experiment import IPV4_SPELLING_PREFIXES, ExperimentSpec
from autorl.layout import MODELS_DIR, OUTPUT_DIR, cached_model_subpath
from autorl.models.sources import model_dir_name
from autorl.protocol.feedback import Feedback
from autorl_controller.operator.settings import AGENT_WORKSPACE, ControllerSettings

LABEL_EXPERIMENT = "autorl.io/experiment"
LABEL_ROLE = "autorl.io/role"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SECRET_TOKEN_KEY = "AUTORL_TOKEN"
#: What names an experiment's agent token Secret, after the Experiment's name.
AGENT_TOKEN_SUFFIX = "-agent-token"
SECRET_URL_KEY = "GRADING_SERVER_URL"
#: A prepare Job downloads a model once per cache; retrying covers a flaky hub connection.
PREPARE_BACKOFF_LIMIT = 3
PREPARE_DEADLINE_S = 7200
SHARED_VOLUME = "shared"
TMP_VOLUME = "tmp"
#: Never a destination: link-local addresses (cloud metadata services hand out node credentials
#: there), and the IPv6 prefixes that spell an IPv4 address (IPv4-mapped, NAT64, 6to4, ...), which a
#: CNI may read, or a translator on the path route, as the IPv4 range they spell (::ffff:10.0.0.0/104,
#: 64:ff9b::10.0.0.0/104: the cluster's own ranges).
ALWAYS_DENIED_CIDRS = ("169.254.0.0/16", "fe80::/10", *IPV4_SPELLING_PREFIXES)
#: The resolver of an agent pod that may look up no name: the pod's own loopback, where nothing of the
#: platform answers, so a lookup fails at once rather than after a timeout (a resolver the agent ran
#: there itself would know only what the agent knows). The NetworkPolicy keeps the cluster's DNS out
#: of reach; this keeps it out of the pod's resolv.conf too.
NO_DNS_CONFIG = {"nameservers": ["127.0.0.1"], "options": [{"name": "attempts", "value": "1"}]}


@dataclass(frozen=True)
class ExperimentRef:
    """An Experiment's identity and the names of everything derived from it.

    Kubernetes knows an object by its namespace and name, and one incarnation of it by its ``uid``:
    deleting an Experiment and applying it again keeps the name but makes a new uid, hence a new run
    with its own grader record and workspace, while the earlier run's stay as history. Children keep
    name-derived names (``<name>-agent``…); the handlers check that a child they find is owned by this
    uid before they trust it.
    """

    name: str
    namespace: str
    uid: str = ""

    def _require_uid(self) -> str:
        if not self.uid:
            raise ValueError(f"experiment {self.namespace}/{self.name}: its uid is needed to name its run")
        return self.uid

    @property
    def grader_name(self) -> str:
        # Kubernetes names are unique per namespace, the grader's across the deployment and across runs;
        # a '.' never occurs in a namespace or an Experiment's name, so "<namespace>.<name>.<uid>" cannot
        # collide, and every re-application is a new record.
        return f"{self.namespace}.{self.name}.{self._require_uid()}"

    @property
    def secret_name(self) -> str:
        return f"{self.name}{AGENT_TOKEN_SUFFIX}"

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
        """One folder per run: a re-applied Experiment starts empty, the earlier run's files stay."""
        return f"experiments/{self.namespace}/{self.name}.{self._require_uid()}"


def agent_run_as_id(ref: ExperimentRef, settings: ControllerSettings) -> int:
    """The experiment's own user and group id: stable for its namespace and name, spread by SHA-256.

    Deterministic, so a restarted controller, a retried prepare Job and the agent Job agree without
    stored state; with the default range of 2·10⁹ ids, two of a thousand experiments share one with
    probability ~2.5·10⁻⁴, and then the younger is refused before it runs (``id_collisions``).
    """
    digest = hashlib.sha256(f"{ref.namespace}/{ref.name}".encode()).digest()
    return settings.agent_id_start + int.from_bytes(digest[:8], "big") % settings.agent_id_count


def id_collisions(
    ref: ExperimentRef, others: Iterable[ExperimentRef], settings: ControllerSettings
) -> list[ExperimentRef]:
    """The other experiments that run as the same id as ``ref`` (rare: see ``agent_run_as_id``)."""
    mine = agent_run_as_id(ref, settings)
    key = (ref.namespace, ref.name)
    return [
        other
        for other in others
        if (other.namespace, other.name) != key and agent_run_as_id(other, settings) == mine
    ]


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


def _cached_model(spec: ExperimentSpec) -> str:
    return f"cache/models/{cached_model_subpath(spec.model)}"


def build_registration(
    ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings
) -> RegisterExperiment:
    """The body of ``POST /v1/experiments``: paths as the grader and evaluators see the shared volume."""
    workspace = shared_path(settings, ref.workspace_subpath)
    return RegisterExperiment(
        name=ref.grader_name,
        task=spec.task,
        model=spec.model,
        timeout_s=spec.timeoutSeconds,
        max_submissions=spec.evaluation.maxSubmissions,
        protocol=spec.evaluation.protocol,
        feedback=spec.evaluation.feedback,
        known_checkpoints=list(spec.evaluation.knownCheckpoints),
        workspace=workspace,
        output_dir=f"{workspace}/{OUTPUT_DIR}",
        base_model_dir=shared_path(settings, _cached_model(spec)),
        agent_workspace=AGENT_WORKSPACE,
        agent=spec.agent.display_name,
    )


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


def needs_dns(spec: ExperimentSpec) -> bool:
    """Whether the agent may look names up: only when its ``egress`` lists a host name. Cluster DNS
    answers outside names too, so a resolver is a channel out (a DNS tunnel): no name, no DNS."""
    return any(rule.host is not None for rule in spec.egress or [])


class GraderServiceError(ValueError):
    """The grader's Service cannot give the address agents reach the grader at."""


def agent_grading_url(service: Mapping[str, Any], token: str, settings: ControllerSettings) -> str:
    """The ``GRADING_SERVER_URL`` an agent pod gets: ``http://CLUSTER_IP:PORT/a/<token>``.

    An address, not the Service's DNS name: an agent pod without egress host names has no resolver
    (:func:`needs_dns`). ``service`` is the grader's Service as the API returns it; the port is the
    one that leads to the grader's agent port (``settings.grader_port``, named ``http`` in the chart).
    """
    name = service.get("metadata", {}).get("name", settings.grader_service)
    spec = service.get("spec") or {}
    address = spec.get("clusterIP")
    if not address or address == "None":
        raise GraderServiceError(
            f"Service {settings.grader_namespace}/{name} has no cluster IP (headless?); agents reach the "
            "grader at its Service's address: give the grader a ClusterIP Service (the chart's default)"
        )
    ports = spec.get("ports") or []
    port = next(
        (p["port"] for p in ports if p.get("targetPort", p.get("port")) in (settings.grader_port, "http")),
        None,
    )
    if port is None:
        raise GraderServiceError(
            f"Service {settings.grader_namespace}/{name} has no port leading to the grader's agent port "
            f"{settings.grader_port} (targetPort {settings.grader_port} or 'http'); set grader_port to the "
            "grader's container port"
        )
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"http://{host}:{port}/a/{token}"


def _pod_security(
    settings: ControllerSettings, run_as: int, *, volume_group: int | None = None
) -> dict[str, Any]:
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": run_as,
        "runAsGroup": run_as,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if settings.agent_strict_groups:
        # No extra groups from the image's own /etc/group (where an image could name any group).
        security["supplementalGroupsPolicy"] = "Strict"
    if volume_group is not None:
        # The pod joins the group; a fresh volume's root becomes writable by it (setgid, g+rwx). Only
        # when the root does not match yet: a recursive change of a full volume would take long.
        security["fsGroup"] = volume_group
        security["fsGroupChangePolicy"] = "OnRootMismatch"
    return security


def _container_security(*, user: int | None = None, group: int | None = None) -> dict[str, Any]:
    # Pod Security "restricted", and a root file system nobody writes (scratch space is /tmp).
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if user is not None:
        security["runAsUser"] = user
    if group is not None:
        security["runAsGroup"] = group
    return security


def _shared_volume(settings: ControllerSettings, *, read_only: bool = False) -> dict[str, Any]:
    claim: dict[str, Any] = {"claimName": settings.shared_pvc}
    if read_only:
        claim["readOnly"] = True
    return {"name": SHARED_VOLUME, "persistentVolumeClaim": claim}


def _pull_secrets(settings: ControllerSettings) -> list[dict[str, str]]:
    """``imagePullSecrets`` of every pod the controller creates (private registries)."""
    return [{"name": name} for name in settings.image_pull_secrets]


def _tmp_volume() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "emptyDir": {}}


def _tmp_mount() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "mountPath": "/tmp"}


#: The platform sidecars' own scratch space: they share nothing with the agent but its workspace
#: (no file the agent plants in its /tmp is ever in theirs).
SIDECAR_TMP_VOLUME = "sidecar-tmp"


def _sidecar_tmp_mount() -> dict[str, Any]:
    return {"name": SIDECAR_TMP_VOLUME, "mountPath": "/tmp"}


def build_prepare_job(
    ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings
) -> dict[str, Any]:
    """Fill the shared cache, then create the workspace owned by the experiment's own user.

    Two steps under two users, since restricted pods cannot chown: ``cache`` (an init container, the
    platform's user) fills the cache and the namespace's folder of experiments; ``workspace`` (the
    experiment's user, in the platform group) creates the experiment's folder 2750 and lays it out,
    mounting only its namespace's folder and the cache (read-only). Neither runs agent code.
    """
    cache = shared_path(settings, "cache")
    workspace = shared_path(settings, ref.workspace_subpath)
    namespace_subpath = ref.workspace_subpath.rsplit("/", 1)[0]
    args = ["--task", spec.task, "--model", spec.model, "--workspace", workspace]
    args += ["--timeout", str(spec.timeoutSeconds)]
    if spec.evaluation.feedback == Feedback.SEALED:
        # The workspace's train split leaves out the validation split.
        args += ["--feedback", Feedback.SEALED.value]
    env = [
        {"name": "AUTORL_CACHE_DIR", "value": cache},
        {"name": "AUTORL_HOME", "value": "/tmp/autorl"},
        {"name": "HF_HOME", "value": f"{cache}/huggingface"},
        {"name": "HOME", "value": "/tmp"},
    ]
    resources = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}
    fill: dict[str, Any] = {
        "name": "cache",
        "image": settings.runner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["autorl", "agent-runner", "prepare"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "args": [*args, "--step", "cache"],
        "env": env,
        "resources": resources,
        "securityContext": _container_security(user=settings.platform_uid, group=settings.platform_gid),
        "volumeMounts": [{"name": SHARED_VOLUME, "mountPath": settings.shared_mount}, _tmp_mount()],
    }
    if settings.prepare_env_secret:
        fill["envFrom"] = [{"secretRef": {"name": settings.prepare_env_secret, "optional": True}}]
    layout: dict[str, Any] = {
        "name": "workspace",
        "image": settings.runner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["autorl", "agent-runner", "prepare"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "args": [
            *args,
            "--step",
            "workspace",
            "--group",
            str(settings.platform_gid),
            "--model-dir",
            shared_path(settings, _cached_model(spec)),
        ],
        "env": env,
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [
            {
                "name": SHARED_VOLUME,
                "mountPath": shared_path(settings, namespace_subpath),
                "subPath": namespace_subpath,
            },
            {"name": SHARED_VOLUME, "mountPath": cache, "subPath": "cache", "readOnly": True},
            _tmp_mount(),
        ],
    }
    run_as = agent_run_as_id(ref, settings)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(ref, ref.prepare_job_name, "prepare"),
        "spec": {
            "backoffLimit": PREPARE_BACKOFF_LIMIT,
            # Bad input (a hub id the hub does not know, a gated model, an unknown task) fails the Job
            # on its first try; only what may pass later (the hub unreachable) is tried again.
            "podFailurePolicy": {
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [EXIT_BAD_INPUT]}}
                ]
            },
            "activeDeadlineSeconds": PREPARE_DEADLINE_S,
            "template": {
                "metadata": {"labels": labels(ref, "prepare")},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(settings, run_as, volume_group=settings.platform_gid),
                    "initContainers": [fill],
                    "containers": [layout],
                    "volumes": [_shared_volume(settings), _tmp_volume()],
                    **({"imagePullSecrets": _pull_secrets(settings)} if settings.image_pull_secrets else {}),
                },
            },
        },
    }


def contract_environment(spec: ExperimentSpec) -> dict[str, str]:
    """The workspace contract (docs/AGENTS.md, "The workspace and the environment"; token and URL
    come from the Secret) and the pod's basics."""
    base = model_dir_name(spec.model)
    return {
        "WORKSPACE": AGENT_WORKSPACE,
        "OUTPUT_DIR": f"{AGENT_WORKSPACE}/{OUTPUT_DIR}",
        "MODEL_PATH": f"{AGENT_WORKSPACE}/{MODELS_DIR}/{base}",
        "DATA_PATH": f"{AGENT_WORKSPACE}/data",
        "TASK": spec.task,
        "BASE_MODEL": spec.model,
        # One Experiment is one run: seed 0, as `autorl run` without --repeat.
        "AUTORL_SEED": "0",
        "HOME": AGENT_WORKSPACE,
        # The pod's user has no passwd entry; Python's getpass (torch's caches) reads these instead.
        "USER": "agent",
        "LOGNAME": "agent",
        "HF_HUB_OFFLINE": "1",
    }


def agent_environment(spec: ExperimentSpec) -> list[dict[str, str]]:
    """The agent container's ``env``: the contract, then the spec's own variables.

    A custom image gets the spec's variables under their names. A built-in agent runs under the agent
    runner, which passes its agent only what the Experiment declares: the spec's variables reach it
    under ``DECLARED_ENV_PREFIX`` and the runner strips the prefix (``declared_env_from``).
    """
    prefix = DECLARED_ENV_PREFIX if spec.agent.builtin is not None else ""
    env = [{"name": name, "value": value} for name, value in contract_environment(spec).items()]
    env += [{"name": f"{prefix}{var.name}", "value": var.value} for var in spec.agent.env or []]
    return env


def declared_env_from(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """The spec's ``envFrom`` sources, prefixed as ``agent_environment`` prefixes its ``env``."""
    sources = [source.model_dump(exclude_none=True) for source in spec.agent.envFrom or []]
    if spec.agent.builtin is not None:
        for source in sources:
            source["prefix"] = DECLARED_ENV_PREFIX + source.get("prefix", "")
    return sources


def _workspace_mount(ref: ExperimentRef) -> dict[str, Any]:
    return {"name": SHARED_VOLUME, "mountPath": AGENT_WORKSPACE, "subPath": ref.workspace_subpath}


def _agent_data_subpath(ref: ExperimentRef, spec: ExperimentSpec) -> str:
    """What the agent's ``data/`` shows, read-only: the cached train split, or for a sealed
    Experiment the workspace's own ``data/``, where the prepare step wrote the train split without
    the validation split its submissions are scored on (the cache keeps the whole split)."""
    if spec.evaluation.feedback == Feedback.SEALED:
        return f"{ref.workspace_subpath}/data"
    return f"cache/data/{spec.task}"


def _agent_mounts(ref: ExperimentRef, spec: ExperimentSpec) -> list[dict[str, Any]]:
    base = model_dir_name(spec.model)
    return [
        _tmp_mount(),
        _workspace_mount(ref),
        {
            "name": SHARED_VOLUME,
            "mountPath": f"{AGENT_WORKSPACE}/{MODELS_DIR}/{base}",
            "subPath": _cached_model(spec),
            "readOnly": True,
        },
        {
            "name": SHARED_VOLUME,
            "mountPath": f"{AGENT_WORKSPACE}/data",
            "subPath": _agent_data_subpath(ref, spec),
            "readOnly": True,
        },
    ]


def agent_deadline_slack_s(spec: ExperimentSpec, settings: ControllerSettings) -> int:
    """How long the agent's Job may outlast its budget before Kubernetes stops it.

    Zero for a custom image: the Job's deadline is its signal (SIGTERM at the budget's end, SIGKILL a
    grace period later); its mirror sidecar does not keep time. The agent runner stops a built-in
    agent itself at the deadline and then needs a moment to close.
    """
    return 0 if spec.agent.image is not None else settings.deadline_grace_s


#: The native sidecar (an init container that keeps running) beside a custom image's agent.
MIRROR_CONTAINER = "mirrors"
#: The native sidecar beside a built-in agent (the runner keeps the mirrors there).
GROUP_READ_CONTAINER = "group-read"
AGENT_CONTAINER = "agent"


def _sidecar_security(settings: ControllerSettings) -> dict[str, Any]:
    """A sidecar that keeps the workspace readable by the grader (autorl_agent_runner.workspace.group_read):
    the agent's user (the pod's), so that it may change the modes of the agent's files, and the
    platform's group as its own, so that a folder keeps its setgid bit when its mode changes (the
    kernel drops it for a caller outside the folder's group, and files saved there later would get
    the agent's group). It mounts only this experiment's workspace: the group opens nothing else."""
    return _container_security(group=settings.platform_gid)


def build_group_read_sidecar(ref: ExperimentRef, settings: ControllerSettings) -> dict[str, Any]:
    """Beside a built-in agent: keeps what the agent writes readable by the grader's group.

    Not the agent runner's own job: the runner starts the agent, which must not get the platform's
    group, and restricted pods cannot drop a group.
    """
    sidecar = _platform_sidecar(GROUP_READ_CONTAINER, "group-read", settings)
    sidecar["resources"] = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
    sidecar["volumeMounts"] = [_sidecar_tmp_mount(), _workspace_mount(ref)]
    return sidecar


def _platform_sidecar(name: str, step: str, settings: ControllerSettings) -> dict[str, Any]:
    """A native sidecar (``restartPolicy: Always`` in ``initContainers``) running ``autorl
    agent-runner STEP --workspace /workspace`` from the platform's image."""
    return {
        "name": name,
        "image": settings.runner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "restartPolicy": "Always",
        "command": ["autorl", "agent-runner", step],
        "args": ["--workspace", AGENT_WORKSPACE],
        "securityContext": _sidecar_security(settings),
    }


def build_mirror_sidecar(
    ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings
) -> dict[str, Any]:
    """What the agent runner does for a built-in agent's mirrors, beside a custom image.

    A native sidecar (``restartPolicy: Always`` in ``initContainers``): it runs the platform's image
    whatever the agent's image holds (no Python needed there), starts before the agent, and ends with
    it, so the Job completes when the agent does. It sees only the workspace and the agent's own
    token, and rewrites ``run_meta.json`` and ``scores.json`` from the grader every few seconds. It
    also keeps the workspace readable by the grader's group (``--group-readable``), whatever modes the
    agent's writers use (see :func:`_sidecar_security`).
    """
    contract = contract_environment(spec)
    sidecar = _platform_sidecar(MIRROR_CONTAINER, "mirror", settings)
    sidecar["args"].append("--group-readable")
    return sidecar | {
        "env": [
            {"name": name, "value": contract[name]}
            for name in ("WORKSPACE", "TASK", "BASE_MODEL", "HOME", "USER", "LOGNAME")
        ],
        "envFrom": [{"secretRef": {"name": ref.secret_name}}],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [_sidecar_tmp_mount(), _workspace_mount(ref)],
    }


def build_agent_job(ref: ExperimentRef, spec: ExperimentSpec, settings: ControllerSettings) -> dict[str, Any]:
    """The agent's Job: a built-in agent under the agent runner, or a custom image of its own.

    Restricted Pod Security with a read-only root file system, the experiment's own user and group
    id, no service-account token, no service links (no addresses of Postgres or Redis in its
    environment), credentials only by ``envFrom``, no resolver unless ``egress`` names a host, and
    a hard deadline: at it the pod gets SIGTERM, ``agent_stop_grace_s`` later SIGKILL.
    """
    env_from: list[dict[str, Any]] = [{"secretRef": {"name": ref.secret_name}}]
    env_from += declared_env_from(spec)
    container: dict[str, Any] = {
        "name": AGENT_CONTAINER,
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
        "terminationGracePeriodSeconds": settings.agent_stop_grace_s,
        # No fsGroup: the kubelet would hand the whole shared volume to the agent's group.
        "securityContext": _pod_security(settings, agent_run_as_id(ref, settings)),
        "volumes": [_shared_volume(settings), _tmp_volume(), {"name": SIDECAR_TMP_VOLUME, "emptyDir": {}}],
    }
    if not needs_dns(spec):
        # No resolver at all, not the cluster's: fails closed even where no NetworkPolicy is enforced.
        pod["dnsPolicy"] = "None"
        pod["dnsConfig"] = NO_DNS_CONFIG
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
            # The agent's output goes to the container's stdout (kubectl logs) as well as agent.log.
            "--echo-output",
            # One token each, '=' joined: an argument that starts with '-' stays the agent's.
            *(f"--agent-arg={arg}" for arg in spec.agent.args or []),
        ]
        pod["initContainers"] = [build_group_read_sidecar(ref, settings)]
    else:
        # The prepare Job laid out the workspace; the sidecar keeps its mirrors fresh.
        container["image"] = spec.agent.image
        if spec.agent.command:
            container["command"] = list(spec.agent.command)
        if spec.agent.args:
            container["args"] = list(spec.agent.args)
        pod["initContainers"] = [build_mirror_sidecar(ref, spec, settings)]
    pod["containers"] = [container]
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = _pull_secrets(settings)
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
            # Counted from the Job's start, so never later than the budget's end; the controller moves
            # it to exactly that end once the budget starts (when the agent's container runs).
            "activeDeadlineSeconds": spec.timeoutSeconds + agent_deadline_slack_s(spec, settings),
            "template": {"metadata": {"labels": labels(ref, "agent")}, "spec": pod},
        },
    }


def _denied_networks(settings: ControllerSettings) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(cidr) for cidr in (*settings.cluster_cidrs, *ALWAYS_DENIED_CIDRS)]


def _inside(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
    denied: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The denied range that holds all of ``network``, if any."""
    return next((d for d in denied if d.version == network.version and network.subnet_of(d)), None)  # type: ignore[arg-type]


def check_egress(spec: ExperimentSpec, settings: ControllerSettings) -> None:
    """Refuse a ``cidr`` rule inside the cluster's own ranges (pods, services, nodes) or link-local ones.

    A wider block that merely contains them is fine: the policy excepts them from it.
    """
    denied = _denied_networks(settings)
    for index, rule in enumerate(spec.egress or []):
        if rule.cidr is None:
            continue
        holder = _inside(ipaddress.ip_network(rule.cidr, strict=False), denied)
        if holder is not None:
            raise ValueError(
                f"spec.egress[{index}].cidr: {rule.cidr} lies inside {holder}, an address range of the "
                "cluster itself (pods, services, nodes) or link-local, which agents may never reach; "
                "allow only outside destinations (e.g. the public address of an LLM API)"
            )


def _ip_block(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
    denied: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> dict[str, Any]:
    block: dict[str, Any] = {"cidr": str(network)}
    holes = [str(d) for d in denied if d.version == network.version and d.subnet_of(network)]  # type: ignore[arg-type]
    if holes:
        block["except"] = holes
    return {"ipBlock": block}


def build_network_policy(
    ref: ExperimentRef,
    spec: ExperimentSpec,
    settings: ControllerSettings,
    resolved_hosts: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Agent pods: no ingress; egress only to the grader's agent port, the spec's ``egress``, and the
    cluster's DNS when that lists a host name (:func:`needs_dns`; without one, no DNS at all).

    A NetworkPolicy knows addresses, not names: a ``host`` rule allows the addresses it resolved to
    (``resolved_hosts``, refreshed by the controller while the experiment runs), less any inside the
    cluster's ranges (a name may point anywhere). Every allowed block excepts the cluster's ranges.
    Raises ValueError for a ``cidr`` rule inside them (``check_egress``).
    """
    check_egress(spec, settings)
    denied = _denied_networks(settings)
    egress: list[dict[str, Any]] = [
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
    if needs_dns(spec):
        egress.append(
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
            }
        )
    resolved_hosts = resolved_hosts or {}
    for rule in spec.egress or []:
        if rule.cidr is not None:
            networks = [ipaddress.ip_network(rule.cidr, strict=False)]
        else:
            assert rule.host is not None
            addresses = {ipaddress.ip_address(a) for a in resolved_hosts.get(rule.host, ())}
            networks = [ipaddress.ip_network(a) for a in sorted(addresses, key=lambda a: (a.version, a))]
            networks = [n for n in networks if _inside(n, denied) is None]
        if not networks:
            continue
        egress.append(
            {
                "to": [_ip_block(network, denied) for network in networks],
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
