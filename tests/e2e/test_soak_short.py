"""The soak benchmark in short (bench/soak.py; the 20-minute figure is in docs/RELIABILITY.md):
``autorl run`` with an agent submitting new checkpoints back to back leaves no descriptor behind in
any of its processes, and scores every submission exactly once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from autorl.store.db import SQLITE_POOL_OVERFLOW, SQLITE_POOL_SIZE

REPO_ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 45.0
#: Sockets of a request in flight at the moment of a sample (the grader's to an agent or worker).
IN_FLIGHT_FDS = 2


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_soak", REPO_ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_short_soak_leaks_no_descriptor_and_scores_every_submission_once(tmp_path: Path) -> None:
    soak = _soak()
    result = soak.run_soak(DURATION_S, interval_s=1.0, sample_s=1.0, workdir=tmp_path)
    assert result["exit_code"] == 0
    names = " ".join(process["command"] for process in result["processes"])
    for part in ("autorl run", "autorl grader", "autorl worker", "soak_agent.py"):
        assert part in names, f"{part} was not sampled through the agent's phase"
    for process in result["processes"]:
        # Descriptors of requests in flight come and go; leaked ones stay through the last third.
        assert process["fds_min_last_third"] <= process["fds_start"] + IN_FLIGHT_FDS, process
        # The database's files are the connection pool's: a peak of requests may add connections
        # the pool keeps, but never more than it holds.
        assert process["database_connections_max"] <= SQLITE_POOL_SIZE + SQLITE_POOL_OVERFLOW, process
    submissions = result["submissions"]
    assert submissions["submitted"] >= 1
    assert soak.every_submission_scored_once(submissions), submissions
