"""Runs the test suite in other orders and in parallel, and records what passed and how long it
took in ``bench/results/test_order.json`` (docs/RELIABILITY.md's "Test isolation" table).

Tests must pass in any order and side by side: each module gets a database and a Redis queue of
its own, each test process its own Redis server. ``make test`` runs the reverse, parallel pass.

    .venv/bin/python -m tools.order_record [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "test_order.json"
ISSUE_PAIR = [
    "tests/integration/test_grader_api.py",
    "tests/e2e/test_operator.py",
    "tests/e2e/test_operator_budget.py",
]
#: Name → pytest arguments.
RUNS: dict[str, list[str]] = {
    # The whole suite reversed (`make test`'s second pass runs the part of it order can break).
    "suite_reverse_parallel": ["--reverse", "-n", "2", "-m", "not containers"],
    "pair": ISSUE_PAIR,
    "pair_reverse": [*ISSUE_PAIR, "--reverse"],
}


def run(arguments: list[str]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="autorl-order-") as tmp:
        report = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments]
        started = time.monotonic()
        # CI=1 as under `make test`: a test whose dependency is missing fails rather than skips.
        done = subprocess.run(
            [*command, f"--junitxml={report}", f"--basetemp={tmp}/pt"],
            cwd=REPO_ROOT,
            env={**os.environ, "CI": "1"},
            check=False,
        )
        wall_s = round(time.monotonic() - started, 1)
        suites = ET.parse(report).getroot()
        counts = {key: 0 for key in ("tests", "failures", "errors", "skipped")}
        for suite in suites.iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    return {
        "command": "CI=1 pytest " + shlex.join(arguments),
        "exit_code": done.returncode,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        **{key: counts[key] for key in ("failures", "errors", "skipped")},
        "wall_s": wall_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="runs to do (others are kept)")
    args = parser.parse_args()
    for name, arguments in RUNS.items():
        if args.only is not None and name not in args.only:
            continue
        print(f"== {name}: pytest {' '.join(arguments)}", flush=True)
        record = {**run(arguments), "date": datetime.now(UTC).date().isoformat()}
        # Read just before writing: runs of this script may go side by side.
        data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
        data["runs"][name] = record
        data["machine"] = {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1)}
        RESULTS.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
    return 0 if all(r["exit_code"] == 0 for r in data["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
