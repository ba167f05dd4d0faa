"""docs/ARCHITECTURE.md is the map: a section per package of the repository's distributions (and
tools/), and every module named in its package's section, once. A module added without a line
there, or a line left for a module that moved, fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ARCHITECTURE.md"
SECTION = re.compile(r"^### `(?P<package>[\w./-]+)/`\n(?P<body>.*?)(?=^##)", re.M | re.S)
ROW = re.compile(r"^\| `(?P<module>[\w]+\.py)` \| (?P<holds>[^|]*\S[^|]*) \|$", re.M)


def packages() -> dict[str, set[str]]:
    """Package folder (relative to the repository) → its modules; an ``__init__.py`` counts as a
    module when it holds something (a docstring or code)."""
    roots = [REPO / "autorl", *sorted((REPO / "services").glob("*/autorl_*")), REPO / "tools"]
    found: dict[str, set[str]] = {}
    for root in roots:
        for path in root.rglob("*.py"):
            relative = path.relative_to(REPO)
            if "migrations" in relative.parts:
                continue
            modules = found.setdefault(relative.parent.as_posix(), set())
            if path.name != "__init__.py" or path.read_text().strip():
                modules.add(path.name)
    return found


def sections() -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8") + "\n##"
    return {m["package"]: [row["module"] for row in ROW.finditer(m["body"])] for m in SECTION.finditer(text)}


def test_every_package_has_its_section_and_no_section_is_left_over() -> None:
    documented = sections()
    assert sorted(set(packages()) - set(documented)) == [], "add a section (### `path/`) for these packages"
    assert sorted(set(documented) - set(packages())) == [], "these sections name packages that are gone"


def test_every_module_is_named_once_in_its_packages_section() -> None:
    documented = sections()
    problems = []
    for package, modules in sorted(packages().items()):
        rows = documented.get(package, [])
        problems += [f"{package}/{name}: not in its section" for name in sorted(modules - set(rows))]
        problems += [f"{package}/{name}: no such module" for name in sorted(set(rows) - modules)]
        problems += [
            f"{package}/{name}: named twice" for name in sorted({n for n in rows if rows.count(n) > 1})
        ]
    assert problems == []


def test_a_row_needs_the_module_and_what_it_holds() -> None:
    """The parser sees what a reader sees: a row needs the module and what it holds."""
    text = (
        "### `pkg/`\n\nOwns x.\n\n| module | holds |\n| --- | --- |\n| `a.py` | the a |\n| `b.py` |  |\n\n##"
    )
    found = {m["package"]: [r["module"] for r in ROW.finditer(m["body"])] for m in SECTION.finditer(text)}
    assert found == {"pkg": ["a.py"]}
