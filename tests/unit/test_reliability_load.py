"""The Fuzzing, Load and Soak sections render from the committed results files, and say what
those files hold (tools/reliability_tables.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from autorl.store.db import SQLITE_POOL_OVERFLOW, SQLITE_POOL_SIZE
from tools import reliability_tables

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "bench" / "results"


def _sections() -> ModuleType:
    return reliability_tables


def _results(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def test_the_fuzzing_section_states_the_recorded_cases_and_outcome() -> None:
    fuzz = _results("grader_fuzz")
    text = _sections().fuzzing_table()
    assert f"| {fuzz['cases']} |" in text
    assert f"{fuzz['server_errors']} server errors" in text
    assert ("**passed**" in text) == (fuzz["server_errors"] == 0 and not fuzz["failed_operations"])


def test_the_load_section_states_each_measured_version() -> None:
    # The throughput runs (the fair share's run is PERFORMANCE.md's: tests/unit/test_generated_docs.py).
    runs = {label: run for label, run in _results("grader_load")["runs"].items() if "bare_time" in run}
    assert runs
    text = _sections().load_table()
    for label, run in runs.items():
        assert (
            f"| {label} | time | {run['agents']} | {run['time']['requests_per_s']:,.1f} requests/s |" in text
        )
        assert f"{run['time']['ratio_to_bare']:.2f}×" in text
        assert f"| {label} | {run['waiters']['held']} of {run['waiters']['waiters']} |" in text


def test_the_soak_section_states_every_process_and_the_submissions() -> None:
    soak = _results("soak")
    text = _sections().soak_table()
    for name in ("`autorl run`", "`autorl grader`", "`autorl worker`", "`soak_agent.py`"):
        assert name in text
    submissions = soak["submissions"]
    assert f"submitted {submissions['submitted']} distinct checkpoints" in text
    assert f"{submissions['scored_once']} were scored exactly once" in text


def test_the_soak_section_states_each_process_database_connections() -> None:
    soak = _results("soak")
    text = _sections().soak_table()
    assert "database connections (max)" in text
    for process in soak["processes"]:
        assert f"| {process['database_connections_max']} |" in text


def test_the_soak_prose_states_the_database_pool_it_tests_against() -> None:
    text = " ".join((REPO_ROOT / "docs" / "RELIABILITY.md").read_text().split())
    capacity = SQLITE_POOL_SIZE + SQLITE_POOL_OVERFLOW
    pool = f"the SQLite pool's {SQLITE_POOL_SIZE} plus {SQLITE_POOL_OVERFLOW}"
    stated = f"at most {capacity} per process, {pool}"
    assert stated in text
