"""Everything the CRD's CEL rules read is bounded, and the controller holds an Experiment to the same
bounds as the API server: the chart's CRD passes the emulated API server's structural cost check, a
CRD with one bound removed does not, and past each bound both refuse (tests/support/crd_bounds.py)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
import pytest_asyncio
import yaml

from autorl.crd import crd_manifest
from autorl.experiment import MAX_ARGS
from autorl_controller.operator.handlers.create import validation_error
from autorl_controller.operator.settings import ControllerSettings
from tests.support.broken_experiments import base_spec
from tests.support.crd_bounds import BOUND_KEYWORDS, crd_refusal, unbounded
from tests.support.kube_emulator import CLUSTER_TOKEN, ApiServerEmulator, declare_resources
from tests.unit.test_refused_at_apply import api_server_errors

REPO = Path(__file__).resolve().parents[2]
CHART_CRD = REPO / "charts" / "autorl" / "crds" / "experiments.autorl.io.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
EXPERIMENTS = "/apis/autorl.io/v1alpha1/namespaces/default/experiments"
CONTROLLER = ControllerSettings(admin_token="x" * 32)

#: A valid spec that sets every bounded field, so that each bound has a value to push past it.
FULL_SPEC: dict[str, Any] = {
    **base_spec(),
    "agent": {
        "image": "registry.example/agent:1",
        "command": ["python"],
        "args": ["--lr"],
        "env": [{"name": "LR", "value": "1e-5"}],
        "envFrom": [
            {"prefix": "OPENAI_", "secretRef": {"name": "llm-key"}},
            {"configMapRef": {"name": "agent-config"}},
        ],
        "resources": {"requests": {"cpu": "8"}, "limits": {"memory": "64Gi"}},
    },
    "egress": [{"host": "api.openai.com", "ports": [443]}, {"cidr": "203.0.113.0/24"}],
    "queueName": "team-a",
    "evaluation": {"knownCheckpoints": ["Qwen/Qwen2.5-1.5B-Instruct"]},
}


def experiment(spec: dict[str, Any], name: str = "big") -> dict[str, Any]:
    return {
        "apiVersion": "autorl.io/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": name},
        "spec": spec,
    }


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(root["properties"]["spec"])


#: Where an API server's CRD validation names the spec's schema.
SPEC_SCHEMA = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"


def bounds(node: dict[str, Any], path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str, int]]:
    """(path into the spec, keyword, bound) of every bound under ``node``; ``0`` in a path is a list's
    first item, ``None`` a map's first value."""
    for keyword in BOUND_KEYWORDS:
        if keyword in node:
            yield path, keyword, node[keyword]
    for name, child in (node.get("properties") or {}).items():
        yield from bounds(child, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from bounds(node["items"], (*path, 0))
    if isinstance(node.get("additionalProperties"), dict):
        yield from bounds(node["additionalProperties"], (*path, None))


BOUNDS = list(bounds(spec_schema(crd_manifest())))


def schema_step(node: dict[str, Any], step: Any) -> tuple[dict[str, Any], str]:
    """The child of a schema node on a path of :func:`bounds`, and its step as the API server names it."""
    if step == 0:
        return node["items"], "items"
    if step is None:
        return node["additionalProperties"], "additionalProperties"
    return node["properties"][step], f"properties[{step}]"


def _id(bound: tuple[tuple[Any, ...], str, int]) -> str:
    path, keyword, _ = bound
    return (
        ".".join("[0]" if step == 0 else "[*]" if step is None else str(step) for step in path)
        + f"-{keyword}"
    )


def past(value: Any, keyword: str, bound: int) -> Any:
    """``value`` grown one past ``bound``, keeping its shape: a string grows at its front (a pattern
    still matches it), a list repeats its first item, a map gains device resources."""
    if keyword == "maxLength":
        return value[0] * (bound + 1 - len(value)) + value
    if keyword == "maxItems":
        return [copy.deepcopy(value[0]) for _ in range(bound + 1)]
    first = next(iter(value.values()))
    return {**value, **{f"example.com/device-{i}": first for i in range(bound + 1 - len(value))}}


def _key(node: Any, step: Any, following: Any) -> Any:
    """The key of ``node`` a path step stands for: a map's first key, or the first item of a list
    that holds the field the path goes on to."""
    if step is None:
        return next(iter(node))
    if step == 0 and isinstance(following, str):
        return next(i for i, item in enumerate(node) if following in item)
    return step


def with_value_past(bound: tuple[tuple[Any, ...], str, int]) -> dict[str, Any]:
    path, keyword, limit = bound
    spec = copy.deepcopy(FULL_SPEC)
    node: Any = spec
    for step, following in pairwise(path):
        node = node[_key(node, step, following)]
    key = _key(node, path[-1], None)
    node[key] = past(node[key], keyword, limit)
    return experiment(spec)


def test_every_string_list_and_map_of_the_spec_is_bounded_and_the_charts_crd_is_admitted() -> None:
    assert unbounded(crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []
    assert crd_refusal(yaml.safe_load(CHART_CRD.read_text())) is None
    assert len(BOUNDS) >= 18
    assert api_server_errors(experiment(FULL_SPEC)) == []
    assert validation_error("full", FULL_SPEC, CONTROLLER) is None


@pytest.mark.parametrize("bound", BOUNDS, ids=_id)
def test_a_crd_missing_a_bound_is_refused_naming_it(bound: tuple[tuple[Any, ...], str, int]) -> None:
    path, keyword, _ = bound
    crd = crd_manifest()
    node, where = spec_schema(crd), SPEC_SCHEMA
    for step in path:
        node, name = schema_step(node, step)
        where += f".{name}"
    del node[keyword]
    refusal = crd_refusal(crd)
    assert refusal is not None and refusal["code"] == 422 and refusal["reason"] == "Invalid"
    (cause,) = refusal["details"]["causes"]
    assert cause["field"] == f"{SPEC_SCHEMA}.x-kubernetes-validations[0].rule"
    assert cause["message"].startswith(
        f"Forbidden: estimated rule cost exceeds budget: {where} has no {keyword}"
    )


@pytest.mark.parametrize("bound", BOUNDS, ids=_id)
def test_past_each_bound_the_api_server_and_the_controller_both_refuse(
    bound: tuple[tuple[Any, ...], str, int],
) -> None:
    manifest = with_value_past(bound)
    _, keyword, limit = bound
    words = (
        f"Too long: may not be longer than {limit}" if keyword == "maxLength" else f"at most {limit} items"
    )
    errors = api_server_errors(manifest)
    assert any(words in line for line in errors), errors
    message = validation_error("big", manifest["spec"], CONTROLLER)
    assert message is not None and f"at most {limit}" in message, message


@pytest_asyncio.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    """The emulated API server (no RBAC), as an administrator's kubectl talks to it."""
    emulator = ApiServerEmulator()
    async with emulator, kmock.Server(emulator):
        declare_resources(emulator)
        headers = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
        async with httpx.AsyncClient(base_url=str(emulator.url).rstrip("/"), headers=headers) as client:
            yield client


@pytest.mark.asyncio
async def test_the_emulated_api_server_refuses_an_unbounded_crd_and_an_experiment_past_a_bound(
    api: httpx.AsyncClient,
) -> None:
    unbounded_crd = crd_manifest()
    del spec_schema(unbounded_crd)["properties"]["agent"]["properties"]["args"]["maxItems"]
    refused = await api.post(CRDS, json=unbounded_crd)
    assert refused.status_code == 422, refused.text
    assert "properties[args] has no maxItems" in refused.json()["message"]
    assert (await api.post(CRDS, json=yaml.safe_load(CHART_CRD.read_text()))).status_code < 300

    agent = {"image": "registry.example/agent:1", "args": ["--lr"] * (MAX_ARGS + 1)}
    many_args = experiment({**base_spec(), "agent": agent}, "many-args")
    refused = await api.post(EXPERIMENTS, json=many_args)
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"] == (
        f'Experiment.autorl.io "many-args" is invalid: spec.agent.args: Too many: {MAX_ARGS + 1}: '
        f"must have at most {MAX_ARGS} items"
    )
    assert refused.json()["details"]["causes"] == [
        {
            "reason": "FieldValueTooMany",
            "message": f"Too many: {MAX_ARGS + 1}: must have at most {MAX_ARGS} items",
            "field": "spec.agent.args",
        }
    ]
    agent["args"] = agent["args"][:MAX_ARGS]
    created = await api.post(EXPERIMENTS, json=many_args)
    assert created.status_code < 300, created.text
    # A patch is held to the bounds as well: it would store the list past its bound.
    patched = await api.patch(
        f"{EXPERIMENTS}/many-args",
        json={"spec": {"agent": {"args": ["--lr"] * (MAX_ARGS + 1)}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 422 and "Too many" in patched.json()["message"], patched.text
