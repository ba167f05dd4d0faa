"""Reads never hold the write lock (Database.read_session): on SQLite a write transaction completes
while a long read is open, on Postgres a read is a READ ONLY transaction; a write in a read session
is refused on both. And the agent API's blocking work runs on threads of its own: with every one of
them taken, the admin API is still served (autorl_grader.thread_pools)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from autorl.store import Database
from autorl_grader.main import create_app
from autorl_grader.state import GraderState
from tests.support.grading import make_workspace, register
from tests.support.infra import serve
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

#: How long the read stays open; a write that waited for it would take at least this long.
READ_HELD_S = 3.0


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    url = (
        f"sqlite:///{tmp_path / 'autorl.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    database = Database(url)
    with database.session() as session:
        session.execute(text("CREATE TABLE IF NOT EXISTS tenants_apart (n integer)"))
        session.execute(text("DELETE FROM tenants_apart"))
    yield database
    database.dispose()


def test_a_write_completes_while_a_long_read_is_open(db: Database) -> None:
    reading, done = threading.Event(), threading.Event()

    def long_read() -> None:
        with db.read_session() as session:
            session.execute(text("SELECT count(*) FROM tenants_apart")).scalar_one()
            reading.set()
            done.wait(READ_HELD_S)

    reader = threading.Thread(target=long_read)
    reader.start()
    try:
        assert reading.wait(10)
        started = time.monotonic()
        with db.session() as session:
            session.execute(text("INSERT INTO tenants_apart VALUES (1)"))
        took = time.monotonic() - started
        assert reader.is_alive()  # the read was still open when the write committed
    finally:
        done.set()
        reader.join()
    assert took < READ_HELD_S / 3, took
    with db.read_session() as session:
        assert session.execute(text("SELECT count(*) FROM tenants_apart")).scalar_one() == 1


def test_a_write_in_a_read_session_is_refused(db: Database) -> None:
    with pytest.raises(Exception, match=r"read-only|readonly"), db.read_session() as session:
        session.execute(text("INSERT INTO tenants_apart VALUES (2)"))
    with db.session() as session:  # the connection it used writes again in a write session
        session.execute(text("INSERT INTO tenants_apart VALUES (3)"))
        assert session.execute(text("SELECT count(*) FROM tenants_apart")).scalar_one() == 1


def test_the_admin_api_is_served_while_every_agent_thread_is_taken(
    make_settings: Callable[..., DeploymentSettings], pg_url: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    """Two agent threads and two admin threads: two agent reads held up in the database take every
    agent thread (a shared pool of two would be full); a third agent request waits for a thread,
    and the probe, on the admin threads, answers at once."""
    settings = make_settings(database_url=pg_url, agent_threads=2, admin_threads=2)
    app = create_app(settings, reconcile=False)
    state: GraderState = app.state.grader
    with TestClient(app) as client:
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path))
    locker = Database(pg_url)
    with serve(app) as served, locker.engine.connect() as lock:
        lock.execute(text("LOCK TABLE submissions IN ACCESS EXCLUSIVE MODE"))  # agents' reads wait
        statuses: list[int] = []

        def agent_request(path: str) -> None:
            statuses.append(httpx.get(f"{served.url}{experiment.url_path}{path}", timeout=60).status_code)

        held = [threading.Thread(target=agent_request, args=("/scores",)) for _ in range(2)]
        for thread in held:
            thread.start()
        wait_for(lambda: state.agent_threads.borrowed_tokens == 2, "both readers in the pool", 10, 0.05)
        third = threading.Thread(target=agent_request, args=("/submissions/1",))
        third.start()
        started = time.monotonic()
        assert httpx.get(f"{served.url}/readyz", timeout=30).status_code == 200
        assert time.monotonic() - started < 2.0
        assert not statuses  # the agents' requests are all still waiting
        lock.rollback()
        for thread in [*held, third]:
            thread.join()
    locker.dispose()
    assert sorted(statuses) == [200, 200, 404]
