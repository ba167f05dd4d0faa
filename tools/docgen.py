"""Documents whose figures are generated from committed results files.

A document marks each generated part with ``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->``; a
:class:`Document` pairs the file with one renderer per block name, each reading its figures from
``bench/results/``. ``update`` rewrites the blocks in place; the documents' tests compare every
block with its renderer, so a document cannot drift from the files it cites. A new section is a
results file, a renderer added to the document's table, and the block in the document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)


def load_results(name: str) -> dict[str, Any]:
    """``bench/results/NAME.json`` (NAME may hold a folder: ``faults/worker_killed``)."""
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def number(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if digits else f"{round(value):,}"


def blocks(text: str) -> dict[str, str]:
    """The generated blocks of a document, by name."""
    return {match["name"]: match["body"] for match in BLOCK.finditer(text)}


@dataclass(frozen=True)
class Document:
    path: Path
    renderers: Mapping[str, Callable[[], str]]

    def render(self, name: str) -> str:
        return self.renderers[name]()

    def blocks(self) -> dict[str, str]:
        return blocks(self.path.read_text(encoding="utf-8"))

    def update(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        rendered = BLOCK.sub(lambda m: m.group(1) + self.render(m["name"]) + m.group(4), text)
        self.path.write_text(rendered, encoding="utf-8")

    def main(self) -> None:
        """``python3 -m tools.NAME``: rewrite the blocks and say which document."""
        self.update()
        print(f"updated {self.path.relative_to(REPO_ROOT)}")
