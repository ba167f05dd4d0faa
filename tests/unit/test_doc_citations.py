"""Code that cites a document cites one of this repository's, by a section it has: a reader who
follows `docs/AGENTS.md, "The grading API"` finds that heading."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: `docs/NAME.md` optionally followed by `, "Section"` (the section as its heading spells it).
CITATION = re.compile(r'(docs/[A-Za-z_]+\.md)(?:, "([^"]+)")?')
SOURCES = ("autorl", "services", "bench", "charts", "docker", "Makefile")


def tracked_sources() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--", *SOURCES], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO_ROOT / name for name in names if (REPO_ROOT / name).is_file()]


def headings(document: Path) -> set[str]:
    """The document's headings as citations spell them: no step number, no code quotes."""
    return {
        re.sub(r"^\d+\.\s*", "", line.lstrip("#").strip()).replace("`", "")
        for line in document.read_text().splitlines()
        if line.startswith("#")
    }


def test_every_cited_document_and_section_exists() -> None:
    citations = []
    broken = []
    for source in tracked_sources():
        text = source.read_text(errors="replace")
        for document, section in CITATION.findall(text):
            citations.append((source, document, section))
            path = REPO_ROOT / document
            if not path.is_file():
                broken.append(f"{source.relative_to(REPO_ROOT)}: {document} does not exist")
            elif section and not any(h.startswith(section) for h in headings(path)):
                broken.append(f'{source.relative_to(REPO_ROOT)}: {document} has no section "{section}"')
    assert len(citations) > 20  # the code does cite its documents
    assert not broken, "\n".join(broken)


def test_no_source_cites_a_document_outside_the_repository() -> None:
    outside = [
        str(source.relative_to(REPO_ROOT))
        for source in tracked_sources()
        if "DESIGN.md" in source.read_text(errors="replace")
    ]
    assert not outside, outside
