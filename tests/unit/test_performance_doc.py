"""docs/PERFORMANCE.md states only figures that the committed benchmark results hold."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = REPO_ROOT / "docs" / "PERFORMANCE.md"
#: A measured-looking figure: a number followed by a unit of time, memory, rate or ratio.
FIGURE = re.compile(r"\d[\d,.]*\s?(?:s|ms|GiB|GB|TB/s|tok/s|×)(?![\w/])")


def _report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_report", REPO_ROOT / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_results_file_has_a_block_and_every_block_renders_from_its_file() -> None:
    report = _report()
    blocks = report.blocks(DOCUMENT.read_text(encoding="utf-8"))
    assert set(blocks) == set(report.RENDERERS), "each renderer's block must be in the document, once"
    for name, body in blocks.items():
        assert body == report.render(name), (
            f"block {name} differs from bench/results: run python3 bench/report.py"
        )


def test_no_measured_figure_outside_the_generated_blocks() -> None:
    text = _report().BLOCK.sub("", DOCUMENT.read_text(encoding="utf-8"))
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    assert FIGURE.findall(prose) == [], "write measured figures through bench/report.py, not by hand"
