"""Settings of the Kubernetes controller (environment prefix ``AUTORL_``, on the common base of
:mod:`autorl.settings`, like every service).

The Helm chart sets them from its values; tests build their own. Field descriptions double as
documentation.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from autorl.settings import AdminTokenSettings, CommaSeparated

#: Where the shared ReadWriteMany volume is mounted in the grader, evaluator and prepare pods.
DEFAULT_SHARED_MOUNT = "/shared"
#: Where an agent pod sees its own workspace (the grader maps this path onto the shared volume).
AGENT_WORKSPACE = "/workspace"
#: The largest id every runtime and file system (NFS included) takes as an unsigned 31-bit number.
MAX_RUN_AS_ID = 2**31 - 2
#: Private and carrier-grade NAT ranges: where pod, service and node addresses live in practice.
DEFAULT_CLUSTER_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")


_SECRET_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ControllerSettings(AdminTokenSettings):
    """Everything the operator needs to turn an Experiment into Jobs. It needs the grader's admin
    token, checked at start-up rather than on the first experiment; it never runs in local mode."""

    ADMIN_TOKEN_FIX: ClassVar[str] = (
        "give the controller the grader's admin token (the chart mounts it from a Secret)"
    )

    grader_url: str = Field(
        default="http://autorl-grader:8000",
        description="Base URL of the grader's admin API (its admin port), as the controller sees it.",
    )
    kube_api_url: str | None = Field(
        default=None,
        description="Kubernetes API server URL without credentials (development and tests); "
        "default: the pod's service account, else the kubeconfig.",
    )
    watch_namespaces: CommaSeparated = Field(
        default_factory=list, description="Namespaces to watch, comma-separated; empty: the whole cluster."
    )
    runner_image: str = Field(
        default="autorl-agent-runner:latest",
        description="Image of the agent runner (prepare Jobs, built-in agents).",
    )
    image_pull_policy: str = Field(default="IfNotPresent", description="Pull policy of the Jobs' images.")
    image_pull_secrets: CommaSeparated = Field(
        default_factory=list,
        description="Names of Secrets (comma-separated) that every Job the controller creates pulls its "
        "images with (imagePullSecrets); each must exist in the Experiment's namespace.",
    )
    shared_pvc: str = Field(
        default="autorl-shared", description="ReadWriteMany PersistentVolumeClaim of the shared volume."
    )
    shared_mount: str = Field(
        default=DEFAULT_SHARED_MOUNT,
        description="Mount path of the shared volume in the grader and evaluators.",
    )
    grader_namespace: str = Field(
        default="autorl", description="Namespace of the grader pods (for the NetworkPolicy)."
    )
    grader_service: str = Field(
        default="autorl-grader",
        description="Name of the grader's Service in grader_namespace: agents get its cluster IP in "
        "GRADING_SERVER_URL, an address that needs no DNS (agent pods without egress host names have none).",
    )
    grader_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "autorl", "app.kubernetes.io/component": "grader"},
        description="Labels selecting the grader pods (JSON), which agents may reach.",
    )
    grader_port: int = Field(
        default=8000,
        gt=0,
        lt=65536,
        description="Container port of the grader's agent API, the only one agents may reach.",
    )
    dns_namespace: str = Field(
        default="kube-system",
        description="Namespace of the cluster DNS pods (reachable only by agents whose egress names a host).",
    )
    dns_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        description="Labels selecting the cluster DNS pods (JSON).",
    )
    agent_id_start: int = Field(
        default=1_000_000,
        gt=0,
        description="First user and group id of agent pods: each experiment runs as its own id in "
        "[agent_id_start, agent_id_start + agent_id_count), hashed from <namespace>/<name>.",
    )
    agent_id_count: int = Field(
        default=2_000_000_000,
        gt=0,
        description="How many ids agents may get (the larger, the rarer two experiments share one).",
    )
    platform_uid: int = Field(
        default=10001,
        gt=0,
        description="User id of the platform pods (the images' own user); owns the shared cache.",
    )
    platform_gid: int = Field(
        default=10001,
        gt=0,
        description="Group id of the platform pods: experiment folders belong to this group, so the "
        "grader can read submissions; no agent is ever in it.",
    )
    cluster_cidrs: CommaSeparated = Field(
        default_factory=lambda: list(DEFAULT_CLUSTER_CIDRS),
        description="The cluster's pod, service and node ranges, comma-separated: agents never reach "
        "them through an egress rule (the default is every private range).",
    )
    agent_strict_groups: bool = Field(
        default=True,
        description="supplementalGroupsPolicy Strict on agent and prepare pods (no groups from the "
        "image's /etc/group); turn off on nodes whose runtime lacks it (containerd < 2.0, CRI-O < 1.31): "
        "the kubelet refuses such pods there.",
    )
    agent_stop_grace_s: int = Field(
        default=30,
        ge=0,
        description="Seconds from SIGTERM at an agent's deadline to SIGKILL "
        "(the agent pod's terminationGracePeriodSeconds).",
    )
    agent_node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector of agent pods (JSON), e.g. GPU nodes."
    )
    agent_tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Tolerations of agent pods (JSON), e.g. for tainted GPU nodes."
    )
    prepare_env_secret: str | None = Field(
        default=None, description="Secret whose keys the prepare Job gets as environment (e.g. HF_TOKEN)."
    )
    platform_secrets: CommaSeparated = Field(
        default_factory=list,
        description="Secrets the platform's own pods read (the chart lists its own): an Experiment that "
        "passes one to its agent by envFrom is refused.",
    )
    sync_interval_s: float = Field(default=10.0, gt=0, description="How often each experiment is reconciled.")
    deadline_grace_s: int = Field(
        default=300,
        ge=0,
        description="Slack past the agent's budget (image pull, final submission) before TimedOut.",
    )
    finish_wait_s: float = Field(
        default=3600.0,
        ge=0,
        description="How long Finishing waits for evaluations in flight before closing anyway.",
    )
    provenance_wait_s: float = Field(
        default=3600.0,
        ge=0,
        description="How long a closed experiment waits for the evaluators' check of what its agent "
        "brought in (test questions in its files, the final on the twin split) before it ends "
        "without it; 0 skips the check.",
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Timeout of one grader or Kubernetes API call."
    )
    liveness_endpoint: str = Field(
        default="http://0.0.0.0:8080/healthz", description="Where kopf serves the liveness probe."
    )

    @field_validator("image_pull_secrets")
    @classmethod
    def _check_secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _SECRET_NAME.match(name):
                raise ValueError(
                    f"image pull secret {name!r} is not a Secret name (lower case letters, digits, '-' "
                    "and '.'); list Secret names, comma-separated"
                )
        return value

    @field_validator("cluster_cidrs")
    @classmethod
    def _check_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(
                    f"cluster CIDR {cidr!r} is not a network such as 10.96.0.0/12 ({exc})"
                ) from None
        return value

    @model_validator(mode="after")
    def _check_agent_ids(self) -> ControllerSettings:
        last = self.agent_id_start + self.agent_id_count - 1
        if last > MAX_RUN_AS_ID:
            raise ValueError(
                f"agent ids end at {last}, above {MAX_RUN_AS_ID}; lower agent_id_start or agent_id_count"
            )
        # An agent with the platform's id could read every workspace: the ranges must not meet.
        for what, value in (("platform_uid", self.platform_uid), ("platform_gid", self.platform_gid)):
            if self.agent_id_start <= value <= last:
                raise ValueError(
                    f"{what} {value} lies in the agents' id range {self.agent_id_start}-{last}; "
                    "move one of them"
                )
        return self
