"""docs/KUBERNETES.md's Troubleshooting table lists exactly the reasons the platform can write into
an Experiment's status (and the grader's ``waiting``): a new reason without its row, or a row for a
reason that no longer exists, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from autorl.crd import printer_columns
from autorl.wait_reasons import Reason, reason_named

DOC = Path(__file__).resolve().parents[2] / "docs" / "KUBERNETES.md"


def troubleshooting() -> str:
    text = DOC.read_text()
    start = text.index("\n## Troubleshooting\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_reason_has_a_row_saying_what_it_means_and_what_to_do() -> None:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", troubleshooting(), re.M)
    listed = [row[0] for row in rows]
    assert sorted(listed) == sorted(reason.value for reason in Reason)
    assert len(listed) == len(set(listed))
    for _, phase, meaning, action in rows:
        assert phase.strip() and meaning.strip() and action.strip()


def test_the_watch_example_shows_the_crds_printer_columns() -> None:
    """The `kubectl get experiments` example has the columns the CRD declares (the default ones)."""
    text = DOC.read_text()
    header = next(line for line in text.splitlines() if line.startswith("NAME ") and "PHASE" in line)
    shown = re.split(r"\s{2,}", header.strip())[1:]
    declared = [c["name"].upper() for c in printer_columns() if not c.get("priority")]
    assert shown == declared


def test_a_reason_this_version_does_not_know_reads_as_the_default() -> None:
    assert reason_named("EvaluatorsUnavailable", Reason.EVALUATING_BASELINE) is Reason.EVALUATORS_UNAVAILABLE
    assert reason_named("SomethingNewer", Reason.EVALUATING_BASELINE) is Reason.EVALUATING_BASELINE
