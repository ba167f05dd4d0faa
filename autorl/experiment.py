"""The ``Experiment`` custom resource (``autorl.io/v1alpha1``): its spec and status as pydantic models.

These models are the single source of truth. The controller validates every Experiment with them
(unknown fields are refused with a message), and :mod:`autorl.crd` derives the
CustomResourceDefinition from them.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autorl.agent_env import RESERVED_ENV

#: The agent's default time budget (the reference's real runs use two hours).
DEFAULT_TIMEOUT_S = 7200
DEFAULT_AGENT = "example_grpo"
#: Children are named ``<experiment>-<suffix>`` and their names end up in label values (63 characters).
MAX_NAME_LENGTH = 50

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: A Kubernetes quantity: ``"16Gi"``, ``"500m"`` or a plain integer.
Quantity = Annotated[str | int, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


class _Model(BaseModel):
    """Shared config: camelCase names as in the manifest, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class EnvVar(_Model):
    name: str = Field(description="Variable name.")
    value: str = Field(
        default="", description="Literal value. Credentials belong in a Secret passed by envFrom."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
        if name in RESERVED_ENV:
            raise ValueError(f"{name} is set by the platform; choose another name")
        return name


class LocalObjectRef(_Model):
    name: str = Field(description="Name of the Secret or ConfigMap in the Experiment's namespace.")
    optional: bool | None = Field(default=None, description="Start even if it does not exist.")


class EnvFromSource(_Model):
    prefix: str | None = Field(
        default=None, description="Prepended to every variable name taken from the source."
    )
    secretRef: LocalObjectRef | None = Field(
        default=None, description="All keys of a Secret, e.g. an LLM API key."
    )
    configMapRef: LocalObjectRef | None = Field(default=None, description="All keys of a ConfigMap.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.secretRef is None) == (self.configMapRef is None):
            raise ValueError("envFrom: set exactly one of secretRef or configMapRef")
        return self


class Resources(_Model):
    requests: dict[str, Quantity] | None = Field(default=None, description="Minimum resources, e.g. cpu: 8.")
    limits: dict[str, Quantity] | None = Field(
        default=None, description='Maximum resources, e.g. memory: 64Gi, "nvidia.com/gpu": 1.'
    )


class AgentSpec(_Model):
    """Who trains: a built-in agent run by the agent runner, or a container image of one's own."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["builtin"]}, {"required": ["image"]}],
        }
    )

    builtin: str | None = Field(
        default=None, description="Name of a built-in agent, e.g. example_grpo.", min_length=1
    )
    image: str | None = Field(default=None, description="Container image of a custom agent.", min_length=1)
    command: list[str] | None = Field(
        default=None, description="Entry point of the custom image (image only)."
    )
    args: list[str] | None = Field(
        default=None,
        description="Arguments of the custom image's command, or of the built-in agent's program.",
    )
    env: list[EnvVar] | None = Field(default=None, description="Extra plain environment variables.")
    envFrom: list[EnvFromSource] | None = Field(
        default=None,
        description="Secrets or ConfigMaps whose keys become environment variables (credentials).",
    )
    resources: Resources | None = Field(default=None, description="Compute resources of the agent container.")

    @model_validator(mode="after")
    def _exactly_one(self) -> AgentSpec:
        if (self.builtin is None) == (self.image is None):
            raise ValueError("agent: set exactly one of builtin (a built-in agent) or image (a custom agent)")
        if self.builtin is not None and self.command:
            raise ValueError("agent: command applies to a custom image; remove it or use image")
        return self

    @property
    def display_name(self) -> str:
        return self.builtin if self.builtin is not None else str(self.image)


class EvaluationSpec(_Model):
    protocol: Literal["opencompass", "flexible", "strict"] = Field(
        default="opencompass", description="Scoring protocol of the headline score."
    )
    maxSubmissions: int = Field(
        default=100, ge=1, description="Submissions the agent may make; more are refused (429)."
    )


class EgressRule(_Model):
    """One extra destination the agent may reach: a host name (resolved by the controller) or a CIDR."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["host"]}, {"required": ["cidr"]}]},
    )

    host: str | None = Field(
        default=None, description="DNS name, e.g. api.openai.com (its addresses are allowed)."
    )
    cidr: str | None = Field(default=None, description="Address block, e.g. 203.0.113.0/24.")
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = Field(
        default=None, description="TCP ports (default 443)."
    )

    @model_validator(mode="after")
    def _check(self) -> EgressRule:
        if (self.host is None) == (self.cidr is None):
            raise ValueError("egress: each rule sets exactly one of host or cidr")
        if self.host is not None and not _HOSTNAME.match(self.host):
            raise ValueError(f"egress: {self.host!r} is not a DNS name")
        if self.cidr is not None:
            try:
                ipaddress.ip_network(self.cidr, strict=False)
            except ValueError:
                raise ValueError(f"egress: {self.cidr!r} is not a CIDR such as 203.0.113.0/24") from None
        return self

    @property
    def tcp_ports(self) -> list[int]:
        return list(self.ports) if self.ports else [443]


class ExperimentSpec(_Model):
    """What ``kubectl apply`` asks for: train ``model`` on ``task`` with ``agent`` for ``timeoutSeconds``."""

    task: str = Field(description="Benchmark task, e.g. gsm8k.", min_length=1)
    model: str = Field(
        description="Base model: a Hugging Face hub id (Qwen/Qwen2.5-1.5B) or builtin:tiny-qwen2.",
        min_length=1,
    )
    agent: AgentSpec = Field(
        default_factory=lambda: AgentSpec(builtin=DEFAULT_AGENT),
        description=f"The agent that post-trains the model (default: builtin {DEFAULT_AGENT}).",
    )
    timeoutSeconds: int = Field(
        default=DEFAULT_TIMEOUT_S, ge=1, description="The agent's time budget in seconds."
    )
    evaluation: EvaluationSpec = Field(
        default_factory=lambda: EvaluationSpec(), description="How submissions are scored."
    )
    egress: list[EgressRule] | None = Field(
        default=None,
        description="Destinations the agent may reach besides DNS and the grader, e.g. an LLM API.",
    )
    queueName: str | None = Field(
        default=None,
        description="Kueue LocalQueue for the agent Job (label kueue.x-k8s.io/queue-name).",
        min_length=1,
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from autorl.tasks import task_names

        known = task_names()
        if task not in known:
            raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(sorted(known))}")
        return task

    @field_validator("queueName")
    @classmethod
    def _queue_label(cls, queue: str | None) -> str | None:
        if queue is not None and (len(queue) > 63 or not _DNS_LABEL.match(queue)):
            raise ValueError(f"queueName {queue!r} must be a DNS label (lower case, digits, '-', ≤ 63)")
        return queue


class Phase(StrEnum):
    PENDING = "Pending"
    PREPARING = "Preparing"
    BASELINE = "Baseline"
    RUNNING = "Running"
    FINISHING = "Finishing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.TIMED_OUT)


class Condition(_Model):
    type: str = Field(description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"]
    reason: str | None = Field(default=None, description="One CamelCase word.")
    message: str | None = Field(default=None, description="For a person.")
    lastTransitionTime: datetime | None = None


class ExperimentResourceStatus(_Model):
    """What the controller reports, mirrored from the grader (the database is the truth)."""

    phase: Phase | None = Field(default=None, description="Where the experiment is in its lifecycle.")
    conditions: list[Condition] | None = None
    baselineScore: float | None = Field(default=None, description="Score of the base model (0-100).")
    bestScore: float | None = Field(default=None, description="Best score of a submission (0-100).")
    bestSubmission: int | None = Field(default=None, description="Id of the best submission.")
    improvement: float | None = Field(default=None, description="bestScore - baselineScore.")
    submissions: int | None = Field(default=None, description="Scored submissions.")
    startTime: datetime | None = Field(default=None, description="When the agent's budget started.")
    deadline: datetime | None = Field(default=None, description="When the agent's budget ends.")
    completionTime: datetime | None = Field(
        default=None, description="When the experiment reached its final phase."
    )
    message: str | None = Field(default=None, description="Why the experiment is in this phase.")


def validate_name(name: str) -> None:
    """Refuse names that would not fit the children's names and labels."""
    if len(name) > MAX_NAME_LENGTH or not _DNS_LABEL.match(name):
        raise ValueError(
            f"metadata.name {name!r} must be a DNS label of at most {MAX_NAME_LENGTH} characters "
            "(lower case letters, digits and '-')"
        )
