"""ExperimentSpec / ExperimentResourceStatus: what a manifest may say, and how a bad one is explained."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from autorl.experiment import (
    DEFAULT_AGENT,
    DEFAULT_TIMEOUT_S,
    ExperimentResourceStatus,
    ExperimentSpec,
    Phase,
    validate_name,
)


def spec(**fields: Any) -> dict[str, Any]:
    return {"task": "gsm8k", "model": "Qwen/Qwen2.5-1.5B", **fields}


def error_text(raw: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        ExperimentSpec.model_validate(raw)
    return str(info.value)


def test_minimal_spec_gets_the_documented_defaults() -> None:
    parsed = ExperimentSpec.model_validate(spec())
    assert parsed.agent.builtin == DEFAULT_AGENT
    assert parsed.timeoutSeconds == DEFAULT_TIMEOUT_S
    assert parsed.evaluation.protocol == "opencompass"
    assert parsed.evaluation.maxSubmissions == 100
    assert parsed.egress is None and parsed.queueName is None


def test_custom_agent_with_credentials_by_envfrom_and_egress() -> None:
    parsed = ExperimentSpec.model_validate(
        spec(
            agent={
                "image": "registry.example/agent:1",
                "command": ["python", "-m", "agent"],
                "envFrom": [{"secretRef": {"name": "llm-api-key"}}],
                "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}},
            },
            egress=[{"host": "api.openai.com"}, {"cidr": "203.0.113.0/24", "ports": [8443]}],
            queueName="gpu-queue",
        )
    )
    assert parsed.agent.display_name == "registry.example/agent:1"
    assert parsed.egress is not None
    assert [rule.tcp_ports for rule in parsed.egress] == [[443], [8443]]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (spec(agent={"builtin": "example_grpo", "image": "x:1"}), "exactly one of builtin"),
        (spec(agent={}), "exactly one of builtin"),
        (
            spec(agent={"builtin": "example_grpo", "command": ["sh"]}),
            "command applies to a custom image",
        ),
        (spec(timeoutSeconds=0), "greater than or equal to 1"),
        (spec(timeoutSeconds="2h"), "valid integer"),
        (spec(task="mmlu"), "unknown task 'mmlu'"),
        (spec(timeoutSecs=60), "Extra inputs are not permitted"),
        (spec(agent={"builtin": "example_grpo", "gpus": 1}), "Extra inputs are not permitted"),
        (spec(evaluation={"protocol": "exact"}), "'opencompass', 'flexible' or 'strict'"),
        (spec(evaluation={"maxSubmissions": 0}), "greater than or equal to 1"),
        (spec(egress=[{"host": "api.openai.com", "cidr": "10.0.0.0/8"}]), "exactly one of host or cidr"),
        (spec(egress=[{"cidr": "not-a-cidr"}]), "is not a CIDR"),
        (spec(egress=[{"host": "bad host!"}]), "is not a DNS name"),
        (spec(egress=[{"cidr": "10.0.0.0/8", "ports": [70000]}]), "less than or equal to 65535"),
        (spec(queueName="GPU Queue"), "must be a DNS label"),
        (
            spec(agent={"builtin": "x", "env": [{"name": "AUTORL_TOKEN", "value": "forged"}]}),
            "set by the platform",
        ),
        (spec(agent={"image": "x:1", "envFrom": [{}]}), "exactly one of secretRef or configMapRef"),
        ({"task": "gsm8k"}, "model\n  Field required"),
    ],
)
def test_bad_specs_are_refused_with_a_message_naming_the_problem(raw: dict[str, Any], fragment: str) -> None:
    assert fragment in error_text(raw)


@pytest.mark.parametrize("name", ["a", "gsm8k-grpo", "x" * 50])
def test_names_that_fit_children_and_labels(name: str) -> None:
    validate_name(name)


@pytest.mark.parametrize("name", ["x" * 51, "Upper", "dots.in.name", "-lead"])
def test_names_that_do_not_fit_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="DNS label of at most 50"):
        validate_name(name)


def test_status_round_trips_and_refuses_unknown_fields() -> None:
    status = ExperimentResourceStatus.model_validate(
        {"phase": "Running", "baselineScore": 12.5, "bestScore": 20.0, "deadline": "2026-11-30T02:00:00Z"}
    )
    assert status.phase is Phase.RUNNING and not status.phase.terminal
    assert status.model_dump(exclude_none=True, mode="json")["deadline"] == "2026-11-30T02:00:00Z"
    with pytest.raises(ValidationError):
        ExperimentResourceStatus.model_validate({"phase": "Running", "score": 1})
    assert {p for p in Phase if p.terminal} == {Phase.SUCCEEDED, Phase.FAILED, Phase.TIMED_OUT}


def test_every_budget_and_limit_an_experiment_may_ask_for_the_grader_registers() -> None:
    """The controller registers an Experiment with the grader as its spec says: a spec the API
    server accepts must not be refused by the grader's API (30 days, and 32-bit limits, in both)."""
    from autorl.api.request_bodies import RegisterExperiment
    from autorl.experiment import MAX_BUDGET_S, MAX_INT32

    longest = ExperimentSpec.model_validate(
        spec(timeoutSeconds=MAX_BUDGET_S, evaluation={"maxSubmissions": MAX_INT32})
    )
    RegisterExperiment(
        name="e",
        task="gsm8k",
        model="m",
        timeout_s=longest.timeoutSeconds,
        workspace="/w",
        base_model_dir="/w/models/m",
        max_submissions=longest.evaluation.maxSubmissions,
    )
    assert "less than or equal to 2592000" in error_text(spec(timeoutSeconds=MAX_BUDGET_S + 1))
