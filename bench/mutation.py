"""Mutation testing of the checks that guard scores: ``make mutation`` (not part of ``make test``).

Runs mutmut (configured in pyproject.toml's ``[tool.mutmut]``: the modules to mutate and the fast
unit tests that cover them), then writes ``bench/results/mutation.json``: the tool and version,
the modules and tests, the count of mutants per outcome and every surviving mutant with the line
it changed. ``python3 bench/report.py`` renders that file into docs/RELIABILITY.md.

    python3 bench/mutation.py            # run mutmut, then write the results
    python3 bench/mutation.py --collect  # only write the results of the last run (mutants/)
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tomllib
from collections import Counter
from importlib.metadata import version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "mutation.json"
MUTMUT = [sys.executable, "-m", "mutmut"]


def _mutmut(*args: str) -> str:
    done = subprocess.run([*MUTMUT, *args], cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def parse_results(text: str) -> dict[str, str]:
    """``mutmut results --all true`` lines (``    name: status``) as name → status."""
    outcomes = {}
    for line in text.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            outcomes[name] = status.strip()
    return outcomes


def changed_line(diff: str) -> str:
    """The mutated line of a ``mutmut show`` diff (its first added line)."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def collect() -> dict[str, object]:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    outcomes = parse_results(_mutmut("results", "--all", "true"))
    if not outcomes:
        raise SystemExit("no mutants found: run `make mutation` first")
    survivors = sorted(name for name, status in outcomes.items() if status == "survived")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tool": f"mutmut {version('mutmut')}",
        "modules": config["source_paths"],
        "tests": config["pytest_add_cli_args_test_selection"],
        "outcomes": dict(sorted(Counter(outcomes.values()).items())),
        "mutants": len(outcomes),
        "survivors": [{"mutant": name, "change": changed_line(_mutmut("show", name))} for name in survivors],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collect", action="store_true", help="only collect the last run's results")
    args = parser.parse_args()
    if not args.collect:
        subprocess.run([*MUTMUT, "run"], cwd=REPO_ROOT, check=False)
    RESULTS.write_text(json.dumps(collect(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
