"""Nothing lost, nothing double-counted: claims, leases and the reconciler on real Postgres and Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from autorl.store import Database, SubmissionStatus, claims, outcomes, submissions
from autorl.store.models import utcnow
from autorl_grader.main import create_app
from autorl_grader.reconciler import reconcile_once
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    copy_model,
    row_id,
    submit_copy,
)
from tests.support.settings import DeploymentSettings


@pytest.fixture
def settings(
    make_settings: Callable[..., DeploymentSettings], pg_url: str, redis_url: str
) -> DeploymentSettings:
    return make_settings(database_url=pg_url, redis_url=redis_url, submit_wait_s=0.0)


@pytest.fixture
def queued_id(
    client: TestClient, experiment: RegisteredExperiment, settings: DeploymentSettings, tiny_base_model: Path
) -> int:
    copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
    response = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
    assert response.status_code == 202
    return row_id(settings.database_url, experiment, int(response.json()["submission_id"]))


def rq_queue(settings: DeploymentSettings) -> Queue:
    return Queue(
        settings.queue_name, connection=Redis.from_url(settings.redis_url or ""), serializer=JSONSerializer
    )


def test_submit_commits_then_enqueues_one_rq_job(settings: DeploymentSettings, queued_id: int) -> None:
    jobs = rq_queue(settings).jobs
    assert [job.args for job in jobs if job.args == [queued_id]] == [[queued_id]]
    job = next(j for j in jobs if j.args == [queued_id])
    assert job.func_name == "autorl_evaluator.jobs.evaluate"
    assert job.timeout == settings.eval_timeout_s + 300
    assert job.retries_left == 2


def test_the_job_timeout_is_the_recorded_evaluation_timeout_not_the_dispatchers_own(
    experiment: RegisteredExperiment, settings: DeploymentSettings, tiny_base_model: Path
) -> None:
    """A grader (or worker) whose own AUTORL_EVAL_TIMEOUT_S differs from the one recorded with the
    experiment enqueues its submissions with the recorded one: RQ kills what the evaluation obeys."""
    copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
    other = settings.model_copy(update={"eval_timeout_s": settings.eval_timeout_s + 1000})
    with TestClient(create_app(other, reconcile=False)) as other_client:
        response = other_client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
    assert response.status_code == 202, response.text
    submission_id = row_id(settings.database_url, experiment, response.json()["submission_id"])
    job = next(j for j in rq_queue(settings).jobs if j.args == [submission_id])
    assert job.timeout == settings.eval_timeout_s + 300


def test_only_one_of_many_concurrent_claims_wins(db: Database, queued_id: int) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def claim(worker: str) -> None:
        barrier.wait()
        with db.session() as session:
            if claims.claim(session, queued_id, worker=worker, lease_s=60):
                winners.append(worker)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    with db.session() as session:
        row = submissions.get_submission(session, queued_id)
        assert row.status == SubmissionStatus.RUNNING and row.attempts == 1 and row.worker == winners[0]


def test_a_dead_workers_submission_is_requeued_and_its_late_result_ignored(
    settings: DeploymentSettings, db: Database, queued_id: int
) -> None:
    state = TestClient(create_app(settings, reconcile=False)).app.state.grader  # type: ignore[attr-defined]
    with db.session() as session:
        assert claims.claim(session, queued_id, worker="dead", lease_s=60)
        submissions.get_submission(session, queued_id).lease_expires_at = utcnow() - timedelta(seconds=1)
    rq_queue(settings).empty()  # the queue lost the job too
    done = reconcile_once(state)
    assert done["requeued"] == 1 and done["enqueued"] >= 1  # other tests may leave queued rows too
    assert any(job.args == [queued_id] for job in rq_queue(settings).jobs)
    with db.session() as session:
        assert submissions.get_submission(session, queued_id).status == SubmissionStatus.QUEUED
        assert claims.claim(session, queued_id, worker="alive", lease_s=60)
    with db.session() as session:  # the dead worker wakes up: its result must not count
        assert not outcomes.record_score(
            session, queued_id, worker="dead", scores={"opencompass": 99.0}, n_samples=1, seconds=1.0
        )
        assert outcomes.record_score(
            session, queued_id, worker="alive", scores={"opencompass": 25.0}, n_samples=4, seconds=1.0
        )
    with db.session() as session:
        row = submissions.get_submission(session, queued_id)
        assert row.score == 25.0 and row.attempts == 2


def test_after_max_attempts_a_submission_fails_with_a_reason(
    settings: DeploymentSettings, db: Database, queued_id: int
) -> None:
    state = TestClient(create_app(settings, reconcile=False)).app.state.grader  # type: ignore[attr-defined]
    for attempt in range(settings.max_eval_attempts):
        with db.session() as session:
            assert claims.claim(session, queued_id, worker=f"crash{attempt}", lease_s=60)
            submissions.get_submission(session, queued_id).lease_expires_at = utcnow() - timedelta(seconds=1)
        reconcile_once(state)
    with db.session() as session:
        row = submissions.get_submission(session, queued_id)
        assert row.status == SubmissionStatus.FAILED
        assert "interrupted 3 times" in (row.error or "")


def test_redis_holds_one_waiting_job_per_experiment_and_none_once_it_finished(
    client: TestClient, experiment: RegisteredExperiment, settings: DeploymentSettings, tiny_base_model: Path
) -> None:
    ids = []
    for name in ("first", "second", "third"):
        ids.append(submit_copy(client, settings.database_url, experiment, tiny_base_model, name))

    def waiting() -> list[int]:
        return [args[0] for args in (job.args for job in rq_queue(settings).jobs) if args[0] in ids]

    assert waiting() == ids[:1]  # the others wait in the database, for their experiment's turn
    finished = client.post(
        f"/v1/experiments/{experiment.name}/finish",
        json={"status": "completed"},
        headers=admin_headers(settings),
    )
    assert finished.status_code == 200 and finished.json()["in_flight"] == 0
    assert waiting() == []  # cancelled: nothing of it is left for an evaluator
