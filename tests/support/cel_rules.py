"""The CRD's CEL rules (``x-kubernetes-validations``) evaluated as an API server evaluates them, with
cel-python, a CEL implementation of its own: each rule on the value at its node, ``oldSelf`` only on
an update (a transition rule is skipped at create), a null field absent to ``has()``, and the refusal
worded as the API server words it (``spec.agent: Invalid value: "object": <message>``).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import celpy

_ENVIRONMENT = celpy.Environment()


@cache
def _program(rule: str) -> celpy.Runner:
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(rule))


def _without_nulls(value: Any) -> Any:
    """The API server treats a null field of an object as an absent one in CEL."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def rules(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    """Every CEL rule of a schema with the path of its node (``[*]`` for each item)."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, child in (node.get("properties") or {}).items():
        yield from rules(child, f"{path}.{name}".lstrip("."))
    if isinstance(node.get("items"), dict):
        yield from rules(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from rules(node["additionalProperties"], f"{path}[*]")


def is_transition_rule(rule: dict[str, str]) -> bool:
    return "oldSelf" in rule["rule"]


def cel_errors(node: dict[str, Any], value: Any, old: Any = None, path: str = "") -> list[str]:
    """The API server's refusals of ``value`` (``old`` on an update) by the CEL rules under ``node``."""
    if value is None:
        return []
    errors = []
    for rule in node.get("x-kubernetes-validations", []):
        if is_transition_rule(rule) and old is None:
            continue
        activation = {"self": celpy.json_to_cel(_without_nulls(value))}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(_without_nulls(old))
        result = _program(rule["rule"]).evaluate(activation)
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            errors.append(f'{path}: Invalid value: "{node.get("type", "object")}": {rule["message"]}')
    old_children = old if isinstance(old, dict) else {}
    if isinstance(value, dict):
        for name, child in (node.get("properties") or {}).items():
            where = f"{path}.{name}".lstrip(".")
            errors += cel_errors(child, value.get(name), old_children.get(name), where)
        if isinstance(node.get("additionalProperties"), dict):
            for name, item in value.items():
                errors += cel_errors(
                    node["additionalProperties"], item, old_children.get(name), f"{path}[{name}]"
                )
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        # Items of a list without x-kubernetes-list-type: map have no oldSelf (a transition needs a key).
        errors += [
            error
            for index, item in enumerate(value)
            for error in cel_errors(node["items"], item, None, f"{path}[{index}]")
        ]
    return errors
