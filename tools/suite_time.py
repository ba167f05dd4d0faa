"""Times ``make test`` as CI runs it: ``bash .ci/run`` in a fresh clone of this repository's HEAD, on
this machine. Records how long each phase took (set-up, the images, lint, the suite's two passes),
what each pass ran and its slowest tests, in ``bench/results/suite_time.json``; docs/RELIABILITY.md,
"Suite time", is generated from it (``tools/reliability_doc.py``).

    .venv/bin/python -m tools.suite_time [--clone-dir DIR] [--log FILE]

Commit first: the clone holds what HEAD holds, nothing uncommitted. The phases are read from the
recipe lines make prints before running them, so they follow the Makefile as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "suite_time.json"

#: A phase begins where make prints the first recipe line matching its pattern (set-up begins at once).
PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("images", re.compile(r"docker/build-images\.sh")),
    ("lint", re.compile(r"^\S*ruff check ")),
    ("suite", re.compile(r"-m pytest -n 2(?!.*--reverse)")),
    ("suite_reverse", re.compile(r"-m pytest -n 2 .*--reverse")),
]
SUMMARY = re.compile(r"^=+ (?P<counts>.*\d+ (passed|failed|error).*) in (?P<seconds>[\d.]+)s")
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<when>call|setup|teardown)\s+(?P<test>\S+)")


def phase_times(events: list[tuple[str, float]], end: float) -> list[dict[str, Any]]:
    """Each phase's seconds: from its first line to the next phase's (the last to ``end``)."""
    bounds = [*events, ("", end)]
    return [
        {"name": name, "seconds": round(bounds[index + 1][1] - started, 1)}
        for index, (name, started) in enumerate(events)
    ]


def read_passes(lines: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per pass (in the order they ran): pytest's summary line and its slowest tests."""
    passes: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in lines:
        for name, pattern in PHASES:
            if name.startswith("suite") and pattern.search(line):
                current = passes.setdefault(name, {"summary": None, "seconds": None, "slowest": []})
        if current is None:
            continue
        duration = DURATION.match(line)
        if duration:
            current["slowest"].append(
                {"seconds": float(duration["seconds"]), "when": duration["when"], "test": duration["test"]}
            )
        summary = SUMMARY.match(line)
        if summary:
            current["summary"] = summary["counts"]
            current["seconds"] = float(summary["seconds"])
    return passes


def run(clone_dir: Path, log: Path) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone_dir)], check=True)
    subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone_dir, check=True)
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    events: list[tuple[str, float]] = [("setup", 0.0)]
    lines: list[str] = []
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(
            ["bash", ".ci/run"],
            cwd=clone_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert process.stdout is not None
        for line in process.stdout:
            out.write(line)
            out.flush()
            lines.append(line.rstrip("\n"))
            seen = {name for name, _ in events}
            for name, pattern in PHASES:
                if name not in seen and pattern.search(line):
                    events.append((name, time.monotonic() - started))
                    print(f"[{time.monotonic() - started:7.0f} s] {name}", file=sys.stderr, flush=True)
        code = process.wait()
    total = time.monotonic() - started
    return {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": commit,
        "command": "bash .ci/run (make test) in a fresh clone",
        "machine": {"cpus": os.cpu_count(), "load_avg_start": round(load_start, 1)},
        "exit_code": code,
        "total_s": round(total, 1),
        "phases": phase_times(events, total),
        "passes": read_passes(lines),
    }


#: How many earlier runs the results file keeps (their phases and totals, newest first).
EARLIER_KEPT = 5


def earlier_runs() -> list[dict[str, Any]]:
    """The runs recorded before this one, newest first: what a change to the suite's time is read against."""
    if not RESULTS.exists():
        return []
    last = json.loads(RESULTS.read_text(encoding="utf-8"))
    kept = {key: last[key] for key in ("date", "commit", "exit_code", "total_s", "phases")}
    return [kept, *last.get("earlier", [])][:EARLIER_KEPT]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone-dir", type=Path, help="where to clone (default: a new temporary folder)")
    parser.add_argument("--log", type=Path, help="make test's whole output (default: beside the clone)")
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="autorl-fresh-clone-"))
    clone_dir = args.clone_dir or parent / "autorl"
    if clone_dir.exists():
        parser.error(f"--clone-dir {clone_dir} exists: name a folder that does not, so the clone is fresh")
    log = args.log or parent / "make-test.log"
    record = run(clone_dir, log)
    record["earlier"] = earlier_runs()
    RESULTS.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    minutes = record["total_s"] / 60
    print(f"make test: exit {record['exit_code']} after {minutes:.1f} min; log {log}; wrote {RESULTS}")
    return 0 if record["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
