"""A name the codebase gives one concept is defined once: two ``ModelShape`` classes or two
``visible_gpus`` functions meaning different things send a reader (and an import) to the wrong one,
and a class of ours named ``BaseModel`` reads as pydantic's."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Our code: the core, the services, the tools and the benchmarks (not tests, not vendored trees).
SOURCES = ("autorl", "services", "tools", "bench")


def definitions() -> Counter[str]:
    """How many times each class or function name is defined in our code."""
    names: Counter[str] = Counter()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            if "build" in path.relative_to(ROOT).parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            names.update(
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def test_one_model_shape_one_visible_gpus_and_no_second_base_model() -> None:
    defined = definitions()
    assert defined["ModelShape"] == 1
    assert defined["visible_gpus"] == 1
    assert defined["BaseModel"] == 0  # pydantic's is the only BaseModel
