"""Real infrastructure for tests: a Postgres database and a Redis DB index of this run's own, and a
grader served over real HTTP. The shared servers are never stopped, flushed or restarted."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from redis import Redis

PG_ADMIN_DSN = os.environ.get("AUTORL_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
PG_URL_BASE = os.environ.get("AUTORL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS_BASE = os.environ.get("AUTORL_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_CLAIM_TTL_S = 4 * 3600


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


@contextlib.contextmanager
def postgres_database(run_id: str) -> Iterator[str]:
    """CREATE a database for this run, yield its SQLAlchemy URL, DROP it afterwards."""
    name = f"autorl_test_{run_id}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_URL_BASE}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def redis_db_index(run_id: str) -> Iterator[str]:
    """Claim a Redis DB index (1–15) no other run holds, by a claim key with a TTL in that index;
    yield its URL; delete only this run's keys afterwards."""
    for index in range(1, 16):
        client = Redis.from_url(f"{REDIS_BASE}/{index}")
        if client.set("autorl-test-claim", run_id, nx=True, ex=REDIS_CLAIM_TTL_S):
            break
        client.close()
    else:
        raise RuntimeError("every Redis DB index 1-15 is claimed by another test run; wait and retry")
    try:
        yield f"{REDIS_BASE}/{index}"
    finally:
        for key in client.scan_iter(match=f"*{run_id}*"):
            client.delete(key)
        if client.get("autorl-test-claim") == run_id.encode():
            client.delete("autorl-test-claim")
        client.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServedApp:
    url: str
    server: object
    thread: threading.Thread


@contextlib.contextmanager
def serve(app: object, *, port: int | None = None) -> Iterator[ServedApp]:
    """Run an ASGI app with uvicorn in a thread on a free port; stop it afterwards."""
    import uvicorn

    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield ServedApp(url=f"http://127.0.0.1:{port}", server=server, thread=thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
