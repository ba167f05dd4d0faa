"""A cluster's provenance check through the real queue: the grader (real Postgres, a Redis that
requires a password) copies a finished experiment's files and queues the check under its own job
id; an RQ worker runs it and records ``test_overlap``; the grader's reconciler then removes the
copy, and asked again, the grader queues nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from autorl.provenance import agent_copy
from autorl.provenance.agent_copy import provenance_folder, read_manifest
from autorl.queue import provenance_job_id
from autorl.store import Database, experiments
from autorl.tasks import get_task
from autorl_evaluator.provenance import RECORDS_DIR
from autorl_evaluator.rq_worker import evaluation_queue
from autorl_grader.main import create_app
from autorl_grader.reconciler import reconcile_once
from tests.support.grading import admin_headers, make_workspace, register, work_the_queue
from tests.support.hostile_files import nest_past_path_max
from tests.support.settings import DeploymentSettings


def test_a_finished_experiments_check_is_queued_once_and_an_rq_worker_records_it(
    make_isolated_settings: Callable[..., DeploymentSettings],
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_isolated_settings(eval_limit=1, eval_max_new_tokens=2)
    task = get_task("gsm8k")
    data = settings.eval_dir / "data"
    test = task.load_test_problems(data, source_dir=settings.data_source_dir)
    validation = task.load_validation_problems(data, source_dir=settings.data_source_dir)
    redis = Redis.from_url(settings.redis_url or "")
    queue = evaluation_queue(settings.queue_name, redis)
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path), feedback="sealed")
        path = f"/v1/experiments/{experiment.name}"
        (experiment.output_dir / "mix.json").write_text(
            json.dumps([p.question for p in (*test[:2], validation[0])])
        )
        early = client.post(f"{path}/provenance/check", headers=admin_headers(settings))
        assert early.status_code == 409 and "finished" in early.json()["detail"]

        finished = client.post(
            f"{path}/finish", json={"status": "completed"}, headers=admin_headers(settings)
        )
        assert finished.status_code == 200, finished.text
        asked = client.post(f"{path}/provenance/check", headers=admin_headers(settings))
        assert asked.status_code == 200 and asked.json()["test_overlap"] is None, asked.text
        db = Database(settings.database_url or "")
        with db.session() as session:
            experiment_id = experiments.get_experiment(session, experiment.name).id
        folder = settings.snapshot_dir / provenance_folder(experiment_id)
        manifest = read_manifest(folder)
        assert manifest is not None and manifest["final"] is None
        assert manifest["final_note"] == "no final was scored on the test split"
        job = provenance_job_id(settings.redis_key_prefix, experiment_id)
        assert queue.job_ids == [job]
        # Asked again while the job waits: it stays the one job.
        client.post(f"{path}/provenance/check", headers=admin_headers(settings))
        assert queue.job_ids == [job]

        work_the_queue(settings, redis, db, monkeypatch)
        db.dispose()

        view = client.get(path, headers=admin_headers(settings)).json()
        assert view["test_overlap"] == 2 and view["twin_score"] is None
        record = json.loads((settings.eval_dir / RECORDS_DIR / f"{experiment.name}.json").read_text())
        assert record["test"]["files"] == [{"path": "output/mix.json", "problems": 2}]
        assert record["validation"]["files"] == [{"path": "output/mix.json", "problems": 1}]
        # Once recorded, the grader's reconciler removes the copy; asking again queues nothing.
        assert folder.exists()
        reconcile_once(client.app.state.grader)  # type: ignore[attr-defined]
        assert not folder.exists()
        again = client.post(f"{path}/provenance/check", headers=admin_headers(settings))
        assert again.json()["test_overlap"] == 2 and queue.job_ids == [] and not folder.exists()


def test_a_path_past_path_max_is_copied_and_a_copy_cut_by_its_budget_is_recorded_unverified(
    make_isolated_settings: Callable[..., DeploymentSettings],
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admin action answers 200, never 500, whatever the agent laid out: a question at the
    bottom of a path past PATH_MAX is copied and found; a copy cut by its entry budget (junk names
    before it) is recorded as made but unverified, and its copy removed like a complete one's."""
    settings = make_isolated_settings(eval_limit=1, eval_max_new_tokens=2)
    test = get_task("gsm8k").load_test_problems(
        settings.eval_dir / "data", source_dir=settings.data_source_dir
    )
    redis = Redis.from_url(settings.redis_url or "")
    monkeypatch.setattr(agent_copy, "COPY_ENTRIES", 60)
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path))
        path = f"/v1/experiments/{experiment.name}"
        nest_past_path_max(
            experiment.output_dir, "stolen.json", json.dumps([problem.question for problem in test[:2]])
        )
        junk = experiment.output_dir.parent / "junk"
        junk.mkdir()
        for index in range(100):
            (junk / f"{index}.safetensors").touch()
        assert client.post(
            f"{path}/finish", json={"status": "completed"}, headers=admin_headers(settings)
        ).is_success
        asked = client.post(f"{path}/provenance/check", headers=admin_headers(settings))
        assert asked.status_code == 200, asked.text
        db = Database(settings.database_url or "")
        with db.session() as session:
            experiment_id = experiments.get_experiment(session, experiment.name).id
        manifest = read_manifest(settings.snapshot_dir / provenance_folder(experiment_id))
        assert manifest is not None and manifest["copied"]["stopped_early"], manifest
        work_the_queue(settings, redis, db, monkeypatch)
        db.dispose()

        view = client.get(path, headers=admin_headers(settings)).json()
        assert (
            "test questions unverified: the copy stopped early (its 60-entry budget was reached)"
            in view["message"]
        )
        assert view["test_overlap"] in (None, 2)  # found before the budget ran out: a lower bound
        reconcile_once(client.app.state.grader)  # type: ignore[attr-defined]
        assert not (settings.snapshot_dir / provenance_folder(experiment_id)).exists()

        monkeypatch.setattr(agent_copy, "COPY_ENTRIES", 10_000)
        found = agent_copy.copy_text_files({"output": experiment.output_dir}, tmp_path / "whole")
        assert found.complete and found.files == 1
