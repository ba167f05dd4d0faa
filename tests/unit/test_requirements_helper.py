"""Missing dependencies skip a test with the reason, and fail it when CI is set; no test in the
suite skips any other way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.requirements import MARKER, require

TESTS = Path(__file__).resolve().parents[1]
HELPER = TESTS / "support" / "requirements.py"


def test_a_met_requirement_lets_the_test_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    require(True, "needs nothing")


def test_a_missing_dependency_skips_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs bubblewrap"):
        require(False, "needs bubblewrap")


@pytest.mark.parametrize("value", ["", "0"])
def test_ci_unset_or_zero_still_skips(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception):
        require(False, "needs bubblewrap")


@pytest.mark.parametrize("value", ["1", "true"])
def test_under_ci_a_missing_dependency_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=r"needs bubblewrap \(CI is set"):
        require(False, "needs bubblewrap")


def test_a_requirement_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="reason"):
        require(True, "  ")


def _python_sources() -> list[Path]:
    return [path for path in TESTS.rglob("*.py") if path not in (HELPER, Path(__file__).resolve())]


def test_every_skip_in_the_suite_goes_through_the_helper() -> None:
    """skipif, pytest.skip and importorskip would skip even where CI needs the dependency."""
    forbidden = re.compile(r"mark\.skipif\b|mark\.skip\b|pytest\.skip\(|importorskip\(|\.xfail\b")
    offenders = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in _python_sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert offenders == [], f"use tests.support.requirements (require / mark.{MARKER}) instead"


INNER_CONFTEST = """
import pytest
from tests.support.requirements import apply_requires_markers

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    apply_requires_markers(item)
"""
INNER_TESTS = """
import pytest

@pytest.fixture
def expensive():
    raise AssertionError("fixtures of a test whose dependency is missing must not run")

@pytest.mark.requires(False, reason="needs a thing this machine lacks")
def test_missing(expensive):
    raise AssertionError("the body of a test whose dependency is missing must not run")

@pytest.mark.requires(True, reason="needs nothing")
def test_present():
    pass
"""


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", {"passed": 1, "skipped": 1}), ("1", {"passed": 1, "errors": 1})]
)
def test_the_marker_skips_or_fails_before_fixtures_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: dict[str, int]
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(INNER_TESTS)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    requires: test")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines(["*needs a thing this machine lacks*"])
