"""Shared fixtures. Each test module gets its own Postgres database and Redis DB index."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autorl.settings import Settings
from tests.support.infra import new_run_id, postgres_database, redis_db_index

pytest_plugins = ["tests.support.fixtures"]

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_DATA = REPO_ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def run_id() -> str:
    """One id per test module: each module gets a database and a Redis DB index of its own, so
    modules pass in any order and in parallel (no rows or jobs left by another module)."""
    return new_run_id()


@pytest.fixture(scope="module")
def pg_url(run_id: str) -> Iterator[str]:
    with postgres_database(run_id) as url:
        from autorl.store import migrate

        migrate(url)
        yield url


@pytest.fixture(scope="module")
def redis_url(run_id: str) -> Iterator[str]:
    with redis_db_index(run_id) as url:
        yield url


@pytest.fixture
def make_settings(tmp_path: Path, run_id: str) -> Callable[..., Settings]:
    """Settings isolated in a temporary home; pass database_url/redis_url to use the real servers."""

    def build(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "home": tmp_path / "home",
            "admin_token": secrets.token_hex(16),
            "redis_key_prefix": f"autorl-test-{run_id}",
            "data_source_dir": FIXTURE_DATA,
            "eval_device": "cpu",
            "submit_wait_s": 120.0,
        }
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    return build


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The untrained `builtin:tiny-qwen2`, built once per test run."""
    from autorl.checkpoints import resolve_model

    return resolve_model("builtin:tiny-qwen2", tmp_path_factory.mktemp("models"))
