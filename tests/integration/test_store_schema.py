"""The migrations build exactly the schema the models describe, on Postgres and on SQLite: a
column added to a model without its migration (or the reverse) fails here, not in production."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from autorl.store import migrate
from autorl.store.models import Base


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrations_match_the_models(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if backend == "postgres":
        url: str = request.getfixturevalue("fresh_pg_url")  # migrated by the fixture
    else:
        url = f"sqlite:///{tmp_path / 'autorl.db'}"
        migrate(url)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    finally:
        engine.dispose()
