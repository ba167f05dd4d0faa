"""The store and the HTTP contract stay in modules a reader takes in at once: one concept each,
none over MAX_LINES lines (a module that grows past it holds two things; split it by what it holds)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 450
PACKAGES = [
    "autorl/store",
    "autorl/api",
    "services/grader/autorl_grader/api",
    "services/grader/autorl_grader/api/routes",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_of_the_package_passes_the_limit(package: str) -> None:
    modules = sorted((REPO / package).glob("*.py"))
    assert modules, f"{package} has no modules"
    too_long = {
        path.name: lines for path in modules if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}
