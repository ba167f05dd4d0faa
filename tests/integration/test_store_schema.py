"""The migrations build exactly the schema the models describe, on Postgres and on SQLite: a
column added to a model without its migration (or the reverse) fails here, not in production."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from autorl.store import migrate
from autorl.store.db import MIGRATIONS_DIR
from autorl.store.models import Base
from tests.support.infra import new_run_id, postgres_database


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


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_every_migration_goes_down_and_up_again(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each migration's downgrade undoes its upgrade: down to an empty database, then up again,
    the schema is the models' once more."""
    if backend == "postgres":
        url: str = request.getfixturevalue("fresh_pg_url")  # migrated by the fixture
    else:
        url = f"sqlite:///{tmp_path / 'autorl.db'}"
        migrate(url)
    command.downgrade(_alembic_config(url), "base")
    engine = sa.create_engine(url)
    try:
        assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
        migrate(url)
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    finally:
        engine.dispose()


def _alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    return config


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_existing_submissions_are_numbered_by_experiment_in_the_order_received(
    backend: str, tmp_path: Path
) -> None:
    """Migration 0010 numbers the agents' submissions already stored, per experiment, oldest first
    (by receipt, then id); baselines and sealed finals get none."""
    if backend == "postgres":
        with postgres_database(new_run_id()) as url:
            _number_existing_submissions(url)
    else:
        _number_existing_submissions(f"sqlite:///{tmp_path / 'autorl.db'}")


def _number_existing_submissions(url: str) -> None:
    command.upgrade(_alembic_config(url), "0009_costly_refusals")
    engine = sa.create_engine(url)
    experiment = (
        "INSERT INTO experiments (id, name, task, model, base_model_dir, workspace, output_dir, token_hash,"
        " status, timeout_s, max_submissions, eval_key, eval_config, feedback, costly_refusals, created_at)"
        " VALUES (:id, :name, 'gsm8k', 'm', '/b', '/w', '/w/output', :name, 'running', 60, 100, 'k', '{}',"
        " 'sealed', 0, '2026-01-01 00:00:00')"
    )
    submission = (
        "INSERT INTO submissions (id, experiment_id, is_baseline, final_of, model_path, fingerprint,"
        " eval_key, split, status, attempts, created_at) VALUES (:id, :experiment, :baseline, :final_of,"
        " 'p', 'f', 'k', 'validation', 'queued', 0, :at)"
    )
    # (id, experiment, baseline, final_of, received): interleaved, one received out of id order.
    rows = [
        (1, 1, True, None, "2026-01-01 00:00:01"),
        (2, 1, False, None, "2026-01-01 00:00:02"),
        (3, 2, False, None, "2026-01-01 00:00:03"),
        (4, 1, False, None, "2026-01-01 00:00:09"),
        (5, 2, False, None, "2026-01-01 00:00:04"),
        (6, 1, False, None, "2026-01-01 00:00:05"),
        (7, 1, False, 2, "2026-01-01 00:00:10"),
    ]
    try:
        with engine.begin() as connection:
            for experiment_id in (1, 2):
                connection.execute(sa.text(experiment), {"id": experiment_id, "name": f"e{experiment_id}"})
            for id_, experiment_id, baseline, final_of, at in rows:
                connection.execute(
                    sa.text(submission),
                    {
                        "id": id_,
                        "experiment": experiment_id,
                        "baseline": baseline,
                        "final_of": final_of,
                        "at": at,
                    },
                )
        migrate(url)
        with engine.connect() as connection:
            numbers = dict(connection.execute(sa.text("SELECT id, number FROM submissions")).all())
    finally:
        engine.dispose()
    assert numbers == {1: None, 2: 1, 3: 1, 4: 3, 5: 2, 6: 2, 7: None}


def test_a_services_log_of_its_migrations_names_each_upgrade_and_nothing_of_alembics_plugins(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'autorl.db'}"
    script = (
        "import logging; from autorl.untrusted_text import log_printable_lines; "
        f"from autorl.store import migrate; log_printable_lines(logging.INFO); migrate({url!r})"
    )
    logged = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    assert "Running upgrade 0011_evaluation_cache -> 0012_provenance" in logged, logged
    assert "plugin" not in logged, logged
