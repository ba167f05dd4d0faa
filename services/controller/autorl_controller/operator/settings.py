"""Settings of the Kubernetes controller (environment prefix ``AUTORL_``, like every service).

The Helm chart sets them from its values; tests build their own. Field descriptions double as
documentation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from autorl.errors import ConfigurationError
from autorl.settings import UNSAFE_ADMIN_TOKENS

#: Where the shared ReadWriteMany volume is mounted in the grader, evaluator and prepare pods.
DEFAULT_SHARED_MOUNT = "/shared"
#: Where an agent pod sees its own workspace (the grader maps this path onto the shared volume).
AGENT_WORKSPACE = "/workspace"


def _secrets_dir() -> str | None:
    path = os.environ.get("AUTORL_SECRETS_DIR", "/run/secrets/autorl")
    return path if Path(path).is_dir() else None


class ControllerSettings(BaseSettings):
    """Everything the operator needs to turn an Experiment into Jobs."""

    model_config = SettingsConfigDict(env_prefix="AUTORL_", secrets_dir=_secrets_dir(), extra="ignore")

    grader_url: str = Field(
        default="http://autorl-grader:8000",
        description="Base URL of the grader's admin API, as the controller sees it.",
    )
    admin_token: SecretStr | None = Field(default=None, description="Bearer token of the grader's admin API.")
    kube_api_url: str | None = Field(
        default=None,
        description="Kubernetes API server URL without credentials (development and tests); "
        "default: the pod's service account, else the kubeconfig.",
    )
    watch_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Namespaces to watch, comma-separated; empty: the whole cluster."
    )
    runner_image: str = Field(
        default="autorl-agent-runner:latest",
        description="Image of the agent runner (prepare Jobs, built-in agents).",
    )
    image_pull_policy: str = Field(default="IfNotPresent", description="Pull policy of the Jobs' images.")
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
    grader_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "autorl", "app.kubernetes.io/component": "grader"},
        description="Labels selecting the grader pods (JSON), which agents may reach.",
    )
    grader_port: int = Field(default=8000, gt=0, lt=65536, description="Container port of the grader.")
    dns_namespace: str = Field(default="kube-system", description="Namespace of the cluster DNS pods.")
    dns_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"},
        description="Labels selecting the cluster DNS pods (JSON).",
    )
    agent_uid: int = Field(
        default=1000, gt=0, description="Non-root user (and group) id of agent and prepare pods."
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
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Timeout of one grader or Kubernetes API call."
    )
    liveness_endpoint: str = Field(
        default="http://0.0.0.0:8080/healthz", description="Where kopf serves the liveness probe."
    )

    @field_validator("watch_namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def require_safe_admin_token(self) -> None:
        """Fail fast at start-up, as the grader does, rather than on the first experiment."""
        token = self.admin_token.get_secret_value() if self.admin_token else ""
        if token.strip().lower() in UNSAFE_ADMIN_TOKENS or len(token) < 16:
            raise ConfigurationError(
                "AUTORL_ADMIN_TOKEN is empty, a placeholder or shorter than 16 characters; "
                "give the controller the grader's admin token (the chart mounts it from a Secret)"
            )

    @property
    def admin_token_value(self) -> str:
        return self.admin_token.get_secret_value() if self.admin_token else ""
