"""What agents do in loops, against a real grader over HTTP and real Postgres: blocking submits
share one poller (the database sees one query per interval, not one per waiter), and a remembered
token never outlives its experiment's finish or re-keying."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, update

from autorl.store import Database, Submission, SubmissionStatus, experiments
from autorl_grader.expiring_cache import CACHE_TTL_S, ExpiringCache
from autorl_grader.result_waits import POLL_INTERVAL_S
from autorl_grader.state import GraderState
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    check_token_rotation,
    copy_model,
    submit_accepted,
)
from tests.support.infra import serve
from tests.support.settings import DeploymentSettings

WAITERS = 40


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    # The waiters of one experiment arrive at once: its fair share lets them all in.
    return make_settings(database_url=pg_url, submit_wait_s=60.0, agent_requests_in_flight=WAITERS)


@pytest.fixture
def experiment(experiment: RegisteredExperiment, tiny_base_model: Path) -> RegisteredExperiment:
    """The registered experiment with a checkpoint of its own at ``output/ckpt``."""
    copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
    return experiment


def count_queries(db: Database) -> list[str]:
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(db.engine, "before_cursor_execute", record)
    return statements


def test_blocking_submits_share_one_poller_and_all_wake(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    state: GraderState = client.app.state.grader  # type: ignore[attr-defined]
    app = client.app

    async def scenario(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            body = {"model_path": "output/ckpt"}
            waiters = [
                asyncio.create_task(http.post(f"{experiment.url_path}/submit", json=body))
                for _ in range(WAITERS)
            ]
            deadline = time.monotonic() + 60
            while state.waits.waiting < WAITERS:
                assert time.monotonic() < deadline, f"only {state.waits.waiting} of {WAITERS} waiting"
                await asyncio.sleep(0.05)
            statements = count_queries(state.db)
            window_s = 8 * POLL_INTERVAL_S
            await asyncio.sleep(window_s)
            polls = len(statements)
            # One status query per interval for all of them (each waiter polling alone: 40 × 8).
            assert polls <= window_s / POLL_INTERVAL_S + 2, statements
            assert not any(task.done() for task in waiters)
            with state.db.session() as session:
                session.execute(
                    update(Submission)
                    .where(Submission.is_baseline.is_(False))
                    .values(status=SubmissionStatus.SCORED, score=50.0)
                )
            return await asyncio.gather(*waiters)

    with serve(app) as served:
        responses = asyncio.run(scenario(served.url))
    assert [r.status_code for r in responses] == [200] * WAITERS
    assert {r.json()["score"] for r in responses} == {50.0}
    assert len({r.json()["submission_id"] for r in responses}) == WAITERS
    assert state.waits.waiting == 0


def test_a_finished_experiment_loses_access_at_once(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    assert client.get(f"{experiment.url_path}/time").status_code == 200  # the token is now remembered
    finished = client.post(
        f"/v1/experiments/{experiment.name}/finish",
        json={"status": "completed"},
        headers=admin_headers(settings),
    )
    assert finished.status_code == 200
    response = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
    assert response.status_code == 409
    assert "accepts no more submissions" in response.json()["detail"]


def test_a_replaced_token_is_refused_at_once(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    assert client.get(f"{experiment.url_path}/time").status_code == 200
    check_token_rotation(client, settings, experiment)


def test_a_token_replaced_elsewhere_is_refused_within_the_ttl(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    """Another grader process (here: a direct write) re-keys the experiment: this one trusts the
    remembered token for at most CACHE_TTL_S, never longer."""
    assert client.get(f"{experiment.url_path}/time").status_code == 200
    db = Database(settings.database_url or "")
    try:
        with db.session() as session:
            experiments.rotate_token(
                session, experiments.get_experiment(session, experiment.name, for_update=True)
            )
    finally:
        db.dispose()
    rotated_at = time.monotonic()
    while client.get(f"{experiment.url_path}/time").status_code == 200:
        assert time.monotonic() - rotated_at <= CACHE_TTL_S + 0.5
        time.sleep(0.05)
    assert client.get(f"{experiment.url_path}/time").status_code == 401


def test_time_shows_a_submission_made_through_this_grader_at_once(
    client: TestClient, experiment: RegisteredExperiment
) -> None:
    # Entries that outlive the submit, however long it takes: only forgetting at accept shows it.
    state: GraderState = client.app.state.grader  # type: ignore[attr-defined]
    state.last_submits = ExpiringCache(ttl_s=3600.0)
    assert client.get(f"{experiment.url_path}/time").json()["last_submit_time"] is None  # now remembered
    submit_accepted(client, experiment, "output/ckpt")
    assert client.get(f"{experiment.url_path}/time").json()["last_submit_time"] is not None
