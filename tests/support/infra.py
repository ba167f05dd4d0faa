"""Real infrastructure for tests: a Postgres database and a Redis server of this run's own, and a
grader served over real HTTP. The shared servers are never stopped, flushed or restarted."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from redis import Redis
from redis.exceptions import RedisError

from tests.support.waiting import wait_for

PG_ADMIN_DSN = os.environ.get("AUTORL_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
#: With a password, as the grader and worker demand outside local mode (trust authentication ignores it).
PG_URL_BASE = os.environ.get("AUTORL_TEST_PG_URL", "postgresql+psycopg://postgres:autorl-test@127.0.0.1:5432")
REDIS_SERVER = os.environ.get("AUTORL_TEST_REDIS_SERVER", "redis-server")


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


class RedisServer:
    """A Redis of this run's own that requires a password (as the platform does outside local mode)
    and keeps nothing on disk, so a restart comes back empty, as a Redis that lost its data. The
    configuration comes on stdin, so the password never shows in the process list."""

    def __init__(self, run_id: str, workdir: Path) -> None:
        self.run_id = run_id
        self.workdir = workdir
        self.password = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = (
            f'port {self.port}\nbind 127.0.0.1\nrequirepass {self.password}\nsave ""\nappendonly no\n'
            f"dir {self.workdir}\nlogfile {self.workdir / 'redis.log'}\n"
        )
        server = subprocess.Popen([REDIS_SERVER, "-"], stdin=subprocess.PIPE)
        assert server.stdin is not None
        server.stdin.write(config.encode())
        server.stdin.close()
        self.process = server
        client = Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except RedisError:
                return False

        try:
            wait_for(
                answers,
                f"the test Redis ({REDIS_SERVER}, run {self.run_id}) to start",
                30,
                0.05,
                alive=lambda: server.poll() is None,
            )
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing saved."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process, timeout_s=10)
        self.process = None


@contextlib.contextmanager
def private_redis(run_id: str, workdir: Path) -> Iterator[str]:
    """Start a Redis of this run's own (:class:`RedisServer`); yield its URL; stop it afterwards.
    The shared Redis of the machine is never touched."""
    server = RedisServer(run_id, workdir)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def stop_process(process: subprocess.Popen[Any], *, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def healthy(url: str) -> bool:
    """Whether the service at ``url`` answers ``/healthz`` with 200 (no answer yet: not)."""
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def grader_process(
    command: list[str], env: dict[str, str], urls: list[str]
) -> Iterator[subprocess.Popen[str]]:
    """Run `autorl grader ...` as a real process until each of ``urls`` answers ``/healthz``; stop
    it afterwards. Its output is the failure message when it exits before that."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all(healthy(url) for url in urls):
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "the grader did not start"
            time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


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
    wait_for(lambda: server.started, "the test server to start", 30, 0.05, alive=thread.is_alive)
    try:
        yield ServedApp(url=f"http://127.0.0.1:{port}", server=server, thread=thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
