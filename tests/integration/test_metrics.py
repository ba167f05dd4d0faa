"""Prometheus metrics of the grader and of the evaluator worker, scraped as Prometheus would and
parsed with prometheus_client's own parser.

The end-to-end test runs the real `autorl grader` (two ports) and `autorl worker --metrics-port`
processes against Postgres, with the local worker and with an RQ worker: values move when a
submission is queued, evaluated and scored, and when a second experiment's baseline hits the
cache. The others pin every grader metric against seeded rows, the worker's outcome accounting,
and the refusals."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from autorl.store import Database, FailureReason, claims, migrate, outcomes, submissions
from autorl_evaluator.metrics import WorkerMetrics
from autorl_grader.main import create_app
from tests.support.fixtures import FIXTURE_DATA
from tests.support.grading import RegisteredExperiment, admin_headers, copy_model, make_workspace, register
from tests.support.infra import free_port, stop_process
from tests.support.runs import add_submission, create_experiment, finish, scores
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

AUTORL = str(Path(sys.executable).parent / "autorl")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# -- the real processes --------------------------------------------------------------------------


def _environment(home: Path, database_url: str, admin_token: str, agent_port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "AUTORL_HOME": str(home),
        "AUTORL_DATABASE_URL": database_url,
        "AUTORL_ADMIN_TOKEN": admin_token,
        "AUTORL_PUBLIC_URL": f"http://127.0.0.1:{agent_port}",
        "AUTORL_DATA_SOURCE_DIR": str(FIXTURE_DATA),
        "AUTORL_EVAL_DEVICE": "cpu",
        "AUTORL_EVAL_BACKEND": "hf",
        "AUTORL_EVAL_LIMIT": "2",
        "AUTORL_EVAL_MAX_NEW_TOKENS": "4",
        "AUTORL_SUBMIT_WAIT_S": "0",
    }
    for name in ("AUTORL_REDIS_URL", "AUTORL_LOCAL_MODE", "AUTORL_WORKER_METRICS_PORT"):
        env.pop(name, None)
    return env


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.fixture(params=["local", "rq"])
def queue_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The local worker (the database is the queue; each evaluation in a subprocess), or an RQ
    worker (each evaluation in a forked work horse) with the grader dispatching through Redis."""
    if request.param == "local":
        return {}
    return {
        "AUTORL_REDIS_URL": request.getfixturevalue("redis_url"),
        "AUTORL_REDIS_KEY_PREFIX": request.getfixturevalue("fresh_queue_prefix"),
    }


@pytest.mark.slow
def test_grader_and_worker_metrics_follow_submissions_through_real_processes(
    fresh_pg_url: str, queue_env: dict[str, str], tiny_base_model: Path, tmp_path: Path
) -> None:
    home, token = tmp_path / "home", secrets.token_hex(16)
    agent_port, admin_port, worker_port = free_port(), free_port(), free_port()
    env = {**_environment(home, fresh_pg_url, token, agent_port), **queue_env}
    grader = _start(
        [
            AUTORL,
            "grader",
            "--port",
            str(agent_port),
            "--admin-port",
            str(admin_port),
            "--log-level",
            "warning",
        ],
        env,
        tmp_path / "grader.log",
    )
    worker: subprocess.Popen[bytes] | None = None
    admin = httpx.Client(
        base_url=f"http://127.0.0.1:{admin_port}", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{admin_port}/healthz"), "the grader", 60)

        def grader_metrics() -> Samples:
            response = admin.get("/metrics")
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
            return parse(response.text)

        def worker_metrics() -> Samples:
            return parse(httpx.get(f"http://127.0.0.1:{worker_port}/metrics", timeout=5).text)

        operator, model = SimpleNamespace(admin_token_value=token), f"local:tiny-{secrets.token_hex(4)}"

        def new_run() -> RegisteredExperiment:
            return register(admin, operator, tiny_base_model, make_workspace(tmp_path), model=model)

        first = new_run()
        path = copy_model(tiny_base_model, first.output_dir / "trained", unique=True)
        submitted = httpx.post(
            f"http://127.0.0.1:{agent_port}{first.url_path}/submit",
            json={"model_path": str(path.relative_to(first.workspace))},
            params={"wait": "false"},
        )
        assert submitted.status_code == 202, submitted.text
        queued = grader_metrics()
        assert value(queued, "autorl_database_up") == 1
        assert value(queued, "autorl_queue_depth", experiment=first.name) == 1
        assert value(queued, "autorl_submissions", status="queued") == 1
        assert value(queued, "autorl_evaluation_duration_seconds_count") == 0

        # Who may read them: only the admin, and never on the agent port.
        for headers in ({}, first.bearer):
            assert httpx.get(f"http://127.0.0.1:{admin_port}/metrics", headers=headers).status_code == 401
        agent_port_answer = httpx.get(f"http://127.0.0.1:{agent_port}/metrics", headers=admin.headers)
        assert agent_port_answer.status_code == 404

        worker = _start([AUTORL, "worker", "--metrics-port", str(worker_port)], env, tmp_path / "worker.log")
        wait_for(lambda: _answers(f"http://127.0.0.1:{worker_port}/metrics"), "the worker's metrics", 60)
        wait_for(
            lambda: value(grader_metrics(), "autorl_submissions", status="scored") == 1,
            "the submission to be scored",
            180,
        )
        baseline = admin.post(f"/v1/experiments/{first.name}/baseline")
        assert baseline.status_code in (200, 202), baseline.text
        wait_for(
            lambda: value(grader_metrics(), "autorl_submissions", status="scored") == 2, "the baseline", 180
        )
        # A second run of the same model: its baseline comes from the cache, not an evaluation.
        second = new_run()
        assert admin.post(f"/v1/experiments/{second.name}/baseline").status_code in (200, 202)

        scored = grader_metrics()
        assert value(scored, "autorl_submissions", status="scored") == 3
        assert value(scored, "autorl_submissions", status="queued") == 0
        assert value(scored, "autorl_baseline_cache_hits_total") == 1
        assert value(scored, "autorl_queue_depth", experiment=first.name) == 0
        assert value(scored, "autorl_queue_depth", experiment=second.name) == 0
        assert value(scored, "autorl_evaluations_in_flight") == 0
        assert value(scored, "autorl_evaluation_duration_seconds_count") == 2  # the cache hit took none
        assert value(scored, "autorl_evaluation_duration_seconds_sum") > 0
        assert value(scored, "autorl_evaluation_duration_seconds_bucket", le="+Inf") == 2

        wait_for(
            lambda: value(worker_metrics(), "autorl_worker_evaluations_total", outcome="scored") == 2,
            "worker counts",
            30,
        )
        measured = worker_metrics()
        assert value(measured, "autorl_worker_evaluation_duration_seconds_count", outcome="scored") == 2
        assert value(measured, "autorl_worker_evaluation_duration_seconds_sum", outcome="scored") > 0
        assert value(measured, "autorl_worker_evaluations_in_progress") == 0
        assert value(measured, "autorl_worker_evaluations_total", outcome="failed") == 0
    finally:
        admin.close()
        if worker is not None:
            stop_process(worker, timeout_s=30)
        stop_process(grader, timeout_s=30)


def test_worker_refuses_a_bad_metrics_port_with_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, "AUTORL_HOME": str(tmp_path), "AUTORL_WORKER_METRICS_PORT": "http"}
    result = subprocess.run([AUTORL, "worker"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "AUTORL_WORKER_METRICS_PORT='http' is not a port number" in result.stderr
    result = subprocess.run(
        [AUTORL, "worker", "--metrics-port", "70000"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "--metrics-port 70000 is not a port number" in result.stderr


# -- every grader metric against seeded rows -----------------------------------------------------


@pytest.fixture
def db(fresh_pg_url: str) -> Iterator[Database]:
    database = Database(fresh_pg_url)
    yield database
    database.dispose()


def test_grader_metrics_count_each_status_queue_reason_and_duration(
    db: Database, make_settings: Callable[..., DeploymentSettings], fresh_pg_url: str, tmp_path: Path
) -> None:
    busy = create_experiment(db, tmp_path / "busy")
    add_submission(db, busy.name, scores=scores(10.0), baseline=True)
    add_submission(db, busy.name, scores=scores(20.0))  # 1.5 s evaluations (tests.support.runs)
    add_submission(db, busy.name, error="could not load the checkpoint")
    add_submission(db, busy.name)
    add_submission(db, busy.name, files="same")
    waiting = add_submission(db, busy.name, files="same")
    idle = create_experiment(db, tmp_path / "idle", started_minutes_ago=None)
    ended = create_experiment(db, tmp_path / "ended")
    add_submission(db, ended.name)
    finish(db, ended.name, "timed_out")  # its queued submission is cancelled
    settings = make_settings(database_url=fresh_pg_url)
    with TestClient(create_app(settings, reconcile=False)) as client:
        samples = parse(client.get("/metrics", headers=admin_headers(settings)).text)
    assert value(samples, "autorl_submissions", status="scored") == 2
    assert value(samples, "autorl_submissions", status="queued") == 3
    assert value(samples, "autorl_submissions", status="failed") == 2
    assert value(samples, "autorl_submissions", status="running") == 0
    assert value(samples, "autorl_experiments", phase="running") == 1
    assert value(samples, "autorl_experiments", phase="pending") == 1
    assert value(samples, "autorl_experiments", phase="timed_out") == 1
    # Waiting for an identical evaluation is not waiting for an evaluator.
    assert value(samples, "autorl_queue_depth", experiment=busy.name) == 2
    assert value(samples, "autorl_submissions_waiting_for_identical") == 1
    assert value(samples, "autorl_queue_depth", experiment=idle.name) == 0
    assert ("autorl_queue_depth", frozenset({("experiment", ended.name)})) not in samples
    assert value(samples, "autorl_evaluation_failures_total", reason=FailureReason.EVALUATION.value) == 1
    assert value(samples, "autorl_evaluation_failures_total", reason=FailureReason.CANCELLED.value) == 1
    assert value(samples, "autorl_evaluation_duration_seconds_count") == 2
    assert value(samples, "autorl_evaluation_duration_seconds_sum") == 3.0
    assert value(samples, "autorl_evaluation_duration_seconds_bucket", le="1.0") == 0
    assert value(samples, "autorl_evaluation_duration_seconds_bucket", le="5.0") == 2
    assert value(samples, "autorl_baseline_cache_hits_total") == 0
    with db.session() as session:
        assert submissions.get_submission(session, waiting).waits_for is not None


def test_grader_reports_the_database_down_instead_of_failing(
    make_settings: Callable[..., DeploymentSettings], tmp_path: Path
) -> None:
    settings = make_settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    with TestClient(create_app(settings, reconcile=False)) as client:
        assert (
            value(parse(client.get("/metrics", headers=admin_headers(settings)).text), "autorl_database_up")
            == 1
        )
        client.app.state.grader.db.dispose()  # type: ignore[attr-defined]
        (tmp_path / "db.sqlite").unlink()
        (tmp_path / "db.sqlite").mkdir()  # no longer a database file
        response = client.get("/metrics", headers=admin_headers(settings))
    assert response.status_code == 200
    assert value(parse(response.text), "autorl_database_up") == 0


# -- the worker's outcome accounting --------------------------------------------------------------


def test_worker_metrics_count_each_outcome_from_the_submission_record(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate(url)
    db = Database(url)
    run = create_experiment(db, tmp_path / "ws")
    queued = [add_submission(db, run.name) for _ in range(4)]
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    def claim(submission_id: int) -> None:
        with db.session() as session:
            assert claims.claim(session, submission_id, worker="w", lease_s=60)

    with metrics.evaluation(db, queued[0]):
        assert sample("autorl_worker_evaluations_in_progress") == 1
        claim(queued[0])
        with db.session() as session:
            outcomes.record_score(
                session, queued[0], worker="w", scores=scores(5.0), n_samples=1, seconds=1.0
            )
    with metrics.evaluation(db, queued[1]):
        claim(queued[1])
        with db.session() as session:
            outcomes.record_failure(session, queued[1], error="killed", reason=FailureReason.TIMEOUT)
    with metrics.evaluation(db, queued[2]):
        claim(queued[2])
        with db.session() as session:
            claims.release(session, queued[2], worker="w", error="worker stopping")
    with metrics.evaluation(db, queued[0]):
        pass  # already scored: the job never claims it
    with metrics.evaluation(db, queued[3]):
        claim(queued[3])  # still running: the child was killed before it recorded anything
    assert sample("autorl_worker_evaluations_in_progress") == 0
    for outcome in ("scored", "failed", "requeued", "skipped", "unfinished"):
        assert sample("autorl_worker_evaluations_total", outcome=outcome) == 1, outcome
    assert sample("autorl_worker_evaluation_failures_total", reason="timeout") == 1
    assert sample("autorl_worker_evaluation_duration_seconds_count", outcome="scored") == 1
    assert sample("autorl_worker_evaluation_duration_seconds_count", outcome="skipped") == 0
    db.dispose()
