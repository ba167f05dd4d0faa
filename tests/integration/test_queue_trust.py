"""Whatever reaches the queue, the evaluator worker runs only the evaluation of a submission id (and
the provenance check of an experiment id, under its own job id).

A hostile client with Redis access pushes jobs as RQ would let it: pickled payloads whose unpickling
runs a command, `os.system` and `subprocess.call` jobs, the evaluation with extra or keyword
arguments or a string id, callbacks naming `os.system`, and hashes RQ itself cannot load. A real
`autorl worker` process (real Postgres, a Redis that requires a password) refuses each one: the
proof files never appear, and the same worker then scores a real submission.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from rq import Callback, Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from autorl.errors import ConfigurationError
from autorl.queue import EVALUATE_JOB, PROVENANCE_JOB, job_id, provenance_job_id
from autorl_evaluator.rq_worker import InProcessEvaluationWorker, evaluation_queue
from autorl_grader.main import create_app
from tests.support.grading import copy_model, make_workspace, register
from tests.support.service_processes import service_env
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

AUTORL = str(Path(sys.executable).parent / "autorl")


class RunsOnUnpickle:
    """A pickle payload: unpickling it runs a shell command (what `pickle.loads` allows)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (os.system, (self.command,))


@pytest.fixture
def settings(make_isolated_settings: Callable[..., DeploymentSettings]) -> DeploymentSettings:
    return make_isolated_settings(eval_limit=2, eval_max_new_tokens=4, submit_wait_s=240.0)


def without_password(redis_url: str) -> str:
    scheme, rest = redis_url.split("://", 1)
    return f"{scheme}://{rest.rsplit('@', 1)[1]}"


@pytest.fixture
def worker_log(settings: DeploymentSettings) -> Path:
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings.home / "worker.log"


@pytest.fixture
def rq_worker(settings: DeploymentSettings, worker_log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with worker_log.open("wb") as log:
        worker = subprocess.Popen([AUTORL, "worker"], env=service_env(settings), stdout=log, stderr=log)
        yield worker
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def push_hostile_jobs(settings: DeploymentSettings, proof_dir: Path) -> dict[str, str]:
    """Every way a Redis client could ask the worker to run something else: name → job id. Each
    one that ran would create `proof_dir/<name>`."""
    redis = Redis.from_url(settings.redis_url or "")
    prefix, name = settings.redis_key_prefix, settings.queue_name
    pickled = Queue(name, connection=redis)  # RQ's default: pickle
    as_json = Queue(name, connection=redis, serializer=JSONSerializer)

    def touch(what: str) -> str:
        return f"touch {proof_dir}/{what}"

    jobs = {
        "pickle-arg": pickled.enqueue(
            EVALUATE_JOB, RunsOnUnpickle(touch("pickle-arg")), job_id=job_id(prefix, 900001)
        ),
        "pickle-os-system": pickled.enqueue("os.system", touch("pickle-os-system")),
        "os-system": as_json.enqueue("os.system", touch("os-system")),
        "subprocess-call": as_json.enqueue("subprocess.call", ["touch", f"{proof_dir}/subprocess-call"]),
        "extra-arg": as_json.enqueue(EVALUATE_JOB, 900002, "extra", job_id=job_id(prefix, 900002)),
        "kwargs": as_json.enqueue(EVALUATE_JOB, 900003, settings={"x": 1}, job_id=job_id(prefix, 900003)),
        "string-id": as_json.enqueue(EVALUATE_JOB, "900004", job_id=f"{prefix}-submission-900004"),
        "bool-id": as_json.enqueue(EVALUATE_JOB, True, job_id=job_id(prefix, 900006)),
        "foreign-id": as_json.enqueue(EVALUATE_JOB, 900005, job_id="not-this-deployments-id"),
        # The provenance check under a submission's job id, with a string id, with keywords.
        "check-as-evaluation": as_json.enqueue(PROVENANCE_JOB, 900020, job_id=job_id(prefix, 900020)),
        "check-string-id": as_json.enqueue(PROVENANCE_JOB, "900021", job_id=f"{prefix}-provenance-900021"),
        "check-kwargs": as_json.enqueue(
            PROVENANCE_JOB, 900022, settings={"x": 1}, job_id=provenance_job_id(prefix, 900022)
        ),
        "evaluation-as-check": as_json.enqueue(
            EVALUATE_JOB, 900023, job_id=provenance_job_id(prefix, 900023)
        ),
    }
    for offset, hook in enumerate(("on_success", "on_failure", "on_stopped")):
        submission = 900010 + offset
        jobs[hook] = as_json.enqueue(
            EVALUATE_JOB, submission, job_id=job_id(prefix, submission), **{hook: Callback("os.system")}
        )
    ids = {key: job.id for key, job in jobs.items()}
    # Hashes RQ cannot load at all (a bad date; a payload that is not even a job).
    for bad in ("unloadable-date", "unloadable-data"):
        fields = {"data": pickle.dumps(RunsOnUnpickle(touch(bad))), "status": "queued"}
        if bad == "unloadable-date":
            fields["created_at"] = "not a date"
        redis.hset(Job.key_for(bad), mapping=fields)
        redis.rpush(as_json.key, bad)
        ids[bad] = bad
    redis.close()
    return ids


REFUSALS = {
    "pickle-arg": "unreadable payload",
    "pickle-os-system": "unreadable payload",
    "os-system": "'os.system' is not autorl_evaluator.jobs.evaluate",
    "subprocess-call": "'subprocess.call' is not autorl_evaluator.jobs.evaluate",
    "extra-arg": "exactly one integer",
    "kwargs": "keyword arguments",
    "string-id": "exactly one integer",
    "bool-id": "exactly one integer",
    "foreign-id": "job id is not",
    "check-as-evaluation": "job id is not",
    "check-string-id": "exactly one integer",
    "check-kwargs": "keyword arguments",
    "evaluation-as-check": "job id is not",
    "on_success": "callbacks given",
    "on_failure": "callbacks given",
    "on_stopped": "callbacks given",
    "unloadable-date": "unreadable job",
    "unloadable-data": "unreadable payload",
}


def test_each_hostile_job_is_refused_and_removed_before_anything_runs(
    settings: DeploymentSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proof_dir = tmp_path / "proof"
    proof_dir.mkdir()
    hostile = push_hostile_jobs(settings, proof_dir)
    redis = Redis.from_url(settings.redis_url or "")
    # No dispatcher: every job reaches the worker's own check (a dispatcher would drop some first).
    worker = InProcessEvaluationWorker(
        [evaluation_queue(settings.queue_name, redis)], connection=redis, key_prefix=settings.redis_key_prefix
    )
    with caplog.at_level(logging.WARNING, logger="autorl.evaluator.rq"):
        worker.work(burst=True)
    assert sorted(p.name for p in proof_dir.iterdir()) == []
    assert [name for name, job in hostile.items() if redis.exists(Job.key_for(job))] == []
    refused = {r.getMessage() for r in caplog.records if "event=job_refused" in r.getMessage()}
    for name, job in hostile.items():
        line = next((m for m in refused if f"job={job!r}" in m), "")
        assert REFUSALS[name] in line, (name, line)


def test_worker_process_survives_hostile_jobs_then_scores_a_submission(
    settings: DeploymentSettings,
    rq_worker: subprocess.Popen[bytes],
    worker_log: Path,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    proof_dir = tmp_path / "proof"
    proof_dir.mkdir()
    wait_for(lambda: "Listening on" in worker_log.read_text(), "the worker to listen", 180, log=worker_log)
    push_hostile_jobs(settings, proof_dir)
    redis = Redis.from_url(settings.redis_url or "")
    queue = evaluation_queue(settings.queue_name, redis)
    wait_for(lambda: redis.llen(queue.key) == 0, "the worker to take every job", 180, log=worker_log)
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path))
        copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
        response = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "scored", response.json()
    assert rq_worker.poll() is None, worker_log.read_text()[-3000:]
    assert sorted(p.name for p in proof_dir.iterdir()) == []
    assert redis.llen(queue.key) == 0 and redis.llen(queue.intermediate_queue_key) == 0
    assert "event=job_refused" in worker_log.read_text()


def test_worker_and_grader_refuse_stores_without_a_password(
    settings: DeploymentSettings, make_settings: Callable[..., DeploymentSettings]
) -> None:
    open_redis = without_password(settings.redis_url or "")
    open_postgres = "postgresql+psycopg://postgres@127.0.0.1:5432/autorl"
    for variable, url in (("AUTORL_REDIS_URL", open_redis), ("AUTORL_DATABASE_URL", open_postgres)):
        started = time.monotonic()
        done = subprocess.run(
            [AUTORL, "worker", "--burst"],
            env={**service_env(settings), variable: url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0 and f"{variable} has no password" in done.stderr, done.stderr
        assert time.monotonic() - started < 60
        with pytest.raises(ConfigurationError, match=f"{variable} has no password"):
            create_app(make_settings(**{variable.removeprefix("AUTORL_").lower(): url}))
    # The embedded single-machine mode (`autorl run`) keeps working without passwords.
    create_app(make_settings(redis_url=open_redis, database_url=open_postgres, local_mode=True))
