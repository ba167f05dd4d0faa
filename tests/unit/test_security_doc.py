"""docs/SECURITY.md names, for each class of attack, the tests that prove the defence: every test
it names must exist, so the table cannot point at a test that was renamed or removed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "SECURITY.md"
#: `tests/x/test_y.py`, `test_y.py::test_name` and `::test_name` (another test of the last file).
REFERENCE = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)(?:::(test_\w+))?`|`::(test_\w+)`")


def references() -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    current = ""
    for match in REFERENCE.finditer(DOC.read_text(encoding="utf-8")):
        if match.group(1):
            current = match.group(1)
            found.append((current, match.group(2)))
        else:
            found.append((current, match.group(3)))
    return found


def test_every_test_the_threat_model_names_exists() -> None:
    # A path names its file; a bare file name, any file so named (unit and integration tests may share one).
    files = sorted((REPO / "tests").rglob("test_*.py"))
    refs = references()
    assert len(refs) > 40
    missing = []
    for file_name, test_name in refs:
        named = [p for p in files if p.name == Path(file_name).name and p.as_posix().endswith(file_name)]
        if not named or (
            test_name and not any(re.search(rf"def {test_name}\b", p.read_text()) for p in named)
        ):
            missing.append(f"{file_name}::{test_name}")
    assert not missing, f"docs/SECURITY.md names tests that do not exist: {missing}"


def test_every_row_names_a_defence_and_a_test() -> None:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| **")]
    assert len(rows) >= 15
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells), row
        assert REFERENCE.search(cells[3]), row
