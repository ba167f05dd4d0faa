"""tools/suite_time.py reads make test's output as make prints it: each phase from the recipe line
that starts it, each pass's pytest summary and slowest tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import suite_time

OUTPUT = """\
GPU=0 docker/build-images.sh
built autorl-grader:0.1.0-cpu
.venv/bin/ruff check autorl services tests bench
All checks passed!
CI=1 .venv/bin/python -m pytest -n 2 --durations=25
============================= slowest 25 durations =============================
412.31s call     tests/e2e/test_sandbox_hostile.py::test_the_view
0.52s setup    tests/unit/test_x.py::test_y
================= 1380 passed, 2 warnings in 1790.12s (0:29:50) =================
CI=1 .venv/bin/python -m pytest -n 2 --durations=25 --reverse -m "not containers and not order_independent"
============================= slowest 25 durations =============================
61.00s call     tests/integration/test_a.py::test_b
=========== 2 failed, 1300 passed in 600.50s (0:10:00) ===========
"""


def test_each_pass_has_its_summary_and_slowest_tests() -> None:
    passes = suite_time.read_passes(OUTPUT.splitlines())
    assert list(passes) == ["suite", "suite_reverse"]
    forward, reverse = passes["suite"], passes["suite_reverse"]
    assert forward["summary"] == "1380 passed, 2 warnings" and forward["seconds"] == 1790.12
    assert forward["slowest"][0] == {
        "seconds": 412.31,
        "when": "call",
        "test": "tests/e2e/test_sandbox_hostile.py::test_the_view",
    }
    assert len(forward["slowest"]) == 2
    assert reverse["summary"] == "2 failed, 1300 passed" and reverse["slowest"][0]["seconds"] == 61.0


def test_phases_are_told_apart_by_the_recipe_lines_make_prints() -> None:
    starts = {}
    for number, line in enumerate(OUTPUT.splitlines()):
        for name, pattern in suite_time.PHASES:
            if name not in starts and pattern.search(line):
                starts[name] = number
    assert list(starts) == ["images", "lint", "suite", "suite_reverse"]
    timed = suite_time.phase_times([("setup", 0.0), ("images", 300.0), ("lint", 420.0)], end=500.0)
    assert timed == [
        {"name": "setup", "seconds": 300.0},
        {"name": "images", "seconds": 120.0},
        {"name": "lint", "seconds": 80.0},
    ]


def test_a_new_record_keeps_the_runs_before_it_newest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results file holds the latest run and, under ``earlier``, what it is read against."""
    results = tmp_path / "suite_time.json"
    monkeypatch.setattr(suite_time, "RESULTS", results)
    assert suite_time.earlier_runs() == []
    phases = [{"name": "setup", "seconds": 60.0}]
    older = {"date": "2026-12-01", "commit": "a" * 40, "exit_code": 0, "total_s": 3000.0, "phases": phases}
    for run in range(suite_time.EARLIER_KEPT + 2):
        latest = {**older, "commit": f"{run:040d}", "passes": {"suite": {}}, "machine": {"cpus": 2}}
        latest["earlier"] = suite_time.earlier_runs()
        results.write_text(json.dumps(latest))
    earlier = suite_time.earlier_runs()
    assert [entry["commit"][-1] for entry in earlier] == ["6", "5", "4", "3", "2"]
    assert set(earlier[0]) == {"date", "commit", "exit_code", "total_s", "phases"}  # no passes kept
