"""The Experiment CRD: generated from the models, checked in without drift, structural as an API server
demands, and agreeing with the controller on which manifests are valid."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autorl.crd import crd_manifest, render_crd_yaml
from autorl.experiment import ExperimentResourceStatus, Phase
from autorl_controller.operator.handlers.create import validation_error
from autorl_controller.operator.lifecycle import (
    JobState,
    JobStatus,
    agent_outcome,
    conditions_status,
    merged,
    outcome_condition,
    status_from_view,
    status_patch,
    with_condition,
)
from autorl_controller.operator.settings import ControllerSettings
from tests.support.answers import experiment_answer
from tests.support.cel_rules import cel_errors

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "charts" / "autorl" / "crds" / "experiments.autorl.io.yaml"
EXAMPLES = sorted((REPO / "examples").glob("experiment-*.yaml"))
INVALID = sorted((REPO / "tests" / "fixtures" / "k8s").glob("*.yaml"))
#: The controller's defaults: every private range is the cluster's.
CONTROLLER = ControllerSettings(admin_token="x" * 32)

#: Keywords of the apiextensions.k8s.io/v1 JSONSchemaProps (what an API server understands).
K8S_SCHEMA_KEYWORDS = {
    "description", "type", "format", "title", "default", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf", "oneOf",
    "anyOf", "not", "properties", "additionalProperties", "nullable", "example", "externalDocs",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type",
    "x-kubernetes-validations",
}  # fmt: skip
#: Inside a logical junctor a structural schema allows value validations only.
JUNCTOR_FORBIDDEN = {
    "type",
    "description",
    "default",
    "nullable",
    "additionalProperties",
    "x-kubernetes-int-or-string",
}


def schema() -> dict[str, Any]:
    version = crd_manifest()["spec"]["versions"][0]
    root: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return root


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every schema node with its path and whether it sits inside allOf/anyOf/oneOf/not."""
    yield path, node, False
    for name, child in (node.get("properties") or {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    for junctor in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(junctor) or []:
            yield f"{path}<{junctor}>", branch, True
    if isinstance(node.get("not"), dict):
        yield f"{path}<not>", node["not"], True


def test_checked_in_crd_is_the_generated_one() -> None:
    assert CHECKED_IN.read_text() == render_crd_yaml(), (
        "the CRD drifted from autorl/experiment.py: run `make crd`"
    )


def test_make_crd_writes_the_checked_in_crd() -> None:
    """What `make crd` runs prints the file the chart ships, byte for byte."""
    printed = subprocess.run(
        [sys.executable, "-m", "autorl.crd"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert printed == CHECKED_IN.read_text()


def test_crd_passes_strict_kubernetes_validation() -> None:
    kubernetes_validate.validate(
        yaml.safe_load(CHECKED_IN.read_text()), kubernetes_validate.latest_version(), True
    )


def test_crd_schema_is_structural() -> None:
    for path, node, in_junctor in nodes(schema()):
        where = path or "<root>"
        assert not set(node) - K8S_SCHEMA_KEYWORDS, (
            f"{where}: unknown keywords {set(node) - K8S_SCHEMA_KEYWORDS}"
        )
        assert "$ref" not in node and "$defs" not in node, where
        if in_junctor:
            assert not set(node) & JUNCTOR_FORBIDDEN, (
                f"{where}: {set(node) & JUNCTOR_FORBIDDEN} inside a junctor"
            )
            continue
        for branch in node.get("anyOf", []) + node.get("oneOf", []):
            assert branch.get("type") != "null", f"{where}: null as a variant (use nullable)"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{where}: additionalProperties beside properties"
        if "properties" in node or "additionalProperties" in node:
            assert node.get("type") == "object", f"{where}: an object without type: object"
        if not node.get("x-kubernetes-int-or-string"):
            assert "type" in node, f"{where}: no type"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, False), bool), (
                f"{where}: {bound} must be a boolean in OpenAPI v3.0"
            )


def test_crd_serves_status_and_the_documented_printer_columns() -> None:
    version = crd_manifest()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Reason": ".status.reason",
        "Baseline": ".status.baselineScore",
        "Best": ".status.result",
        "Improvement": ".status.improvement",
        "Budget Left": ".status.budgetLeft",
        "Queue": ".status.queue",
        "Age": ".metadata.creationTimestamp",
        "Message": ".status.message",
    }
    # What `kubectl get` shows by default is the documented six, in order; `-o wide` adds the rest.
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert shown == ["Phase", "Reason", "Best", "Improvement", "Budget Left", "Age"]
    status = schema()["properties"]["status"]["properties"]
    assert set(status) == {
        "phase", "conditions", "baselineScore", "bestScore", "bestSubmission", "improvement", "submissions",
        "startTime", "deadline", "completionTime", "message", "reason", "budgetLeft", "queue", "evaluators",
        "feedback", "finalScore", "finalLow", "finalHigh", "finalSelection", "testEvaluations", "result",
        "testOverlap", "twinScore", "twinPValue", "lineage",
    }  # fmt: skip
    assert status["phase"]["enum"] == [
        "Pending", "Preparing", "Baseline", "Running", "Finishing", "Succeeded", "Failed", "TimedOut",
    ]  # fmt: skip


def as_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """The CRD dialect as a draft-4 JSON schema, the way an API server applies it: ``nullable`` admits
    null, int-or-string admits both, and unknown fields are errors (kubectl's strict field validation)."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-validations")}
    if out.pop("x-kubernetes-int-or-string", False):
        out["type"] = ["integer", "string"]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in out:
        out["properties"] = {name: as_json_schema(child) for name, child in out["properties"].items()}
        out["additionalProperties"] = False
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = as_json_schema(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = as_json_schema(out["items"])
    for junctor in ("allOf", "anyOf", "oneOf"):
        if junctor in out:
            out[junctor] = [as_json_schema(branch) for branch in out[junctor]]
    return out


def crd_errors(manifest: dict[str, Any]) -> list[str]:
    schema_with_open_metadata = as_json_schema(schema())
    schema_with_open_metadata["properties"]["metadata"] = {"type": "object"}
    validator = jsonschema.Draft4Validator(schema_with_open_metadata)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    # The CEL rules see only values of their schema's types (tests/unit/test_refused_at_apply.py words both).
    return errors or cel_errors(schema(), manifest)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_valid_for_the_crd_and_the_controller(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    assert crd_errors(manifest) == []
    assert validation_error(manifest["metadata"]["name"], manifest["spec"], CONTROLLER) is None


def test_examples_folder_holds_one_valid_object_per_file() -> None:
    for path in (REPO / "examples").glob("*.yaml"):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert len(documents) == 1, path.name
        if documents[0]["kind"] != "Experiment":
            assert documents[0]["kind"] == "Secret" and "secret" in path.name, path.name
            kubernetes_validate.validate(documents[0], kubernetes_validate.latest_version(), True)


@pytest.mark.parametrize("path", INVALID, ids=[p.name for p in INVALID])
def test_invalid_fixtures_are_refused_where_declared(path: Path) -> None:
    text = path.read_text()
    rejected_by = re.search(r"^# rejected-by: (.+)$", text, re.M)
    expect = re.search(r"^# expect: (.+)$", text, re.M)
    assert rejected_by and expect, f"{path.name} must declare '# rejected-by:' and '# expect:'"
    manifest = yaml.safe_load(text)
    layers = rejected_by.group(1).split()
    errors = crd_errors(manifest)
    assert bool(errors) == ("crd" in layers), errors
    message = validation_error(manifest["metadata"]["name"], manifest.get("spec") or {}, CONTROLLER)
    assert message is not None and expect.group(1) in message, message


def test_every_status_the_operator_patches_is_the_models_json_and_valid_for_the_crd() -> None:
    """The operator patches status from ExperimentResourceStatus, serialised by alias: times in
    whole UTC seconds, a field set to None sent as null (it removes it), and nothing the CRD's status
    schema does not hold."""
    best = {"submission_id": 5, "of": 5, "selection": "best_on_test", "status": "scored", "score": 30.5}
    times = {"start_time": 1767225600.75, "end_time": 1767232800.0, "remaining_s": 3900.0}
    view = experiment_answer(best_score=30.5, final={**best, "interval": [28.0, 35.0]}, **times)
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    finished = outcome_condition(outcome, datetime(2026, 1, 1, 3, tzinfo=UTC))
    moving = ExperimentResourceStatus(phase=Phase.FINISHING, reason="EvaluationsInFlight", message="waiting")
    status = merged(moving, status_from_view(view), conditions_status(with_condition(None, finished)))
    assert isinstance(status, ExperimentResourceStatus)
    patch = status_patch(status)
    assert patch["phase"] == "Finishing" and patch["startTime"] == "2026-01-01T00:00:00Z"
    assert patch["conditions"] == [{**finished, "lastTransitionTime": "2026-01-01T03:00:00Z"}]
    final = (patch["finalScore"], patch["finalSelection"], patch["budgetLeft"])
    assert final == (30.5, "best_on_test", "1h05m")
    before = status_patch(status_from_view(experiment_answer(feedback="test")))
    assert "finalScore" in before and before["finalScore"] is None  # sent as null, not left out
    assert "completionTime" not in patch  # unset: never sent
    manifest = yaml.safe_load(EXAMPLES[0].read_text())
    assert crd_errors({**manifest, "status": patch}) == []


def test_what_the_agent_brought_in_is_mirrored_once_found_and_flagged_in_the_closing_message() -> None:
    """testOverlap, twinScore, twinPValue and lineage come from the grader's answer once it has them
    (a status mirrored before they are does not clear them) and are valid for the CRD; the closing
    message flags overlap, a twin gap below p 0.01 and a lineage."""
    from autorl_controller.operator.handlers.reconcile import summary

    found = experiment_answer(test_overlap=3, twin_score=40.0, twin_p_value=0.004, lineage="models/instruct")
    patch = status_patch(status_from_view(found))
    assert (patch["testOverlap"], patch["twinScore"], patch["twinPValue"]) == (3, 40.0, 0.004)
    assert patch["lineage"] == "models/instruct"
    manifest = yaml.safe_load(EXAMPLES[0].read_text())
    assert crd_errors({**manifest, "status": patch}) == []
    assert not {"testOverlap", "twinScore", "twinPValue", "lineage"} & set(
        status_patch(status_from_view(experiment_answer()))
    )
    outcome = agent_outcome(JobStatus(JobState.SUCCEEDED), past_deadline=False)
    assert outcome is not None
    message = summary(outcome, found)
    assert "3 test problem(s) found in the agent's files" in message
    assert "twin split is flagged (p=0.004)" in message and "status.lineage" in message
    honest = summary(outcome, experiment_answer(test_overlap=0, twin_score=40.0, twin_p_value=0.5))
    assert "found in the agent's files" not in honest and "flagged" not in honest


@pytest.mark.parametrize(
    ("secret", "refused"),
    [
        ("autorl-postgres", True),  # a Secret the platform's pods read
        ("hub-token", True),  # the prepare Jobs' own
        ("gsm8k-other-agent-token", True),  # another experiment's agent token
        ("my-llm-keys", False),
    ],
)
def test_an_agent_never_takes_a_platform_secret_or_another_agents_token(secret: str, refused: bool) -> None:
    settings = CONTROLLER.model_copy(
        update={
            "platform_secrets": ["autorl-admin-token", "autorl-postgres"],
            "prepare_env_secret": "hub-token",
        }
    )
    spec = {
        "task": "gsm8k",
        "model": "m/n",
        "agent": {"builtin": "example_grpo", "envFrom": [{"secretRef": {"name": secret}}]},
    }
    message = validation_error("exp", spec, settings)
    if not refused:
        assert message is None, message
        return
    assert message == (
        f"invalid spec: spec.agent.envFrom[0].secretRef: {secret} is a Secret of the platform or another "
        "experiment's agent token (names ending in -agent-token are theirs); pass the agent only "
        "credentials of its own, in a Secret of their own"
    )
