"""The tables of docs/RELIABILITY.md, rendered from the committed results under ``bench/results/``.

Each section is a block of the document (:mod:`docgen`) with a renderer here, reading files that
tests or benchmarks wrote. The faults table reads ``bench/results/faults/*.json``, one file per
fault, written by the fault tests when ``AUTORL_RECORD_RESULTS=1`` (``make reliability``). A new
section: a results file, a renderer in :data:`RENDERERS`, and its block in the document.

    python3 bench/reliability_report.py   # rewrite the document's blocks
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import REPO_ROOT, RESULTS, Document

FAULTS = RESULTS / "faults"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fault_records() -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(FAULTS.glob("*.json"))]


def faults_table() -> str:
    lines = [
        "| fault | injected as | cases | outcome | reproduce |",
        "| --- | --- | ---: | --- | --- |",
    ]
    for record in fault_records():
        verdict = "**passed**" if record["passed"] else "**FAILED**"
        lines.append(
            f"| {_cell(record['fault'])} | {_cell(record['injected'])} | {record['cases']} | "
            f"{verdict}: {_cell(record['outcome'])} | `.venv/bin/python -m pytest {record['test']}` |"
        )
    recorded = sorted({record["recorded"] for record in fault_records()})
    dates = ", ".join(recorded) if recorded else "never"
    return "\n".join(lines) + f"\n\nRecorded: {dates}.\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "faults": faults_table,
}

RELIABILITY = Document(REPO_ROOT / "docs" / "RELIABILITY.md", RENDERERS)


if __name__ == "__main__":
    RELIABILITY.update()
    print(f"updated {RELIABILITY.path.relative_to(REPO_ROOT)}")
