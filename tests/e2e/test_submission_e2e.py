"""The spine, end to end with every part real: a trained tiny model is submitted over HTTP through
the capability URL, committed to Postgres, queued in Redis, evaluated by an `autorl worker` RQ
process and scored; the blocking /submit answers with the score."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer

from autorl.queue import job_id
from autorl.tasks.gsm8k import accuracy
from autorl_grader.main import create_app
from tests.support.grading import make_workspace, row_id
from tests.support.infra import serve
from tests.support.models import EVAL_MAX_NEW_TOKENS, TrainedModel
from tests.support.reference import REFERENCE_BEST_FIELDS
from tests.support.service_processes import running
from tests.support.settings import DeploymentSettings

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(make_isolated_settings: Callable[..., DeploymentSettings]) -> DeploymentSettings:
    # A database and queue of its own: the worker takes whatever its database has queued.
    return make_isolated_settings(eval_max_new_tokens=EVAL_MAX_NEW_TOKENS, submit_wait_s=300.0)


@pytest.fixture
def rq_worker(settings: DeploymentSettings) -> Iterator[subprocess.Popen[bytes]]:
    """`autorl worker` as its own process, configured only through the environment."""
    with running(["worker"], settings, settings.home / "worker.log") as worker:
        yield worker


def test_trained_model_is_scored_end_to_end(
    settings: DeploymentSettings,
    trained_tiny_model: TrainedModel,
    tiny_base_model: Path,
    rq_worker: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    admin = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}  # type: ignore[union-attr]
    workspace = make_workspace(tmp_path)
    with serve(create_app(settings)) as grader, httpx.Client(base_url=grader.url, timeout=400) as http:
        registered = http.post(
            "/v1/experiments",
            headers=admin,
            json={
                "name": f"e2e-{tmp_path.name[-12:].lower().replace('_', '-')}",
                "task": "gsm8k",
                "model": "builtin:tiny-qwen2",
                "timeout_s": 3600,
                "workspace": str(workspace),
                "base_model_dir": str(tiny_base_model),
            },
        )
        assert registered.status_code == 201, registered.text
        name, capability_url = registered.json()["name"], registered.json()["grading_server_url"]
        capability_url = capability_url.replace(settings.public_url, grader.url)

        baseline = http.post(f"/v1/experiments/{name}/baseline", params={"wait": "true"}, headers=admin)
        assert baseline.status_code == 200, baseline.text
        assert baseline.json()["status"] == "scored", baseline.json()
        baseline_score = baseline.json()["score"]

        started = http.post(f"/v1/experiments/{name}/start", json={}, headers=admin)
        assert started.status_code == 200, started.text
        shutil.copytree(trained_tiny_model.path, workspace / "output" / "trained")
        # As reference agents do: the capability URL plus /submit, no header at all.
        response = httpx.post(f"{capability_url}/submit", json={"model_path": "output/trained"}, timeout=400)

    assert response.status_code == 200, response.text
    body = response.json()
    assert {
        "submission_id",
        "status",
        "score",
        "baseline_score",
        "improvement",
        "best",
        "total_submissions",
    } <= set(body)
    answers = [p.answer for p in trained_tiny_model.problems]
    expected = accuracy(list(trained_tiny_model.completions), answers, protocol="opencompass")
    assert body["status"] == "scored"
    assert 0 < body["score"] < 100
    assert body["score"] == pytest.approx(expected)
    assert body["scores"]["flexible"] == pytest.approx(
        accuracy(list(trained_tiny_model.completions), answers, protocol="flexible")
    )
    assert body["baseline_score"] == baseline_score
    assert body["improvement"] == pytest.approx(body["score"] - baseline_score)
    # best is the whole entry of the best submission, as the reference's is.
    assert body["best"] == {key: body[key] for key in REFERENCE_BEST_FIELDS}
    assert body["total_submissions"] == 1
    assert body["n_samples"] == len(answers)
    # The work went through Redis: RQ ran the job for this submission and kept its result.
    job = Job.fetch(
        job_id(settings.redis_key_prefix, row_id(settings.database_url, name, body["submission_id"])),
        connection=Redis.from_url(settings.redis_url or ""),
        serializer=JSONSerializer,
    )
    assert job.get_status() == "finished"
    assert rq_worker.poll() is None  # the worker is still there for the next job
