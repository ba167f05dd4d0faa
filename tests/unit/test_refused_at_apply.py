"""Broken Experiments are refused at ``kubectl apply`` by the CRD's schema, with the API server's
message naming the fix, or, where no schema can see the mistake, by the controller at once.

kmock (the operator tests' API server) does not run OpenAPI validation, so the schema is applied
here with a real JSON-schema validator, in the dialect and with the messages of the API server's
own validator; tests/e2e/test_operator.py runs the controller-only cases through the operator.
"""

from __future__ import annotations

import json
from typing import Any

import celpy
import jsonschema
import pytest

from autorl.builtin_agents import builtin_agent_names
from autorl.crd import crd_manifest
from autorl.experiment import CLUSTER_MODEL_PATTERN, ExperimentSpec
from autorl.models.sources import BUILTIN_MODELS
from autorl.tasks import task_names
from autorl_controller.operator.handlers.create import validation_error
from autorl_controller.operator.settings import ControllerSettings
from tests.support.broken_experiments import CASES, Broken, base_spec, manifest, valid_manifests
from tests.support.cel_rules import cel_errors, is_transition_rule, rules
from tests.support.crd_bounds import BOUND_KEYWORDS, bound_message
from tests.unit.test_crd import as_json_schema

#: The controller's defaults: every private range is the cluster's.
CONTROLLER = ControllerSettings(admin_token="x" * 32)


def _value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, (dict, list)) else f'"{type(value).__name__}"'


#: The API server's words for each failed keyword (k8s.io/kube-openapi's validate package); those
#: of the bounds are its own (tests/support/crd_bounds.py).
_DETAILS = {
    "pattern": "should match '{bound}'",
    "minimum": "should be greater than or equal to {bound}",
    "maximum": "should be less than or equal to {bound}",
    "minLength": "should be at least {bound} chars long",
    "type": "must be of type {types}",
    "oneOf": "must validate one and only one schema (oneOf)",
}


def _listed(bound: Any) -> list[str]:
    return [str(item) for item in bound] if isinstance(bound, list) else [str(bound)]


def api_server_errors(resource: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What ``kubectl apply`` prints for ``resource`` (one line per field; ``old`` on an update), as the
    API server's OpenAPI validator, strict field validation and CEL rules word it."""
    root = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = as_json_schema(root)
    schema["properties"]["metadata"] = {"type": "object"}
    lines = []
    for error in jsonschema.Draft4Validator(schema).iter_errors(resource):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        value, keyword, bound = error.instance, error.validator, error.validator_value
        if keyword == "required":
            lines += [f"{path}.{name}: Required value" for name in bound if name not in value]
        elif keyword == "additionalProperties":
            lines += [
                f'unknown field "{path}.{name}"' for name in value if name not in error.schema["properties"]
            ]
        elif keyword in BOUND_KEYWORDS:
            lines.append(f"{path}: {bound_message(str(keyword), bound, value)[1]}")
        elif keyword == "enum":
            supported = ", ".join(json.dumps(v) for v in bound if v is not None)
            lines.append(f"{path}: Unsupported value: {_value(value)}: supported values: {supported}")
        else:
            detail = _DETAILS[str(keyword)].format(bound=bound, types="/".join(_listed(bound)))
            lines.append(f"{path}: Invalid value: {_value(value)}: {path} in body {detail}")
    # The API server runs the CEL rules only on values of the right types and enum members.
    if not any("Unsupported value" in line or "must be of type" in line for line in lines):
        lines += cel_errors(root, resource, old)
    return lines


def test_the_table_holds_the_reported_mistakes_and_more() -> None:
    assert len(CASES) >= 21 and len({case.id for case in CASES}) == len(CASES)
    refused_by_schema = [case for case in CASES if case.schema is not None]
    assert len(refused_by_schema) >= 21


@pytest.mark.parametrize("name", sorted(valid_manifests()))
def test_a_valid_experiment_passes_both(name: str) -> None:
    valid = valid_manifests()[name]
    assert api_server_errors(valid) == []
    assert validation_error("valid", valid["spec"], CONTROLLER) is None


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    root = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = list(rules(root))
    assert {path for path, _ in found} >= {"spec", "spec.agent"}
    environment = celpy.Environment()
    for path, rule in found:
        environment.compile(rule["rule"])
        assert rule["message"].strip(), f"{path}: {rule['rule']} needs a message that names the fix"


def test_a_changed_spec_is_refused_and_an_unchanged_one_is_not() -> None:
    """The transition rule: an update that keeps the spec passes, one that changes it is refused."""
    root = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert [path for path, rule in rules(root) if is_transition_rule(rule)] == ["spec"]
    before = valid_manifests()["builtin-agent"]
    assert api_server_errors(before, old=before) == []
    after = {**before, "spec": {**before["spec"], "timeoutSeconds": 60}}
    assert api_server_errors(after, old=before) == [
        'spec: Invalid value: "object": spec is immutable: delete the Experiment and apply a new one'
    ]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_broken_experiment_is_refused_with_the_fix(case: Broken) -> None:
    resource = manifest(case)
    errors = api_server_errors(resource)
    if case.schema is None:
        assert errors == [], "the schema refuses it: give the case the API server's message"
    else:
        assert len(errors) == 1 and case.schema in errors[0], errors
    message = validation_error(case.name, resource["spec"], CONTROLLER)
    assert message is not None and case.controller in message, message


def test_the_schemas_names_are_the_registries() -> None:
    """The enums and the model pattern are generated from the registries, so they cannot drift."""
    spec = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["agent"]["properties"]["builtin"]["enum"] == builtin_agent_names()
    assert spec["properties"]["task"]["enum"] == task_names()
    assert spec["properties"]["model"]["pattern"] == CLUSTER_MODEL_PATTERN
    for name in BUILTIN_MODELS:
        assert f"builtin:{name}" in CLUSTER_MODEL_PATTERN
    for agent in builtin_agent_names():
        ExperimentSpec.model_validate({**base_spec(), "agent": {"builtin": agent}})
