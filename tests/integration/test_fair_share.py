"""Tenants apart on one grader: the real `autorl grader` over real sockets, on SQLite (the
single-machine mode, where the write lock is the database's), with a small fair share so that the
tests are quick (autorl_grader.fair_share, autorl_grader.thread_pools, Database.read_session):

- past its budget an experiment is answered 429 with Retry-After and the budget named, before
  its body is read (a chunked body that never ends is answered all the same, and writes nothing);
- its requests in flight are capped; made-up tokens are held to their address's share;
- while one experiment floods the grader from many connections and a second address, another
  experiment's API, the admin API and a database write each answer within 2 s.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from autorl.store import Database
from tests.support.grading import RegisteredExperiment, make_workspace, register
from tests.support.infra import free_port, grader_process
from tests.support.waiting import wait_for

AUTORL = str(Path(sys.executable).parent / "autorl")
#: A slow refill: a refusal is answered after a pause of up to 1 s, in which the bucket refills
#: a fifth of a request, so that requests a test sends after one are refused too.
RATE, BURST, IN_FLIGHT = 0.2, 5, 2
BUDGET = f"{RATE:g} requests per second (bursts of {BURST}) and {IN_FLIGHT} requests at once"
#: The most another tenant's request, the admin API or a write may take during a flood.
SERVED_WITHIN_S = 2.0


@dataclass
class Operator:
    admin_token_value: str  # what tests.support.grading.register reads


@dataclass
class Tenants:
    port: int
    admin_token: str
    database_url: str
    a: RegisteredExperiment
    b: RegisteredExperiment
    home: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def grader_command(home: Path, port: int, admin_token: str) -> tuple[list[str], dict[str, str]]:
    """`autorl grader` on SQLite in ``home`` with the tests' small fair share: command and environment."""
    unset = ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL", "AUTORL_LOCAL_MODE")
    env = {
        **{name: value for name, value in os.environ.items() if name not in unset},
        "AUTORL_HOME": str(home),  # SQLite in its home; local dispatch: no Redis
        "AUTORL_ADMIN_TOKEN": admin_token,
        "AUTORL_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "AUTORL_AGENT_REQUESTS_PER_S": str(RATE),
        "AUTORL_AGENT_REQUEST_BURST": str(BURST),
        "AUTORL_AGENT_REQUESTS_IN_FLIGHT": str(IN_FLIGHT),
    }
    return [AUTORL, "grader", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"], env


@pytest.fixture
def tenants(tmp_path: Path, tiny_base_model: Path) -> Iterator[Tenants]:
    port, admin_token = free_port(), secrets.token_hex(16)
    home = tmp_path / "home"
    command, env = grader_command(home, port, admin_token)
    with (
        grader_process(command, env, [f"http://127.0.0.1:{port}"]),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        a, b = (
            register(client, Operator(admin_token), tiny_base_model, make_workspace(tmp_path), task="arith")
            for _ in range(2)
        )
        yield Tenants(port, admin_token, f"sqlite:///{home / 'autorl.db'}", a, b, home)


def get(tenants: Tenants, path: str, source: str = "127.0.0.1", **kwargs: Any) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as client:
        return client.get(tenants.url + path, **kwargs)


def spend_the_burst(tenants: Tenants, experiment: RegisteredExperiment) -> None:
    for _ in range(BURST):
        assert get(tenants, f"{experiment.url_path}/time").status_code == 200
    assert_refused(get(tenants, f"{experiment.url_path}/time"))


def assert_refused(answer: httpx.Response, *, whose: str = "for this experiment") -> int:
    assert answer.status_code == 429, answer.text
    retry_after = int(answer.headers["retry-after"])
    assert retry_after >= 1
    body = answer.json()
    assert body["detail"] == body["error"]
    assert f"too many requests {whose}" in body["detail"] and BUDGET in body["detail"]
    assert f"retry after {retry_after} s" in body["detail"]
    return retry_after


def submissions(tenants: Tenants, experiment: RegisteredExperiment) -> int:
    db = Database(tenants.database_url)
    try:
        with db.read_session() as session:
            return int(
                session.execute(
                    text(
                        "SELECT count(*) FROM submissions JOIN experiments ON experiments.id = "
                        "submissions.experiment_id WHERE experiments.name = :name"
                    ),
                    {"name": experiment.name},
                ).scalar_one()
            )
    finally:
        db.dispose()


def test_past_its_budget_an_experiment_is_refused_before_its_body_is_read_and_others_are_served(
    tenants: Tenants,
) -> None:
    spend_the_burst(tenants, tenants.a)
    # The same experiment with its bearer token is the same budget; the other experiment has its own.
    assert_refused(get(tenants, "/time", headers=tenants.a.bearer))
    assert get(tenants, f"{tenants.b.url_path}/time").status_code == 200
    assert get(tenants, "/scores", headers=tenants.b.bearer).status_code == 200
    admin = {"Authorization": f"Bearer {tenants.admin_token}"}
    assert get(tenants, "/v1/experiments", headers=admin).status_code == 200
    # A submit whose chunked body never ends is answered at once, and closed: its body was not read.
    before = submissions(tenants, tenants.a)
    with socket.create_connection(("127.0.0.1", tenants.port), timeout=10) as sock:
        sock.sendall(
            f"POST {tenants.a.url_path}/submit HTTP/1.1\r\nHost: grader\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"10000\r\n"
            + b'{"model_path": "'
            + b"x" * 60000
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
    head = answer.split(b"\r\n\r\n")[0].decode().lower()
    assert head.startswith("http/1.1 429") and "retry-after: " in head and "connection: close" in head
    assert submissions(tenants, tenants.a) == before
    # Once the bucket has refilled one request, it is served again.
    wait_for(
        lambda: get(tenants, f"{tenants.a.url_path}/time").status_code == 200,
        "the experiment to be served again",
        1.0 / RATE + 1,
        0,
    )


def test_requests_in_flight_are_capped_per_experiment(tenants: Tenants) -> None:
    """Requests whose bodies are still arriving are in flight; past the cap the next is refused."""
    held = []
    try:
        for _ in range(IN_FLIGHT):
            sock = socket.create_connection(("127.0.0.1", tenants.port), timeout=10)
            sock.sendall(
                f"POST {tenants.a.url_path}/submit HTTP/1.1\r\nHost: grader\r\n"
                'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model_path": '.encode()
            )
            held.append(sock)
        time.sleep(0.3)  # the grader has taken both in
        refused = get(tenants, f"{tenants.a.url_path}/time")
        assert assert_refused(refused) == 1
        assert get(tenants, f"{tenants.b.url_path}/time").status_code == 200
    finally:
        for sock in held:
            sock.close()
    wait_for(
        lambda: get(tenants, f"{tenants.a.url_path}/time").status_code == 200,
        "the places in flight to be given back",
        5,
    )


def test_made_up_tokens_are_held_to_their_address_share(tenants: Tenants) -> None:
    statuses = Counter(
        get(tenants, f"/a/{secrets.token_hex(16)}/time", source="127.0.0.2").status_code
        for _ in range(BURST + 3)
    )
    assert statuses == {401: BURST, 429: 3}
    refused = get(tenants, "/time", source="127.0.0.2", headers={"Authorization": "Bearer made-up"})
    assert_refused(refused, whose="from this address without a token the grader knows")
    # A token the grader knows, from the same address, is its experiment's, not the address's.
    assert get(tenants, f"{tenants.a.url_path}/time", source="127.0.0.2").status_code == 200
    assert get(tenants, f"/a/{secrets.token_hex(16)}/time", source="127.0.0.3").status_code == 401


def test_a_grader_that_did_not_register_an_experiment_knows_its_token_before_its_first_request(
    tenants: Tenants,
) -> None:
    """A restarted grader, or a second replica, knows every experiment's token from the database: a
    client sharing the experiments' address (agents of one host behind their relays) cannot spend,
    with made-up tokens, an address budget that the experiments' own first requests would be charged
    to."""
    port = free_port()
    command, env = grader_command(tenants.home, port, tenants.admin_token)
    with grader_process(command, env, [f"http://127.0.0.1:{port}"]):
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30) as client:
            made_up = [
                client.get(f"{url}/a/{secrets.token_hex(16)}/time").status_code for _ in range(BURST + 1)
            ]
            assert made_up == [401] * BURST + [429]
            for experiment in (tenants.a, tenants.b):
                assert client.get(f"{url}{experiment.url_path}/time").status_code == 200
                assert client.get(f"{url}/scores", headers=experiment.bearer).status_code == 200


def test_under_one_experiments_flood_another_the_admin_api_and_a_write_stay_fast(tenants: Tenants) -> None:
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def flood(source: str) -> None:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    statuses[client.get(f"{tenants.url}{tenants.a.url_path}/scores").status_code] += 1

    floods = [threading.Thread(target=flood, args=(f"127.0.0.{2 + i % 2}",)) for i in range(24)]
    for thread in floods:
        thread.start()
    admin = {"Authorization": f"Bearer {tenants.admin_token}"}
    db = Database(tenants.database_url)
    took: dict[str, list[float]] = {"other experiment": [], "admin API": [], "database write": []}
    try:
        time.sleep(1.0)
        for _ in range(5):
            started = time.monotonic()
            assert get(tenants, f"{tenants.b.url_path}/scores").status_code == 200
            took["other experiment"].append(time.monotonic() - started)
            started = time.monotonic()
            assert get(tenants, "/v1/experiments", headers=admin).status_code == 200
            took["admin API"].append(time.monotonic() - started)
            started = time.monotonic()
            with db.session() as session:
                session.execute(
                    text("UPDATE experiments SET agent = agent WHERE name = :name"), {"name": tenants.b.name}
                )
            took["database write"].append(time.monotonic() - started)
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in floods:
            thread.join()
        db.dispose()
    slowest = {what: max(times) for what, times in took.items()}
    assert all(s < SERVED_WITHIN_S for s in slowest.values()), slowest
    # Its burst and its rate were served; each connection was refused about once a second.
    assert statuses[429] > 5 * statuses[200] > 0, statuses
