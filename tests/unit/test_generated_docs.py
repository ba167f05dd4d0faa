"""docs/PERFORMANCE.md and docs/RELIABILITY.md state only figures that the committed results hold."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tools import docgen, performance_doc, reliability_doc

#: A measured-looking figure: a number followed by a unit of time, memory, rate or ratio.
FIGURE = re.compile(r"\d[\d,.]*\s?(?:s|ms|GiB|GB|TB/s|tok/s|requests/s|×)(?![\w/])")
#: Document → the tool that renders it (and holds it as a module attribute of that name).
DOCUMENTS = {"PERFORMANCE": performance_doc, "RELIABILITY": reliability_doc}


@pytest.fixture(params=sorted(DOCUMENTS))
def document(request: pytest.FixtureRequest) -> Any:
    return getattr(DOCUMENTS[request.param], request.param)


def test_every_renderer_has_a_block_and_every_block_renders_from_its_files(document: Any) -> None:
    blocks = document.blocks()
    assert set(blocks) == set(document.renderers), "each renderer's block must be in the document, once"
    tool = DOCUMENTS[document.path.stem].__name__
    for name, body in blocks.items():
        assert body == document.render(name), (
            f"block {name} differs from bench/results: run python3 -m {tool}"
        )


def test_no_measured_figure_outside_the_generated_blocks(document: Any) -> None:
    text = docgen.BLOCK.sub("", document.path.read_text(encoding="utf-8"))
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    assert FIGURE.findall(prose) == [], "write measured figures through bench/, not by hand"
