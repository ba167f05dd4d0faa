"""docs/RELIABILITY.md's generated sections say what the committed results files hold."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = REPO_ROOT / "docs" / "RELIABILITY.md"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_section_renders_from_its_results_file() -> None:
    report = _load("report")
    sections = report.blocks(DOCUMENT.read_text(encoding="utf-8"))
    assert set(sections) == set(report.RELIABILITY_RENDERERS), "each renderer's section must be there, once"
    for name, body in sections.items():
        assert body == report.render(name, report.RELIABILITY_RENDERERS), (
            f"section {name} differs from bench/results: run python3 bench/report.py"
        )


def test_every_surviving_mutant_is_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = _load("report")
    results = {
        "date": "2026-11-30T00:00:00+00:00",
        "tool": "mutmut 3.8.1",
        "modules": ["autorl/tasks/gsm8k.py"],
        "tests": ["tests/unit/test_gsm8k_scoring.py"],
        "outcomes": {"killed": 9, "survived": 2},
        "mutants": 11,
        "survivors": [
            {"mutant": "autorl.tasks.gsm8k.x_a__mutmut_1", "change": "return a | b"},
            {"mutant": "autorl.tasks.gsm8k.x_b__mutmut_2", "change": "x = `y`"},
        ],
    }
    (tmp_path / "mutation.json").write_text(json.dumps(results))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    text = report.render("mutation", report.RELIABILITY_RENDERERS)
    assert "11 mutants" in text and "killed 9, survived 2" in text
    assert "| `autorl.tasks.gsm8k.x_a__mutmut_1` | `return a \\| b` |" in text
    assert "`x = 'y'`" in text


def test_mutation_results_parse_mutmuts_listing() -> None:
    mutation = _load("mutation")
    listing = (
        "    autorl.tasks.gsm8k.x_f__mutmut_1: killed\n"
        "    autorl.tasks.gsm8k.x_f__mutmut_2: survived\n"
        "noise\n"
    )
    assert mutation.parse_results(listing) == {
        "autorl.tasks.gsm8k.x_f__mutmut_1": "killed",
        "autorl.tasks.gsm8k.x_f__mutmut_2": "survived",
    }
    diff = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    return x\n+    return None\n"
    assert mutation.changed_line(diff) == "return None"
