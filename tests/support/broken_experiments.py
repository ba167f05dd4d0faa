"""Broken Experiments, each with where it is refused and the words of the refusal that name the fix.

``schema`` is what the API server answers at ``kubectl apply`` (the CRD's openAPIV3Schema with
kubectl's strict field validation, then its CEL rules); ``None`` marks a mistake no schema can see,
which the controller refuses at once, before it creates any Job. ``controller`` is the controller's
own message: it checks every Experiment again, so a cluster that skipped the schema still refuses it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autorl.experiment import (
    AGENT_COMMAND_NEEDS_IMAGE,
    AGENT_EXACTLY_ONE,
    MAX_ARG_LENGTH,
    MAX_ARGS,
    MAX_ENV,
    MAX_IMAGE_LENGTH,
    MAX_MODEL_LENGTH,
    QUANTITY_PATTERN,
)

Spec = dict[str, Any]


@dataclass(frozen=True)
class Broken:
    id: str
    change: Callable[[Spec], None]
    #: What the API server's refusal says (a fragment), or None: only the controller can see it.
    schema: str | None
    #: What the controller's Failed message says (a fragment).
    controller: str
    #: metadata.name, when the mistake is the name itself.
    name: str = "broken"


def base_spec() -> Spec:
    """A valid spec (that of examples/experiment-gsm8k.yaml)."""
    return {
        "task": "gsm8k",
        "model": "Qwen/Qwen2.5-1.5B",
        "agent": {
            "builtin": "example_grpo",
            "resources": {
                "requests": {"cpu": "8", "memory": "48Gi"},
                "limits": {"memory": "64Gi", "nvidia.com/gpu": 1},
            },
        },
        "timeoutSeconds": 7200,
        "evaluation": {"protocol": "opencompass", "maxSubmissions": 100},
    }


def manifest(case: Broken) -> dict[str, Any]:
    spec = copy.deepcopy(base_spec())
    case.change(spec)
    return {
        "apiVersion": "autorl.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": case.name},
        "spec": spec,
    }


def _set(path: str, value: Any) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


def _drop(path: str) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node[part]
        del node[last]

    return change


def _limit(name: str, value: Any) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        spec["agent"]["resources"]["limits"][name] = value

    return change


def _egress(rule: dict[str, Any]) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        spec["agent"] = {"image": "registry.example/agent:1"}
        spec["egress"] = [rule]

    return change


_QUANTITY = f"should match '{QUANTITY_PATTERN}'"
_AT_LEAST_1 = "should be greater than or equal to 1"
_AGENTS = 'supported values: "example_agent", "example_grpo", "example_sft"'
_AGENT_EXACTLY_ONE = f'spec.agent: Invalid value: "object": {AGENT_EXACTLY_ONE}, e.g. builtin: example_grpo'

CASES: list[Broken] = [
    # What passed both the schema and the controller before, and failed late.
    Broken("unknown-builtin-agent", _set("agent.builtin", "example_ppo"), _AGENTS,
           "unknown built-in agent 'example_ppo'; choose one of: example_agent, example_grpo, example_sft"),
    Broken("unknown-builtin-model", _set("model", "builtin:tiny-llama"), "builtin:tiny-qwen2|",
           "unknown built-in model 'builtin:tiny-llama'; use one of: builtin:tiny-qwen2"),
    Broken("memory-with-a-space", _limit("memory", "64 Gi"), _QUANTITY,
           "'64 Gi' is not a Kubernetes quantity; write a number and an optional unit with no space"),
    Broken("gpu-in-words", _limit("nvidia.com/gpu", "one"), _QUANTITY, "'one' is not a Kubernetes quantity"),
    # Our own.
    Broken("empty-agent", _set("agent", {}), _AGENT_EXACTLY_ONE,
           "set exactly one of builtin (a built-in agent) or image (a custom agent)"),
    Broken("agent-with-resources-only", _set("agent", {"resources": {"limits": {"nvidia.com/gpu": 1}}}),
           _AGENT_EXACTLY_ONE, "set exactly one of builtin"),
    Broken("agent-builtin-null", _set("agent", {"builtin": None}), _AGENT_EXACTLY_ONE,
           "set exactly one of builtin"),
    Broken("empty-builtin-agent", _set("agent.builtin", ""), _AGENTS, "unknown built-in agent ''"),
    Broken("both-builtin-and-image", _set("agent.image", "registry.example/agent:1"), _AGENT_EXACTLY_ONE,
           "set exactly one of builtin"),
    Broken("builtin-with-command", _set("agent.command", ["python", "train.py"]),
           f'spec.agent: Invalid value: "object": {AGENT_COMMAND_NEEDS_IMAGE}',
           "command applies to a custom image; remove it or use image"),
    Broken("zero-timeout", _set("timeoutSeconds", 0), _AT_LEAST_1,
           "spec.timeoutSeconds: Input should be greater than or equal to 1"),
    Broken("negative-timeout", _set("timeoutSeconds", -3600), _AT_LEAST_1,
           "spec.timeoutSeconds: Input should be greater than or equal to 1"),
    Broken("timeout-in-words", _set("timeoutSeconds", "2h"), "must be of type integer",
           "spec.timeoutSeconds: Input should be a valid integer"),
    Broken("negative-max-submissions", _set("evaluation.maxSubmissions", -1), _AT_LEAST_1,
           "spec.evaluation.maxSubmissions: Input should be greater than or equal to 1"),
    Broken("zero-max-submissions", _set("evaluation.maxSubmissions", 0), _AT_LEAST_1,
           "spec.evaluation.maxSubmissions: Input should be greater than or equal to 1"),
    Broken("max-submissions-past-32-bits", _set("evaluation.maxSubmissions", 2**31),
           "should be less than or equal to 2147483647", "less than or equal to 2147483647"),
    Broken("unknown-task", _set("task", "gsm9k"), 'supported values: "arith", "gsm8k"',
           "unknown task 'gsm9k'; choose one of: arith, gsm8k"),
    Broken("unknown-protocol", _set("evaluation.protocol", "exact"),
           'supported values: "opencompass", "flexible", "strict"', "'opencompass', 'flexible' or 'strict'"),
    Broken("image-pull-policy-typo", _set("agent.imagePullPolicy", "Alwys"),
           'unknown field "spec.agent.imagePullPolicy"', "spec.agent.imagePullPolicy: unknown field"),
    Broken("missing-model", _drop("model"), "spec.model: Required value", "spec.model: Field required"),
    Broken("local-model-folder", _set("model", "/models/qwen"), "should match",
           "local folders do not exist inside a cluster"),
    Broken("model-without-org", _set("model", "Qwen2.5-1.5B"), "should match",
           "use a Hugging Face hub id such as Qwen/Qwen2.5-1.5B"),
    Broken("negative-cpu", _set("agent.resources.requests.cpu", "-2"), _QUANTITY,
           "'-2' is not a Kubernetes quantity"),
    Broken("negative-memory-number", _limit("memory", -1), "should be greater than or equal to 0",
           "-1 is negative; a resource amount is 0 or more"),
    Broken("quantity-as-object", _limit("memory", {"size": "64Gi"}), "must be of type",
           "spec.agent.resources.limits.memory"),
    Broken("env-name-with-a-dash", _set("agent.env", [{"name": "MY-VAR"}]), "should match '^[A-Za-z_]",
           "'MY-VAR' is not a valid environment variable name (letters, digits, _)"),
    Broken("secret-name-upper-case", _set("agent.envFrom", [{"secretRef": {"name": "My_S"}}]), "should match",
           "'My_S' is not the name of a Secret or ConfigMap"),
    Broken("queue-name-not-a-label", _set("queueName", "Team_A"), "should match '^[a-z0-9]",
           "queueName 'Team_A' must be a DNS label"),
    Broken("image-with-a-space", lambda spec: spec.update(agent={"image": "registry.example/agent :1"}),
           "should match", "is not an image reference: it holds a space"),
    Broken("egress-host-with-spaces", _egress({"host": "api openai com"}), "should match",
           "egress: 'api openai com' is not a DNS name"),
    Broken("egress-port-out-of-range", _egress({"host": "api.openai.com", "ports": [70000]}),
           "should be less than or equal to 65535", "less than or equal to 65535"),
    Broken("too-many-args", _set("agent.args", ["--lr"] * (MAX_ARGS + 1)),
           f"spec.agent.args: Too many: {MAX_ARGS + 1}: must have at most {MAX_ARGS} items",
           f"spec.agent.args: List should have at most {MAX_ARGS} items"),
    Broken("image-too-long", lambda spec: spec.update(agent={"image": "r/" + "a" * MAX_IMAGE_LENGTH}),
           f"spec.agent.image: Too long: may not be longer than {MAX_IMAGE_LENGTH}",
           f"spec.agent.image: String should have at most {MAX_IMAGE_LENGTH} characters"),
    # Only the controller can see these: it refuses them before any Job.
    Broken("fractional-gpu", _limit("nvidia.com/gpu", "0.5"), None,
           "limits.nvidia.com/gpu: '0.5' is not a whole number of devices; write e.g. \"nvidia.com/gpu\": 1"),
    Broken("gpu-without-its-vendor", _limit("gpu", 1), None,
           'limits.gpu: unknown resource; use cpu, memory, ephemeral-storage or a device resource with its '
           'vendor, e.g. "nvidia.com/gpu"'),
    Broken("env-set-by-the-platform", _set("agent.env", [{"name": "GRADING_SERVER_URL", "value": "x"}]), None,
           "GRADING_SERVER_URL is set by the platform; choose another name"),
    Broken("egress-into-the-cluster", _egress({"cidr": "10.96.0.0/12"}), None,
           "lies inside 10.0.0.0/8, an address range of the cluster itself"),
    Broken("name-too-long", lambda spec: None, None, "must be a DNS label of at most 50 characters",
           name="x" * 60),
]  # fmt: skip


#: Valid specs near the broken ones: every rule of the schema and the controller lets each pass.
VALID: dict[str, Callable[[Spec], None]] = {
    "builtin-agent": lambda spec: None,
    "custom-image-with-command": lambda spec: spec.update(
        agent={
            "image": "registry.example/agent:1",
            "command": ["python", "train.py"],
            "args": ["--lr", "1e-5"],
        }
    ),
    "image-with-builtin-null": lambda spec: spec.update(
        agent={"image": "registry.example/agent:1", "builtin": None}
    ),
    "builtin-with-empty-command": _set("agent.command", []),
    "builtin-with-command-null": _set("agent.command", None),
    "builtin-with-args": _set("agent.args", ["--learning-rate", "1e-5"]),
    "at-the-bounds": lambda spec: spec.update(
        model="Qwen/" + "Q" * (MAX_MODEL_LENGTH - 5),
        agent={
            "image": "registry.example/" + "a" * (MAX_IMAGE_LENGTH - 17),
            "command": ["python"] * MAX_ARGS,
            "args": ["a" * MAX_ARG_LENGTH] * MAX_ARGS,
            "env": [{"name": f"V{i}", "value": "v" * MAX_ARG_LENGTH} for i in range(MAX_ENV)],
        },
    ),
}


def valid_manifests() -> dict[str, dict[str, Any]]:
    return {name: manifest(Broken(name, change, None, "")) for name, change in VALID.items()}
