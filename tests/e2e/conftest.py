"""Fixtures shared by the end-to-end tests."""

from tests.e2e.test_local_run import autorl_run  # noqa: F401  (a fixture: `autorl run` as a user runs it)
