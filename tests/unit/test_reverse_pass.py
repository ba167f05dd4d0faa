"""`make test`'s reverse pass runs what order can break: a test sharing a database, Redis or a
running service with other tests runs again in reverse, and so does every unit test; a slow,
integration or end-to-end test whose shared fixtures are only read-only artifacts (a finished run's
outputs), or that has no fixture wider than itself, is marked ``order_independent`` and left out."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT

HOSTILE = "tests/e2e/test_sandbox_hostile.py"  # slow; one module-wide run, only read
OPENCOMPASS = "tests/integration/test_opencompass_backend.py"  # slow; a worker on Postgres and Redis


def collected(*arguments: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_reverse_pass_keeps_slow_tests_that_share_state_and_leaves_out_those_that_only_read() -> None:
    everything = collected(HOSTILE, OPENCOMPASS)
    reverse = collected("-m", "not containers and not order_independent", HOSTILE, OPENCOMPASS)
    assert any("test_a_timed_out_evaluation" in test for test in reverse)  # a worker on Redis and Postgres
    assert not [test for test in reverse if test.startswith(HOSTILE)]
    assert len([test for test in everything if test.startswith(HOSTILE)]) > 5
    assert sorted(reverse) == sorted(test for test in everything if test.startswith(OPENCOMPASS))


def test_the_reverse_pass_keeps_fast_tests_that_share_state_and_every_unit_test() -> None:
    reverse = ("-m", "not containers and not order_independent")
    shared = "tests/integration/test_grader_api.py"  # one database per module
    kept = collected(*reverse, shared)
    assert any("test_submission_limit_is_429" in test for test in kept), kept[:5]
    unit = "tests/unit/test_uncertainty.py"
    assert collected(unit) == collected(*reverse, unit) != []


def test_the_reverse_pass_leaves_out_integration_tests_that_share_nothing() -> None:
    alone = "tests/integration/test_chart.py"  # each test renders the chart it checks
    assert collected(alone) != [] and collected("-m", "not containers and not order_independent", alone) == []
