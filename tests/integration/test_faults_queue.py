"""Faults of the evaluation path, through real processes: an `autorl worker` killed mid-evaluation,
a Redis that comes back empty, a full disk in the evaluator's storage. Each ends with every
submission scored (or failed with its reason) exactly once; docs/RELIABILITY.md shows the outcomes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from autorl.store import Database, SubmissionStatus, submissions
from autorl.store import experiments as experiment_store
from autorl.tasks import get_task
from autorl_grader.main import create_app
from tests.support.fault_records import record_fault
from tests.support.grading import (
    make_workspace,
    number_of,
    register,
    submit_copy,
)
from tests.support.infra import RedisServer, new_run_id, serve
from tests.support.requirements import require
from tests.support.service_processes import kill_tree, running, start, stop
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.faults]

#: A short lease, so a dead worker's claim lapses in seconds (the default is minutes), yet long
#: enough that a live worker on a loaded machine always renews it in time.
LEASE_S = 10.0
SETTLE_TIMEOUT_S = 240.0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(new_run_id(), tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(
    make_settings: Callable[..., DeploymentSettings],
    fresh_pg_url: str,
    redis_server: RedisServer,
    fresh_queue_prefix: str,
) -> DeploymentSettings:
    return make_settings(
        database_url=fresh_pg_url,
        redis_url=redis_server.url,
        redis_key_prefix=fresh_queue_prefix,
        eval_limit=2,
        eval_max_new_tokens=4,
        submit_wait_s=0.0,
        eval_lease_s=LEASE_S,
        reconcile_interval_s=0.5,
    )


@pytest.fixture
def grader(settings: DeploymentSettings) -> Iterator[httpx.Client]:
    """The grader over real HTTP, its reconciler running."""
    with serve(create_app(settings)) as served, httpx.Client(base_url=served.url, timeout=60) as client:
        yield client


def statuses(db: Database, ids: list[int]) -> dict[int, SubmissionStatus]:
    with db.session() as session:
        return {i: submissions.get_submission(session, i).status for i in ids}


def all_final(db: Database, ids: list[int]) -> Callable[[], bool]:
    final = {SubmissionStatus.SCORED, SubmissionStatus.FAILED}
    return lambda: set(statuses(db, ids).values()) <= final


def test_a_worker_killed_mid_evaluation_is_replaced_and_the_submission_scored_once(
    request: pytest.FixtureRequest,
    settings: DeploymentSettings,
    db: Database,
    grader: httpx.Client,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    experiment = register(grader, settings, tiny_base_model, make_workspace(tmp_path))
    submission = submit_copy(grader, db, experiment, tiny_base_model, "ckpt")
    first = start(["worker"], settings, tmp_path / "worker-1.log")
    try:
        wait_for(
            lambda: statuses(db, [submission])[submission] == SubmissionStatus.RUNNING,
            "the first claim",
            timeout_s=SETTLE_TIMEOUT_S,
        )
        kill_tree(first)  # the worker and its work horse, mid-evaluation
    finally:
        stop(first)
    with db.session() as session:
        killed = submissions.get_submission(session, submission)
        killed_worker, killed_attempts = killed.worker, killed.attempts
    assert killed.status == SubmissionStatus.RUNNING and killed_attempts == 1
    with running(["worker"], settings, tmp_path / "worker-2.log"):
        wait_for(all_final(db, [submission]), "the second worker's score", timeout_s=SETTLE_TIMEOUT_S)
    with db.session() as session:
        row = submissions.get_submission(session, submission)
        assert row.status == SubmissionStatus.SCORED and row.score is not None
        assert row.attempts == 2 and row.worker != killed_worker
        assert len(submissions.experiment_submissions(session, row.experiment)) == 1
    scores = grader.get(f"{experiment.url_path}/scores").json()["submissions"]
    assert [(s["submission_id"], s["status"]) for s in scores] == [(number_of(db, submission), "scored")]
    second_log = (tmp_path / "worker-2.log").read_text()
    assert second_log.count(f"event=evaluation_scored submission={submission} ") == 1
    record_fault(
        request,
        fault="an evaluator worker SIGKILLed mid-evaluation",
        injected="SIGKILL to the `autorl worker` (RQ) process group while the submission is running",
        cases=1,
        outcome="the lease lapsed, the reconciler requeued it, a second worker scored it: "
        "one score, attempt 2, nothing left running",
        observed={"attempts": row.attempts, "scored": 1, "lease_s": LEASE_S},
    )


def test_a_redis_restarted_empty_gets_every_queued_submission_again(
    request: pytest.FixtureRequest,
    settings: DeploymentSettings,
    db: Database,
    redis_server: RedisServer,
    grader: httpx.Client,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    experiments = [register(grader, settings, tiny_base_model, make_workspace(tmp_path)) for _ in range(2)]
    ids = [
        submit_copy(grader, db, experiment, tiny_base_model, f"ckpt{index}")
        for experiment in experiments
        for index in range(2)
    ]
    redis = Redis.from_url(redis_server.url)
    queue = Queue(settings.queue_name, connection=redis, serializer=JSONSerializer)
    assert len(queue.job_ids) == len(experiments)  # one waiting job per experiment, the rest in Postgres
    redis.set("autorl-test-before-the-restart", 1)
    redis_server.kill()
    redis_server.start()  # same address, nothing in it (the reconciler may enqueue again at once)
    assert redis.get("autorl-test-before-the-restart") is None
    wait_for(lambda: len(queue.job_ids) == len(experiments), "the reconciler's re-enqueue", timeout_s=30)
    with running(["worker"], settings, tmp_path / "worker.log"):
        wait_for(all_final(db, ids), "every submission's score", timeout_s=SETTLE_TIMEOUT_S)
    assert set(statuses(db, ids).values()) == {SubmissionStatus.SCORED}
    with db.session() as session:
        assert {submissions.get_submission(session, i).attempts for i in ids} == {1}
    log = (tmp_path / "worker.log").read_text()
    assert all(log.count(f"event=evaluation_scored submission={i} ") == 1 for i in ids)
    record_fault(
        request,
        fault="Redis restarted with its data gone",
        injected="SIGKILL to a private `redis-server` holding queued jobs, restarted empty on the same port",
        cases=len(ids),
        outcome=f"the grader's reconciler re-enqueued from Postgres; all {len(ids)} submissions of "
        f"{len(experiments)} experiments scored once, at the first attempt",
        observed={"submissions": len(ids), "experiments": len(experiments), "scored": len(ids)},
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of this test's own (mounting needs root)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "autorl-test", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(
        result.returncode == 0,
        f"a private tmpfs cannot be mounted here (needs root): {result.stderr.strip()}",
    )
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_evaluator_disk_fails_the_submission_with_the_reason_and_the_worker_goes_on(
    request: pytest.FixtureRequest,
    make_settings: Callable[..., DeploymentSettings],
    settings: DeploymentSettings,
    db: Database,
    small_disk: Path,
    grader: httpx.Client,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    worker_settings = settings.model_copy(update={"eval_dir": small_disk})
    # The test split is cached on the small disk, as a worker leaves it after its first evaluation.
    get_task("gsm8k").load_test_problems(small_disk / "data", source_dir=settings.data_source_dir, limit=2)
    experiment = register(grader, settings, tiny_base_model, make_workspace(tmp_path))
    filler = small_disk / "filler"
    with running(["worker"], worker_settings, tmp_path / "worker.log"):
        with filler.open("wb") as fh:  # fill what is left of the disk
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError:
                pass
        full = submit_copy(grader, db, experiment, tiny_base_model, "full")
        wait_for(all_final(db, [full]), "the failure", timeout_s=SETTLE_TIMEOUT_S)
        filler.unlink()
        after = submit_copy(grader, db, experiment, tiny_base_model, "after")
        wait_for(all_final(db, [after]), "the score after space was freed", timeout_s=SETTLE_TIMEOUT_S)
    rows = {s["submission_id"]: s for s in grader.get(f"{experiment.url_path}/scores").json()["submissions"]}
    assert rows[number_of(db, after)]["status"] == "scored"
    assert rows[number_of(db, full)]["status"] == "failed" and rows[number_of(db, full)]["score"] is None
    assert "storage is full" in rows[number_of(db, full)]["error"]
    with db.session() as session:
        assert submissions.get_submission(session, full).attempts == 1  # failed at once, not retried to death
        # The evaluator's fault, not the checkpoint's: only the scored one counts against the limit.
        assert (
            submissions.limited_submissions_count(
                session, experiment_store.get_experiment(session, experiment.name)
            )
            == 1
        )
    record_fault(
        request,
        fault="a full disk in the evaluator's storage",
        injected="the worker's AUTORL_EVAL_DIR on a private 2 MiB tmpfs, filled up, then freed",
        cases=2,
        outcome='the submission failed at its first attempt with "the evaluator\'s storage is full"; '
        "the same worker scored the next one once space was freed",
        observed={"scored": 1, "failed": 1},
    )
