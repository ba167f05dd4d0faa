"""The ``experiments.autorl.io`` CustomResourceDefinition, generated from the pydantic models of
:mod:`autorl.experiment` and rewritten into a Kubernetes *structural* schema: a generic JSON-schema
check would accept pydantic's output, but an API server refuses ``$ref``, ``anyOf`` with ``null``,
numeric ``exclusiveMinimum`` and ``additionalProperties`` beside ``properties``.

``python -m autorl.crd`` prints the CRD as the chart ships it (``make crd``).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from autorl.experiment import ExperimentResourceStatus, ExperimentSpec

GROUP = "autorl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Experiment"
PLURAL = "experiments"
SINGULAR = "experiment"
SHORT_NAMES = ["exp"]
CRD_NAME = f"{PLURAL}.{GROUP}"


#: Keywords of pydantic's JSON schema that a structural schema does not have (or that add only noise).
_DROPPED_KEYS = frozenset({"title", "examples", "$schema"})


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**_inline_refs(copy.deepcopy(target), defs)}
            # A $ref's siblings (a field's description or default) win over the referenced model's.
            merged.update({k: _inline_refs(v, defs) for k, v in node.items() if k != "$ref"})
            return merged
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    return node


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one (already inlined) pydantic schema node into Kubernetes' structural dialect."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        out[key] = value

    variants = out.pop("anyOf", None)
    if variants is not None:
        non_null = [v for v in variants if v.get("type") != "null"]
        if len(non_null) < len(variants):
            out["nullable"] = True
        types = sorted(v.get("type", "") for v in non_null)
        if types == ["integer", "string"]:
            out["x-kubernetes-int-or-string"] = True
        elif len(non_null) == 1:
            # The field's own description and default win over the inner type's.
            out = {**_structural(non_null[0]), **out}
        else:
            raise ValueError(f"cannot express anyOf {variants!r} in a structural schema")

    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)

    # JSON Schema 2020-12 writes exclusive bounds as numbers; OpenAPI v3.0 (the CRD dialect) as booleans.
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out and not isinstance(out[bound], bool):
            limit = out.pop(bound)
            if out.get("type") == "integer":
                out[inclusive] = limit + 1 if bound == "exclusiveMinimum" else limit - 1
            else:
                out[inclusive] = limit
                out[bound] = True

    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("format") == "date-time":
        out["type"] = "string"
    if out.get("default", 0) is None:
        del out["default"]

    if "properties" in out:
        out["type"] = "object"
        out.pop("additionalProperties", None)  # structural: never beside properties
        out["properties"] = {name: _structural(prop) for name, prop in out["properties"].items()}
    elif isinstance(out.get("additionalProperties"), dict):
        out["type"] = "object"
        out["additionalProperties"] = _structural(out["additionalProperties"])
    elif out.get("type") == "object":
        out.pop("additionalProperties", None)
    if "items" in out:
        out["items"] = _structural(out["items"])
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI v3 structural schema of a model: inlined, nullable, every object typed."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    inlined = _inline_refs(raw, defs)
    return _structural(inlined)


def printer_columns() -> list[dict[str, Any]]:
    """``kubectl get experiments``: phase, reason, best (with its interval), improvement, budget
    left, age; ``-o wide`` (priority 1) adds the baseline, the queue and the message (what it waits
    for and what to do, in words)."""
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        {"name": "Baseline", "type": "number", "jsonPath": ".status.baselineScore", "priority": 1},
        {"name": "Best", "type": "string", "jsonPath": ".status.result"},
        {"name": "Improvement", "type": "number", "jsonPath": ".status.improvement"},
        {"name": "Budget Left", "type": "string", "jsonPath": ".status.budgetLeft"},
        {"name": "Queue", "type": "string", "jsonPath": ".status.queue", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]


def crd_manifest() -> dict[str, Any]:
    """The ``experiments.autorl.io`` CustomResourceDefinition, generated from the Experiment models."""
    spec_schema = structural_schema(ExperimentSpec)
    spec_schema["description"] = "What to run. Validated again by the controller, which names any error."
    # The controller acts on the spec it validated at creation; changing it later would be ignored.
    spec_schema["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": "spec is immutable: delete the Experiment and apply a new one"}
    ]
    status_schema = structural_schema(ExperimentResourceStatus)
    status_schema["description"] = "Written by the controller only."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["autorl"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An RL post-training experiment scored by trusted evaluators.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the chart ships it (``make crd`` writes it; a test compares it with this)."""
    import yaml

    header = "# Generated from autorl/experiment.py by `make crd`; edit the models, not this file.\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=110)


if __name__ == "__main__":
    print(render_crd_yaml(), end="")
