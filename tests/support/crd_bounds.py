"""What a CRD's CEL rules may read must be bounded, and what an object holds must keep within those
bounds: the emulated API server's stand-in for the API server's CEL cost estimate, and its refusals
of a string, list or map past its ``maxLength``, ``maxItems`` or ``maxProperties``.

The API server estimates each rule's cost from the largest values its schema admits and refuses a
CRD whose rules could cost too much; a string, list or map without a bound is as large as a request.
This check is structural, not that estimator: under every node that carries
``x-kubernetes-validations`` (``self == oldSelf`` on ``spec`` compares all of it), every string needs
``maxLength`` (or an ``enum``, or a format of bounded length), every list ``maxItems`` and every map
``maxProperties``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.support.kube_status import failure

#: Formats whose strings the API server's estimator bounds by themselves.
BOUNDED_FORMATS = frozenset({"date", "date-time", "duration"})
#: The API server's advice when a rule's estimated cost is over its budget.
COST_ADVICE = (
    "try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, "
    "and strings are declared"
)


def _schema_path(parent: str, step: str) -> str:
    return f"{parent}.{step}" if parent else step


def _unbounded_below(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(schema path, the keyword it lacks) of every unbounded string, list and map at or below ``node``."""
    textual = node.get("type") == "string" or node.get("x-kubernetes-int-or-string")
    if textual and not {"maxLength", "enum"} & set(node) and node.get("format") not in BOUNDED_FORMATS:
        yield path, "maxLength"
    if node.get("type") == "array":
        if "maxItems" not in node:
            yield path, "maxItems"
        if isinstance(node.get("items"), dict):
            yield from _unbounded_below(node["items"], _schema_path(path, "items"))
    if isinstance(node.get("additionalProperties"), dict):
        if "maxProperties" not in node:
            yield path, "maxProperties"
        yield from _unbounded_below(node["additionalProperties"], _schema_path(path, "additionalProperties"))
    for name, child in (node.get("properties") or {}).items():
        yield from _unbounded_below(child, _schema_path(path, f"properties[{name}]"))


def unbounded(schema: dict[str, Any], path: str = "openAPIV3Schema") -> list[tuple[str, str, str]]:
    """(the rule's schema path, the unbounded node's schema path, the keyword it lacks) for every
    string, list and map that a CEL rule reads without a bound, each once (under the outermost rule
    that reads it)."""
    found: list[tuple[str, str, str]] = []
    if schema.get("x-kubernetes-validations"):
        rule = _schema_path(path, "x-kubernetes-validations[0].rule")
        return [(rule, where, keyword) for where, keyword in _unbounded_below(schema, path)]
    for name, child in (schema.get("properties") or {}).items():
        found += unbounded(child, _schema_path(path, f"properties[{name}]"))
    for step in ("items", "additionalProperties"):
        if isinstance(schema.get(step), dict):
            found += unbounded(schema[step], _schema_path(path, step))
    return found


def crd_refusal(crd: dict[str, Any]) -> dict[str, Any] | None:
    """The API server's 422 for a CRD whose rules read unbounded values, worded as its cost refusal
    with the node and the bound it lacks; None: admitted."""
    causes = []
    for index, version in enumerate(crd.get("spec", {}).get("versions", [])):
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        for rule, where, keyword in unbounded(schema, f"spec.versions[{index}].schema.openAPIV3Schema"):
            message = (
                f"Forbidden: estimated rule cost exceeds budget: {where} has no {keyword} "
                f"(checked structurally; {COST_ADVICE})"
            )
            causes.append({"reason": "FieldValueForbidden", "message": message, "field": rule})
    if not causes:
        return None
    name = crd.get("metadata", {}).get("name", "")
    details = "; ".join(f"{cause['field']}: {cause['message']}" for cause in causes)
    return failure(
        422,
        "Invalid",
        f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: {details}',
        {"name": name, "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition", "causes": causes},
    )


#: The bounds whose refusals the API server words itself (``Too long``, ``Too many``) rather than
#: passing on the OpenAPI validator's words.
BOUND_KEYWORDS = ("maxLength", "maxItems", "maxProperties")


def bound_message(keyword: str, bound: int, value: Any) -> tuple[str, str]:
    """(reason, message) of the API server's refusal of ``value`` past ``keyword: bound``."""
    if keyword == "maxLength":
        return "FieldValueTooLong", f"Too long: may not be longer than {bound}"
    return "FieldValueTooMany", f"Too many: {len(value)}: must have at most {bound} items"


def _field(parent: str, step: str | int) -> str:
    return f"{parent}[{step}]" if isinstance(step, int) else _schema_path(parent, step)


def bound_errors(node: dict[str, Any], value: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(field, reason, message) for each string, list or map of ``value`` past its schema's bound,
    worded as the API server words them (``spec.agent.args: Too many: 300: must have at most 256
    items``)."""
    errors: list[tuple[str, str, str]] = []
    for keyword, kind in zip(BOUND_KEYWORDS, (str, list, dict), strict=True):
        if isinstance(value, kind) and keyword in node and len(value) > node[keyword]:
            errors.append((path, *bound_message(keyword, node[keyword], value)))
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            errors += bound_errors(node["items"], item, _field(path, index))
    if isinstance(value, dict):
        properties = node.get("properties") or {}
        for name, item in value.items():
            child = properties.get(name, node.get("additionalProperties"))
            if isinstance(child, dict):
                errors += bound_errors(child, item, _field(path, name))
    return errors


def object_refusal(crd: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any] | None:
    """The API server's 422 for a custom resource with a value past its CRD's bounds; None: within."""
    version = str(obj.get("apiVersion", "")).rsplit("/", 1)[-1]
    schemas = [v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version]
    errors = bound_errors(schemas[0], obj) if schemas else []
    if not errors:
        return None
    kind, group = crd["spec"]["names"]["kind"], crd["spec"]["group"]
    name = obj.get("metadata", {}).get("name", "")
    causes = [{"reason": reason, "message": message, "field": where} for where, reason, message in errors]
    listed = ", ".join(f"{where}: {message}" for where, _, message in errors)
    text = f'{kind}.{group} "{name}" is invalid: ' + (f"[{listed}]" if len(errors) > 1 else listed)
    return failure(422, "Invalid", text, {"name": name, "group": group, "kind": kind, "causes": causes})
