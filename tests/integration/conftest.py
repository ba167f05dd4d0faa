"""Fixtures shared by the integration tests."""

# A grader on real Postgres, served in-process: `settings` and `client`.
from tests.integration.test_grader_api import client, settings  # noqa: F401
