"""The grader's OpenAPI document tells clients every answer and every refusal they can get: each
agent and admin operation declares its answer as a named model and its error codes (401 for
credentials everywhere; 400, 403, 409 and 429 on /submit, the codes agents rely on), each with the
one refusal body (``detail`` and ``error``). That the declared codes are the ones answered is
checked by fuzzing (tests/integration/test_grader_fuzz.py, schemathesis's status-code conformance)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.openapi import grader_document

DOCUMENT = grader_document()
REFUSAL_REF = "#/components/schemas/Refusal"
AGENT_PATHS = (
    "/submit",
    "/submissions/{submission_id}",
    "/scores",
    "/time",
    "/health",
    "/set_baseline",
    "/final",
)


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, methods in DOCUMENT["paths"].items()
        for method, operation in methods.items()
    ]


def agent_or_admin(path: str) -> bool:
    return path.startswith("/v1/") or path.removeprefix("/a/{token}") in AGENT_PATHS


def json_schema(response: dict[str, Any]) -> dict[str, Any] | None:
    return response.get("content", {}).get("application/json", {}).get("schema")


def typed(schema: dict[str, Any] | None) -> bool:
    """A named model, a list of one, or one of several: not a free-form object."""
    if schema is None:
        return False
    if schema.get("type") == "array":
        return typed(schema.get("items"))
    if "anyOf" in schema:
        return all(typed(option) for option in schema["anyOf"])
    return schema.get("$ref", "").startswith("#/components/schemas/")


def test_the_refusal_body_names_detail_and_error() -> None:
    refusal = DOCUMENT["components"]["schemas"]["Refusal"]
    assert set(refusal["required"]) == {"detail", "error"}


@pytest.mark.parametrize(
    ("method", "path", "operation"), operations(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_error_code_an_operation_declares_has_the_refusal_body(
    method: str, path: str, operation: dict[str, Any]
) -> None:
    errors = {code: r for code, r in operation["responses"].items() if code[0] in "45"}
    if path == "/readyz":  # a probe's answer, with the store that is down: {status, detail}
        errors.pop("503", None)
    assert errors, f"{method} {path} declares no refusal"
    for code, response in errors.items():
        assert json_schema(response) == {"$ref": REFUSAL_REF}, (method, path, code)
        assert response["description"], (method, path, code)


def test_agent_and_admin_operations_declare_their_answer_and_credentials_refusal() -> None:
    checked = 0
    for method, path, operation in operations():
        if not agent_or_admin(path):
            continue
        checked += 1
        responses = operation["responses"]
        if path.endswith("/set_baseline"):
            assert "403" in responses and not [c for c in responses if c.startswith("2")]  # only refuses
            continue
        success = [json_schema(r) for code, r in responses.items() if code.startswith("2")]
        assert success and all(typed(s) for s in success), (method, path, success)
        assert "401" in responses, f"{method} {path} does not declare the credentials refusal"
    assert checked == 2 * len(AGENT_PATHS) + 11  # both agent mounts and the admin API


@pytest.mark.parametrize("path", ["/submit", "/a/{token}/submit"])
def test_submit_declares_every_refusal_an_agent_handles(path: str) -> None:
    declared = set(DOCUMENT["paths"][path]["post"]["responses"])
    assert {"200", "202", "400", "401", "403", "409", "422", "429", "503"} <= declared


@pytest.mark.parametrize("path", ["/final", "/a/{token}/final"])
def test_final_declares_every_refusal_of_a_nomination(path: str) -> None:
    declared = set(DOCUMENT["paths"][path]["post"]["responses"])
    assert {"200", "400", "401", "403", "409", "422"} <= declared


def test_metrics_declares_prometheus_text_behind_the_admin_token() -> None:
    responses = DOCUMENT["paths"]["/metrics"]["get"]["responses"]
    assert "text/plain" in responses["200"]["content"]
    assert {"401", "503"} <= set(responses)


def test_the_probes_answer_named_models_and_readiness_refuses_as_every_route() -> None:
    """The probes are served on the agents' port too: their answers are typed like the API's."""
    live = DOCUMENT["paths"]["/healthz"]["get"]["responses"]
    ready = DOCUMENT["paths"]["/readyz"]["get"]["responses"]
    assert typed(json_schema(live["200"])) and typed(json_schema(ready["200"]))
    assert json_schema(ready["503"]) == {"$ref": REFUSAL_REF}


def test_every_submission_answer_types_its_split_and_intervals_as_the_contract_does() -> None:
    """Every submission answer carries ``split`` (test or validation), ``interval`` and ``comparison``;
    an interval is ``[low, high]`` and the discordant problems ``[b, c]``."""
    schemas = DOCUMENT["components"]["schemas"]
    for name in ("SubmissionAnswer", "PendingAnswer"):
        properties = schemas[name]["properties"]
        assert {"split", "interval", "comparison"} <= set(properties), name
        split = properties["split"]
        split = schemas[split["$ref"].rsplit("/", 1)[1]] if "$ref" in split else split
        assert split["enum"] == ["test", "validation"], name
    interval = schemas["SubmissionAnswer"]["properties"]["interval"]["anyOf"][0]
    assert (interval["minItems"], interval["maxItems"]) == (2, 2)
    comparison = schemas["Comparison"]["properties"]
    for pair in ("interval", "discordant"):
        assert (comparison[pair]["minItems"], comparison[pair]["maxItems"]) == (2, 2), pair


@pytest.mark.parametrize("path", ["/time", "/scores", "/a/{token}/submit"])
def test_agent_routes_declare_the_fair_shares_429_with_when_to_come_back_and_the_body_limit(
    path: str,
) -> None:
    responses = next(iter(DOCUMENT["paths"][path].values()))["responses"]
    assert "fair share" in responses["429"]["description"]
    assert "Retry-After" in responses["429"]["headers"] and "Retry-After" in responses["503"]["headers"]
    assert "413" in responses
