"""docs/PERFORMANCE.md and docs/RELIABILITY.md state only figures that the committed results hold."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.bench_modules import bench_module

#: A measured-looking figure: a number followed by a unit of time, memory, rate or ratio.
FIGURE = re.compile(r"\d[\d,.]*\s?(?:s|ms|GiB|GB|TB/s|tok/s|requests/s|×)(?![\w/])")
#: Document → the bench script that renders it (and holds it as a module attribute of that name).
DOCUMENTS = {"PERFORMANCE": "report", "RELIABILITY": "reliability_report"}


@pytest.fixture(params=sorted(DOCUMENTS))
def document(request: pytest.FixtureRequest) -> Any:
    return getattr(bench_module(DOCUMENTS[request.param]), request.param)


def test_every_renderer_has_a_block_and_every_block_renders_from_its_files(document: Any) -> None:
    blocks = document.blocks()
    assert set(blocks) == set(document.renderers), "each renderer's block must be in the document, once"
    script = f"bench/{DOCUMENTS[document.path.stem]}.py"
    for name, body in blocks.items():
        assert body == document.render(name), f"block {name} differs from bench/results: run python3 {script}"


def test_no_measured_figure_outside_the_generated_blocks(document: Any) -> None:
    text = bench_module("docgen").BLOCK.sub("", document.path.read_text(encoding="utf-8"))
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    assert FIGURE.findall(prose) == [], "write measured figures through bench/, not by hand"
