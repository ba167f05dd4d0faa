"""`make test`'s reverse pass runs what order can break: a test sharing a database, Redis or a
running service with other tests runs again in reverse, and so does every quick unit test; a slow,
integration or end-to-end test whose shared fixtures are only read-only artifacts (a finished run's
outputs), or that has no fixture wider than itself, is marked ``order_independent`` and left out
(so are this module's tests that run pytest in a child process). The run's Redis is shared by key
prefix: a test with a prefix of its own shares nothing there."""

from __future__ import annotations

import functools
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT, shares_state

HOSTILE = "tests/e2e/test_sandbox_hostile.py"  # slow; one module-wide run, only read
OPENCOMPASS = "tests/integration/test_opencompass_backend.py"  # slow; a finished worker run, only read
#: Slow; one platform (grader, database) per module, each module's tests sharing it.
OPERATOR = ("tests/e2e/test_operator.py", "tests/e2e/test_operator_budget.py")
OWN_QUEUE = "tests/e2e/test_submission_e2e.py"  # slow; the run's Redis under a prefix of its own
SHARED = "tests/integration/test_grader_api.py"  # one database per module
UNIT = "tests/unit/test_uncertainty.py"
ALONE = "tests/integration/test_chart.py"  # each test renders the chart it checks
REVERSE = ("-m", "not containers and not order_independent")


@functools.cache
def collected(reverse: bool) -> tuple[str, ...]:
    """The test ids pytest collects from this file's modules: all of them, or the reverse pass's."""
    modules = (HOSTILE, OPENCOMPASS, *OPERATOR, OWN_QUEUE, SHARED, UNIT, ALONE)
    selection = (*REVERSE, *modules) if reverse else modules
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return tuple(line for line in done.stdout.splitlines() if "::" in line)


def of(tests: tuple[str, ...], *modules: str) -> list[str]:
    """The ids of ``tests`` in ``modules``."""
    return [test for test in tests if test.split("::")[0] in modules]


@pytest.mark.slow
def test_the_reverse_pass_keeps_slow_tests_that_share_state_and_leaves_out_those_that_only_read() -> None:
    modules = (HOSTILE, OPENCOMPASS, *OPERATOR, OWN_QUEUE)
    everything, reverse = of(collected(reverse=False), *modules), of(collected(reverse=True), *modules)
    for module in (HOSTILE, OPENCOMPASS):
        assert len([test for test in everything if test.startswith(module)]) >= 5
    assert any(test.startswith(OWN_QUEUE) for test in everything)
    assert sorted(reverse) == sorted(test for test in everything if test.startswith(OPERATOR)) != []
    for module in OPERATOR:
        assert any(test.startswith(f"{module}::") for test in reverse), module


def fixture(scope: str, *argnames: str) -> SimpleNamespace:
    return SimpleNamespace(scope=scope, argnames=argnames)


def item(asks: list[str], definitions: dict[str, SimpleNamespace]) -> SimpleNamespace:
    """What pytest knows of a test's fixtures: those it asks for, and every definition they reach."""
    reached, waiting = set(), list(asks)
    while waiting:
        name = waiting.pop()
        if name not in reached:
            reached.add(name)
            waiting.extend(definitions[name].argnames)
    info = SimpleNamespace(initialnames=tuple(asks), name2fixturedefs={n: [definitions[n]] for n in reached})
    return SimpleNamespace(_fixtureinfo=info, fixturenames=sorted(reached))


def test_state_is_shared_through_function_fixtures_and_not_through_a_finished_artifact() -> None:
    definitions = {
        "pg_url": fixture("module", "run_id"),
        "run_id": fixture("module"),
        "redis_url": fixture("session"),
        "fresh_queue_prefix": fixture("function", "run_id"),
        "settings": fixture("function", "pg_url"),  # a function fixture over the module's database
        "make_settings": fixture("function", "run_id"),
        "worker_run": fixture("module", "redis_url", "pg_url"),  # a finished run, only read
        "grader": fixture("module", "pg_url"),
    }
    assert shares_state(item(["settings"], definitions))
    assert shares_state(item(["grader"], definitions))
    assert not shares_state(item(["worker_run"], definitions))
    assert not shares_state(item(["make_settings"], definitions))
    # Redis: shared unless the test works under a prefix of its own.
    assert shares_state(item(["make_settings", "redis_url"], definitions))
    assert not shares_state(item(["make_settings", "redis_url", "fresh_queue_prefix"], definitions))


@pytest.mark.slow
def test_the_reverse_pass_keeps_fast_tests_that_share_state_and_every_unit_test() -> None:
    kept = of(collected(reverse=True), SHARED)
    assert any("test_submission_limit_is_429" in test for test in kept), kept[:5]
    assert of(collected(reverse=False), UNIT) == of(collected(reverse=True), UNIT) != []


@pytest.mark.slow
def test_the_reverse_pass_leaves_out_integration_tests_that_share_nothing() -> None:
    assert of(collected(reverse=False), ALONE) != [] and of(collected(reverse=True), ALONE) == []
