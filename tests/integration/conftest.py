"""Fixtures shared by the integration tests."""

from collections.abc import Iterator

import pytest

from autorl.store import Database

# A grader on real Postgres, served in-process: `settings` and `client`.
from tests.integration.test_grader_api import client, settings  # noqa: F401


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    """The test run's store, as the grader and the workers reach it."""
    database = Database(pg_url)
    yield database
    database.dispose()
