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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.config import JsonDict

from autorl.agent_env import RESERVED_ENV
from autorl.builtin_agents import builtin_agent_names
from autorl.layout import BUILTIN_PREFIX
from autorl.models.sources import BUILTIN_MODELS, HUB_ID_PATTERN
from autorl.protocol.feedback import Feedback, FeedbackField
from autorl.provenance.unverified import bounded, printable_message

#: The agent's default time budget (the reference's real runs use two hours).
DEFAULT_TIMEOUT_S = 7200
DEFAULT_AGENT = "example_grpo"
#: Children are named ``<experiment>-<suffix>`` and their names end up in label values (63 characters).
MAX_NAME_LENGTH = 50

#: The patterns below go into the CRD as they are, so the API server refuses what the controller
#: would: each is read alike by Python's ``re`` and Go's RE2 (no look-around, no back-references).
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
HOSTNAME_PATTERN = (
    r"^([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$"
)
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A Kubernetes quantity as a string, the API server's own grammar without a sign: ``64Gi``, ``500m``, ``2``.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: Base models a cluster can fetch: a built-in one or a Hugging Face hub id (no local folders there).
CLUSTER_MODEL_PATTERN = (
    f"^({'|'.join(BUILTIN_PREFIX + name for name in sorted(BUILTIN_MODELS))}|{HUB_ID_PATTERN})$"
)
#: Kubernetes' limit on a label value (queueName becomes one) and on a DNS name.
MAX_LABEL_LENGTH = 63
MAX_DNS_NAME_LENGTH = 253
MAX_QUANTITY_LENGTH = 64
#: Bounds of every string, list and map of the spec. The API server's CEL cost estimate takes the
#: size of what a rule reads from these (``self == oldSelf`` reads the whole spec), so none is left
#: unbounded; the controller's validation enforces the same ones. Generous for real use: a longer
#: value of a variable belongs in a ConfigMap or Secret passed by ``envFrom``.
MAX_MODEL_LENGTH = 256
#: A registry host, a repository path of up to 255 characters, a tag and a digest.
MAX_IMAGE_LENGTH = 512
#: Items of ``command`` and of ``args``, and characters of each item and of a variable's value.
MAX_ARGS = 256
#: Public checkpoints an Experiment may register (each is read once per scored submission).
MAX_KNOWN_CHECKPOINTS = 16
MAX_ARG_LENGTH = 4096
MAX_ENV = 100
MAX_ENV_FROM = 32
MAX_ENV_NAME_LENGTH = 256
#: Resource names in ``requests`` and in ``limits``.
MAX_RESOURCES = 32
MAX_EGRESS_RULES = 64
MAX_EGRESS_PORTS = 32
#: An IPv6 CIDR is at most 49 characters.
MAX_CIDR_LENGTH = 64
#: The grader keeps counts in 32-bit integers.
MAX_INT32 = 2**31 - 1
#: The longest time budget, in seconds (30 days): an Experiment's, ``autorl run --timeout`` and the
#: API's alike; generous for any real run, far inside what the database and a deadline's date hold.
MAX_BUDGET_S = 30 * 24 * 3600
#: Resources Kubernetes knows by a bare name; any other is ``vendor.domain/name`` (e.g. ``nvidia.com/gpu``).
_CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage")

_DNS_LABEL = re.compile(DNS_LABEL_PATTERN)
_HOSTNAME = re.compile(HOSTNAME_PATTERN)
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity(value: str | int) -> str | int:
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; a resource amount is 0 or more")
    elif len(value) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"a quantity has at most {MAX_QUANTITY_LENGTH} characters, not {len(value)}")
    elif not _QUANTITY.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity; write a number and an optional unit with no space, "
            "e.g. 64Gi, 500m or 2"
        )
    return value


#: A Kubernetes quantity: ``"16Gi"``, ``"500m"`` or a plain integer.
Quantity = Annotated[
    str | int,
    AfterValidator(_quantity),
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "maxLength": MAX_QUANTITY_LENGTH,
            "minimum": 0,
        }
    ),
]


#: One item of a container's ``command`` or ``args``.
Arg = Annotated[str, Field(max_length=MAX_ARG_LENGTH)]


class _Model(BaseModel):
    """Shared config: camelCase names as in the manifest, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class EnvVar(_Model):
    name: str = Field(
        description="Variable name.",
        max_length=MAX_ENV_NAME_LENGTH,
        json_schema_extra={"pattern": ENV_NAME_PATTERN},
    )
    value: str = Field(
        default="",
        description="Literal value. Credentials belong in a Secret passed by envFrom.",
        max_length=MAX_ARG_LENGTH,
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
        if name in RESERVED_ENV:
            raise ValueError(f"{name} is set by the platform; choose another name")
        return name


class LocalObjectRef(_Model):
    name: str = Field(
        description="Name of the Secret or ConfigMap in the Experiment's namespace.",
        max_length=MAX_DNS_NAME_LENGTH,
        json_schema_extra={"pattern": DNS_SUBDOMAIN_PATTERN},
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.fullmatch(DNS_SUBDOMAIN_PATTERN, name):
            raise ValueError(
                f"{name!r} is not the name of a Secret or ConfigMap (lower case, digits, '-', '.')"
            )
        return name

    optional: bool | None = Field(default=None, description="Start even if it does not exist.")


class EnvFromSource(_Model):
    prefix: str | None = Field(
        default=None,
        description="Prepended to every variable name taken from the source.",
        max_length=MAX_ENV_NAME_LENGTH,
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
    requests: dict[str, Quantity] | None = Field(
        default=None, description="Minimum resources, e.g. cpu: 8.", max_length=MAX_RESOURCES
    )
    limits: dict[str, Quantity] | None = Field(
        default=None,
        description='Maximum resources, e.g. memory: 64Gi, "nvidia.com/gpu": 1.',
        max_length=MAX_RESOURCES,
    )

    @model_validator(mode="after")
    def _names_and_devices(self) -> Resources:
        for kind, amounts in (("requests", self.requests), ("limits", self.limits)):
            for name, amount in (amounts or {}).items():
                where = f"{kind}.{name}"
                if "/" not in name:
                    if name not in _CORE_RESOURCES and not name.startswith("hugepages-"):
                        raise ValueError(
                            f"{where}: unknown resource; use cpu, memory, ephemeral-storage or a device "
                            'resource with its vendor, e.g. "nvidia.com/gpu"'
                        )
                elif not name.split("/", 1)[0].endswith("kubernetes.io") and not (
                    isinstance(amount, int) or amount.isdigit()
                ):
                    raise ValueError(
                        f'{where}: {amount!r} is not a whole number of devices; write e.g. "{name}": 1'
                    )
        return self


def _agent_enum(schema: JsonDict) -> None:
    schema["enum"] = list[JsonValue](builtin_agent_names())


#: The agent's rules that span fields, in words that name the fix: the controller raises them, and the
#: CRD carries them as CEL rules, so that ``kubectl apply`` refuses such an agent with the same words.
AGENT_EXACTLY_ONE = "set exactly one of builtin (a built-in agent) or image (a custom agent)"
AGENT_COMMAND_NEEDS_IMAGE = "command applies to a custom image; remove it or use image"


class AgentSpec(_Model):
    """Who trains: a built-in agent run by the agent runner, or a container image of one's own."""

    model_config = ConfigDict(
        json_schema_extra={
            # CEL (Kubernetes >= 1.25) rather than oneOf, whose refusal names neither field nor fix.
            # A null field reads as absent to has(), as the API server evaluates these rules.
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.builtin) != has(self.image)",
                    "message": f"{AGENT_EXACTLY_ONE}, e.g. builtin: {DEFAULT_AGENT}",
                },
                {
                    "rule": "!has(self.builtin) || !has(self.command) || size(self.command) == 0",
                    "message": AGENT_COMMAND_NEEDS_IMAGE,
                },
            ],
        }
    )

    builtin: str | None = Field(
        default=None,
        description="Name of a built-in agent, e.g. example_grpo.",
        json_schema_extra=_agent_enum,
    )
    image: str | None = Field(
        default=None,
        description="Container image of a custom agent.",
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        json_schema_extra={"pattern": r"^\S+$"},
    )
    command: list[Arg] | None = Field(
        default=None, description="Entry point of the custom image (image only).", max_length=MAX_ARGS
    )
    args: list[Arg] | None = Field(
        default=None,
        description="Arguments of the custom image's command, or of the built-in agent's program.",
        max_length=MAX_ARGS,
    )
    env: list[EnvVar] | None = Field(
        default=None, description="Extra plain environment variables.", max_length=MAX_ENV
    )
    envFrom: list[EnvFromSource] | None = Field(
        default=None,
        description="Secrets or ConfigMaps whose keys become environment variables (credentials).",
        max_length=MAX_ENV_FROM,
    )
    resources: Resources | None = Field(default=None, description="Compute resources of the agent container.")

    @field_validator("builtin")
    @classmethod
    def _known_builtin(cls, builtin: str | None) -> str | None:
        if builtin is not None and builtin not in builtin_agent_names():
            raise ValueError(
                f"unknown built-in agent {builtin!r}; choose one of: {', '.join(builtin_agent_names())} "
                "(or run your own with image)"
            )
        return builtin

    @field_validator("image")
    @classmethod
    def _image_reference(cls, image: str | None) -> str | None:
        if image is not None and not re.fullmatch(r"^\S+$", image):
            raise ValueError(f"{image!r} is not an image reference: it holds a space")
        return image

    @model_validator(mode="after")
    def _exactly_one(self) -> AgentSpec:
        if (self.builtin is None) == (self.image is None):
            raise ValueError(f"agent: {AGENT_EXACTLY_ONE}")
        if self.builtin is not None and self.command:
            raise ValueError(f"agent: {AGENT_COMMAND_NEEDS_IMAGE}")
        return self

    @property
    def display_name(self) -> str:
        return self.builtin if self.builtin is not None else str(self.image)


class EvaluationSpec(_Model):
    protocol: Literal["opencompass", "flexible", "strict"] = Field(
        default="opencompass", description="Scoring protocol of the headline score."
    )
    maxSubmissions: int = Field(
        default=100, ge=1, le=MAX_INT32, description="Submissions the agent may make; more are refused (429)."
    )
    feedback: FeedbackField = Field(
        default=Feedback.TEST,
        description="test: every submission scored on the test split (the reference's behaviour); sealed: "
        "on a validation split held out of the agent's train data, and one checkpoint (the agent's "
        "POST /final nomination, else the best on validation) evaluated on the test split once at the end.",
    )
    knownCheckpoints: list[Annotated[str, Field(min_length=1, max_length=MAX_MODEL_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_KNOWN_CHECKPOINTS,
        description="Public checkpoints of the base's family (hub ids, or folders as the evaluators see "
        "them): a scored submission nearer one of them than the base is named in the grader's lineage "
        "(beside the evaluators' own AUTORL_KNOWN_CHECKPOINTS).",
    )


#: IPv6 prefixes that spell an IPv4 address (a translator or relay on the path reaches it, a CNI may
#: read them as the IPv4 range they spell): allowing one allows private IPv4 behind it. Never an
#: agent's destination, locally or on a cluster.
IPV4_SPELLING_PREFIXES = (
    "::/96",  # IPv4-compatible (deprecated)
    "::ffff:0:0/96",  # IPv4-mapped
    "64:ff9b::/96",  # NAT64 (RFC 6052)
    "64:ff9b:1::/48",  # local-use NAT64
    "2001::/32",  # Teredo
    "2002::/16",  # 6to4
)


class EgressRule(_Model):
    """One extra destination the agent may reach: a host name (resolved by the controller) or a CIDR."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["host"]}, {"required": ["cidr"]}]},
    )

    host: str | None = Field(
        default=None,
        description="DNS name, e.g. api.openai.com (its addresses are allowed).",
        max_length=MAX_DNS_NAME_LENGTH,
        json_schema_extra={"pattern": HOSTNAME_PATTERN},
    )
    cidr: str | None = Field(
        default=None,
        description="Address block, e.g. 203.0.113.0/24.",
        max_length=MAX_CIDR_LENGTH,
        json_schema_extra={"pattern": r"^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$"},
    )
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = Field(
        default=None, description="TCP ports (default 443).", max_length=MAX_EGRESS_PORTS
    )

    @model_validator(mode="after")
    def _check(self) -> EgressRule:
        if (self.host is None) == (self.cidr is None):
            raise ValueError("egress: each rule sets exactly one of host or cidr")
        if self.host is not None and not _HOSTNAME.fullmatch(self.host):
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


def _task_enum(schema: JsonDict) -> None:
    from autorl.tasks import task_names

    schema["enum"] = list[JsonValue](task_names())


class ExperimentSpec(_Model):
    """What ``kubectl apply`` asks for: train ``model`` on ``task`` with ``agent`` for ``timeoutSeconds``."""

    task: str = Field(description="Benchmark task, e.g. gsm8k.", json_schema_extra=_task_enum)
    model: str = Field(
        description="Base model: a Hugging Face hub id (Qwen/Qwen2.5-1.5B) or builtin:tiny-qwen2.",
        max_length=MAX_MODEL_LENGTH,
        json_schema_extra={"pattern": CLUSTER_MODEL_PATTERN},
    )
    agent: AgentSpec = Field(
        default_factory=lambda: AgentSpec(builtin=DEFAULT_AGENT),
        description=f"The agent that post-trains the model (default: builtin {DEFAULT_AGENT}).",
    )
    timeoutSeconds: int = Field(
        default=DEFAULT_TIMEOUT_S,
        ge=1,
        le=MAX_BUDGET_S,
        description="The agent's time budget in seconds (at most 30 days).",
    )
    evaluation: EvaluationSpec = Field(
        default_factory=lambda: EvaluationSpec(), description="How submissions are scored."
    )
    egress: list[EgressRule] | None = Field(
        default=None,
        description="Destinations the agent may reach besides DNS and the grader, e.g. an LLM API.",
        max_length=MAX_EGRESS_RULES,
    )
    queueName: str | None = Field(
        default=None,
        description="Kueue LocalQueue for the agent Job (label kueue.x-k8s.io/queue-name).",
        json_schema_extra={"pattern": DNS_LABEL_PATTERN, "maxLength": MAX_LABEL_LENGTH},
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from autorl.tasks import task_names

        known = task_names()
        if task not in known:
            raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(sorted(known))}")
        return task

    @field_validator("model")
    @classmethod
    def _cluster_model(cls, model: str) -> str:
        if model.startswith(BUILTIN_PREFIX):
            if model[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
                known = ", ".join(BUILTIN_PREFIX + name for name in sorted(BUILTIN_MODELS))
                raise ValueError(
                    f"unknown built-in model {model!r}; use one of: {known}, or a Hugging Face hub id "
                    "such as Qwen/Qwen2.5-1.5B"
                )
        elif not re.fullmatch(CLUSTER_MODEL_PATTERN, model) or ".." in model:
            raise ValueError(
                f"model {model!r}: use a Hugging Face hub id such as Qwen/Qwen2.5-1.5B or builtin:tiny-qwen2 "
                "(local folders do not exist inside a cluster)"
            )
        return model

    @field_validator("queueName")
    @classmethod
    def _queue_label(cls, queue: str | None) -> str | None:
        if queue is not None and (len(queue) > MAX_LABEL_LENGTH or not _DNS_LABEL.fullmatch(queue)):
            raise ValueError(
                f"queueName {queue!r} must be a DNS label (lower case, digits, '-', "
                f"at most {MAX_LABEL_LENGTH} characters)"
            )
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


def status_text(text: str) -> str:
    """A free-text field of an Experiment's status as written: escaped (it can quote an agent's
    strings, which ``kubectl describe`` and ``-o jsonpath`` show raw) and ``bounded`` (its
    beginning and its notes of what could not be verified kept). Written again (a status read back
    and patched), it is unchanged."""
    return bounded(printable_message(text))


#: Every free-text field of the status passes :func:`status_text`, whoever sets it.
StatusText = Annotated[str, AfterValidator(status_text)]


class Condition(_Model):
    type: str = Field(description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"]
    reason: StatusText | None = Field(default=None, description="One CamelCase word.")
    message: StatusText | None = Field(default=None, description="For a person.")
    lastTransitionTime: datetime | None = None


class ExperimentResourceStatus(_Model):
    """What the controller reports, mirrored from the grader (the database is the truth)."""

    phase: Phase | None = Field(default=None, description="Where the experiment is in its lifecycle.")
    conditions: list[Condition] | None = None
    baselineScore: float | None = Field(default=None, description="Score of the base model (0-100).")
    bestScore: float | None = Field(default=None, description="Best score of a submission (0-100).")
    bestSubmission: int | None = Field(default=None, description="Id of the best submission.")
    improvement: float | None = Field(
        default=None,
        description="The result over the base model's score on the same split: bestScore - baselineScore; "
        "sealed, the final's over baselineScore once it is scored, before that the best's over the "
        "validation baseline.",
    )
    submissions: int | None = Field(default=None, description="Scored submissions.")
    startTime: datetime | None = Field(default=None, description="When the agent's budget started.")
    deadline: datetime | None = Field(default=None, description="When the agent's budget ends.")
    completionTime: datetime | None = Field(
        default=None, description="When the experiment reached its final phase."
    )
    message: StatusText | None = Field(
        default=None, description="Why the experiment is in this phase: what it waits for and what to do."
    )
    reason: StatusText | None = Field(
        default=None,
        description="Why it waits or what failed, one CamelCase word (docs/KUBERNETES.md, Troubleshooting).",
    )
    budgetLeft: StatusText | None = Field(
        default=None, description="Time left of the agent's budget (e.g. 1h05m), once it started."
    )
    queue: StatusText | None = Field(
        default=None,
        description="Evaluations waiting or running, the baseline's queue position and the evaluators alive.",
    )
    evaluators: int | None = Field(
        default=None, description="Evaluators alive that take work for this experiment's backend."
    )
    feedback: FeedbackField | None = Field(
        default=None, description="test or sealed: what the agent's submissions were scored on."
    )
    finalScore: float | None = Field(
        default=None,
        description="The result on the test split (0-100): sealed, the one final evaluation; test, the best.",
    )
    finalLow: float | None = Field(default=None, description="Lower end of finalScore's 95 % interval.")
    finalHigh: float | None = Field(default=None, description="Upper end of finalScore's 95 % interval.")
    finalSelection: Literal["best_on_test", "best_on_validation", "nominated"] | None = Field(
        default=None, description="How the checkpoint of finalScore was chosen."
    )
    testEvaluations: int | None = Field(
        default=None,
        description="Evaluations of the agent's checkpoints on the test split (sealed: at most 1).",
    )
    result: StatusText | None = Field(
        default=None,
        description="kubectl's Best column: the result on the test split with its 95 % interval, "
        "e.g. 41.20 [38.57, 43.89]; sealed, before its final evaluation, the best on validation, marked so.",
    )
    testOverlap: int | None = Field(
        default=None,
        description="Test problems found in the agent's files after it ended (sealed: validation "
        "problems are counted in evaluator storage); unset until they are read.",
    )
    twinScore: float | None = Field(
        default=None,
        description="The final checkpoint's score (0-100) on the twin split (the test "
        "problems with new numbers).",
    )
    twinPValue: float | None = Field(
        default=None,
        description="Paired test of whether the final's test-minus-twin gap exceeds the base model's; "
        "below 0.01 is flagged.",
    )
    lineage: StatusText | None = Field(
        default=None,
        description="The registered public checkpoint a scored submission is nearer than the base; "
        "unset when the base is nearest.",
    )


def validate_name(name: str) -> None:
    """Refuse names that would not fit the children's names and labels."""
    if len(name) > MAX_NAME_LENGTH or not _DNS_LABEL.match(name):
        raise ValueError(
            f"metadata.name {name!r} must be a DNS label of at most {MAX_NAME_LENGTH} characters "
            "(lower case letters, digits and '-')"
        )
