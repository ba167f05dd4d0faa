"""Outside the embedded single-machine mode, Redis and Postgres URLs must carry a password."""

from __future__ import annotations

from pathlib import Path

import pytest

from autorl.errors import ConfigurationError
from autorl_evaluator.settings import WorkerSettings


def settings(tmp_path: Path, **values: object) -> WorkerSettings:
    return WorkerSettings(home=tmp_path, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("redis_url", "redis://127.0.0.1:6379/0"),
        ("redis_url", "redis://default@127.0.0.1:6379/0"),
        ("redis_url", "redis://:@127.0.0.1:6379/0"),
        ("redis_url", "rediss://redis.example:6380/1"),
        ("redis_url", "unix:///run/redis.sock?db=0"),
        ("database_url", "postgresql+psycopg://postgres@127.0.0.1:5432/autorl"),
        ("database_url", "postgresql://autorl:@db:5432/autorl"),
        ("database_url", "postgres://db/autorl?sslmode=require"),
    ],
)
def test_a_url_without_a_password_is_refused_naming_the_setting(tmp_path: Path, field: str, url: str) -> None:
    with pytest.raises(ConfigurationError, match=f"AUTORL_{field.upper()} has no password") as refused:
        settings(tmp_path, **{field: url}).require_store_credentials()
    assert "AUTORL_LOCAL_MODE=1" in str(refused.value)
    settings(tmp_path, local_mode=True, **{field: url}).require_store_credentials()


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("redis_url", "redis://:s3cret@127.0.0.1:6379/0"),
        ("redis_url", "rediss://autorl:s3cret@redis.example:6380/1"),
        ("redis_url", "unix:///run/redis.sock?db=0&password=s3cret"),
        ("database_url", "postgresql+psycopg://autorl:s3cret@db:5432/autorl"),
        ("database_url", "postgresql+psycopg://autorl@db:5432/autorl?password=s3cret"),
        ("database_url", None),  # SQLite in the home: a file, guarded by its permissions
    ],
)
def test_a_url_with_a_password_is_accepted(tmp_path: Path, field: str, url: str | None) -> None:
    settings(tmp_path, **{field: url}).require_store_credentials()
