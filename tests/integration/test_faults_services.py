"""Faults of the services, through real processes: PostgreSQL stopped and started under a running
`autorl grader`, and the grader killed while a blocking /submit waits. docs/RELIABILITY.md shows
the outcomes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from autorl.store import Database, SubmissionStatus, experiments, migrate, submissions
from tests.support.fault_records import record_fault
from tests.support.grading import (
    RegisteredExperiment,
    copy_model,
    make_workspace,
    register,
    row_id,
    submit_no_wait,
)
from tests.support.infra import free_port
from tests.support.postgres_cluster import PostgresCluster
from tests.support.service_processes import kill_tree, running, start, stop, wait_until_serving
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def submit(client: httpx.Client, experiment: RegisteredExperiment, base: Path, folder: str) -> httpx.Response:
    if not (experiment.output_dir / folder).exists():
        copy_model(base, experiment.output_dir / folder, unique=True)
    response: httpx.Response = submit_no_wait(client, experiment, f"output/{folder}")
    return response


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    server = PostgresCluster()
    server.start()
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE autorl")
    yield server
    server.remove()


def snapshots(settings: DeploymentSettings) -> list[str]:
    assert settings.snapshot_dir is not None
    return sorted(p.name for p in settings.snapshot_dir.glob("*")) if settings.snapshot_dir.exists() else []


def test_postgres_stopped_and_started_under_a_running_grader(
    request: pytest.FixtureRequest,
    make_settings: Callable[..., DeploymentSettings],
    cluster: PostgresCluster,
    redis_url: str,
    fresh_queue_prefix: str,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    database_url = cluster.url.rsplit("/", 1)[0] + "/autorl"
    migrate(database_url)
    settings = make_settings(
        database_url=database_url, redis_url=redis_url, redis_key_prefix=fresh_queue_prefix
    )
    port = free_port()
    log = tmp_path / "grader.log"
    with (
        running(["grader", "--port", str(port)], settings, log) as grader,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
    ):
        wait_until_serving(str(client.base_url), grader, log)
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path))
        before = submit(client, experiment, tiny_base_model, "before")
        assert before.status_code == 202, before.text
        first = before.json()["submission_id"]
        kept = snapshots(settings)

        cluster.stop()
        down = {
            "submit": submit(client, experiment, tiny_base_model, "during"),
            "submission": client.get(f"{experiment.url_path}/submissions/{first}"),
            "scores": client.get(f"{experiment.url_path}/scores"),
            "time": client.get(f"{experiment.url_path}/time"),
            "readyz": client.get("/readyz"),
        }
        assert {name: r.status_code for name, r in down.items()} == dict.fromkeys(down, 503)
        for name in ("submit", "submission", "scores", "time"):
            assert "the database is unreachable" in down[name].json()["detail"], name
        assert "the database is unreachable" in down["readyz"].json()["detail"]
        assert snapshots(settings) == kept  # the refused submission left no copy behind

        cluster.start()
        assert grader.poll() is None  # the same process, never restarted
        assert client.get("/readyz").status_code == 200
        assert client.get(f"{experiment.url_path}/submissions/{first}").json()["status"] == "queued"
        after = submit(client, experiment, tiny_base_model, "during")
        assert after.status_code == 202, after.text
        listed = client.get(f"{experiment.url_path}/scores").json()["submissions"]
    assert [s["submission_id"] for s in listed] == [first, after.json()["submission_id"]]
    db = Database(database_url)
    try:
        with db.session() as session:
            rows = submissions.experiment_submissions(
                session, experiments.get_experiment(session, experiment.name)
            )
            assert [r.status for r in rows] == [SubmissionStatus.QUEUED] * 2
    finally:
        db.dispose()
    record_fault(
        request,
        fault="PostgreSQL stopped and started",
        injected="`pg_ctl stop -m immediate` on a private `initdb` cluster under a running `autorl grader`, "
        "then `pg_ctl start`",
        cases=len(down),
        outcome='every request while it was down answered 503 "the database is unreachable" (submit, '
        "poll, scores, time, readyz); no row or snapshot of the refused submission; the same grader "
        "process served and accepted it once the database was back",
        observed={"answers_while_down": {name: r.status_code for name, r in down.items()}, "rows": len(rows)},
    )


def test_the_grader_killed_while_a_blocking_submit_waits(
    request: pytest.FixtureRequest,
    make_isolated_settings: Callable[..., DeploymentSettings],
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    settings = make_isolated_settings(eval_limit=2, eval_max_new_tokens=4, submit_wait_s=300.0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = Database(settings.database_url or "")
    first = start(["grader", "--port", str(port)], settings, tmp_path / "grader-1.log")
    try:
        wait_until_serving(url, first, tmp_path / "grader-1.log")
        with httpx.Client(base_url=url, timeout=60) as client:
            experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path))
        copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
        answers: list[BaseException | httpx.Response] = []

        def blocking_submit() -> None:
            try:
                answers.append(
                    httpx.post(
                        f"{url}{experiment.url_path}/submit", json={"model_path": "output/ckpt"}, timeout=300
                    )
                )
            except httpx.HTTPError as exc:
                answers.append(exc)

        waiter = threading.Thread(target=blocking_submit)
        waiter.start()

        def committed() -> int:
            with db.session() as session:
                return len(
                    submissions.experiment_submissions(
                        session, experiments.get_experiment(session, experiment.name)
                    )
                )

        wait_for(lambda: committed() == 1, "the submission's row", timeout_s=60)
        kill_tree(first)  # no worker runs yet: the submit is still waiting for its score
        waiter.join(timeout=30)
    finally:
        stop(first)
    assert len(answers) == 1 and isinstance(answers[0], httpx.TransportError)

    with (
        running(["grader", "--port", str(port)], settings, tmp_path / "grader-2.log") as second,
        running(["worker"], settings, tmp_path / "worker.log"),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        wait_until_serving(url, second, tmp_path / "grader-2.log")
        listed = client.get(f"{experiment.url_path}/scores").json()["submissions"]
        assert len(listed) == 1
        submission = listed[0]["submission_id"]

        def scored() -> bool:
            return client.get(f"{experiment.url_path}/submissions/{submission}").json()["status"] == "scored"

        wait_for(scored, "the score", timeout_s=240)
        final = client.get(f"{experiment.url_path}/submissions/{submission}").json()
    with db.session() as session:
        row = submissions.get_submission(session, row_id(db, experiment, submission))
        assert row.attempts == 1 and row.status == SubmissionStatus.SCORED
    db.dispose()
    assert final["score"] is not None
    record_fault(
        request,
        fault="the grader killed while a blocking `/submit` waits",
        injected="SIGKILL to `autorl grader` after the submission was committed, before its score",
        cases=1,
        outcome="the agent's connection broke; the restarted grader listed the submission in `GET /scores`, "
        "a worker scored it once and `GET /submissions/{id}` answered the score",
        observed={"attempts": row.attempts, "submissions": len(listed)},
    )
