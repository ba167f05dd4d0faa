"""Fault tests record what they injected and what they saw in ``bench/results/faults/NAME.json``,
from which docs/RELIABILITY.md's table is rendered (tools/reliability_doc.py). Only a run with
``AUTORL_RECORD_RESULTS=1`` (``make reliability``) writes them, and only a test that passed."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

FAULT_RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "faults"
RECORD_VARIABLE = "AUTORL_RECORD_RESULTS"


def record_fault(
    request: pytest.FixtureRequest,
    *,
    fault: str,
    injected: str,
    cases: int,
    outcome: str,
    observed: dict[str, Any],
) -> None:
    """Call after the test's assertions: what is recorded has been checked."""
    if os.environ.get(RECORD_VARIABLE) != "1":
        return
    name = request.node.name
    record = {
        "fault": fault,
        "injected": injected,
        "cases": cases,
        "outcome": outcome,
        "observed": observed,
        "passed": True,
        "test": request.node.nodeid,
        "recorded": datetime.now(UTC).date().isoformat(),
    }
    FAULT_RESULTS.mkdir(parents=True, exist_ok=True)
    (FAULT_RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
