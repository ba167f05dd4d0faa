"""What the repository's documents say, as a test reads it to check it against the code."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def document(name: str) -> str:
    """A document's text (``docs/AGENTS.md``), its line breaks and runs of spaces as single spaces."""
    return " ".join((REPO / name).read_text(encoding="utf-8").split())


def claim(pattern: str, name: str) -> re.Match[str]:
    """Where the document states what a test checks; a document that no longer does fails the test."""
    found = re.search(pattern, document(name))
    assert found is not None, f"{name} no longer states what this test checks: /{pattern}/"
    return found
