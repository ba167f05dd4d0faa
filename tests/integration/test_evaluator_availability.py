"""The grader knows whether evaluators take an experiment's work: workers report themselves alive
(queue, backends) and stop reporting when they stop. A baseline no evaluator takes says so, with its
queue position, and past ``AUTORL_BASELINE_UNAVAILABLE_S`` becomes ``EvaluatorsUnavailable`` with the
fix; a worker that appears takes it and the wait ends. Real processes: `autorl grader`, `autorl
worker` (RQ on a private Redis), Postgres."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.grading import admin_headers, make_workspace, register
from tests.support.service_processes import running, serving_grader
from tests.support.settings import DeploymentSettings

WAIT_S = 90.0


def poll(
    client: httpx.Client, path: str, headers: dict[str, str], check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        view: dict[str, Any] = client.get(path, headers=headers).json()
        if check(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def test_a_baseline_no_evaluator_takes_is_reported_with_the_fix_and_taken_once_one_appears(
    make_isolated_settings: Callable[..., DeploymentSettings], tiny_base_model: Path, tmp_path: Path
) -> None:
    # A database and queue of its own: queue positions and evaluator counts are this test's alone.
    settings = make_isolated_settings(
        eval_limit=2,
        eval_max_new_tokens=8,
        baseline_unavailable_s=1.0,
        evaluator_heartbeat_s=0.5,
    )
    admin = admin_headers(settings)
    with serving_grader(settings, tmp_path / "grader.log") as (_, client):
        experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path), start=False)
        path = f"/v1/experiments/{experiment.name}"
        assert client.post(f"{path}/baseline", headers=admin).status_code == 202

        first = client.get(path, headers=admin).json()
        assert first["evaluators"] == 0 and first["baseline_status"] == "queued"
        assert first["waiting"]["queue_position"] == 1
        stuck = poll(client, path, admin, lambda v: v["waiting"]["reason"] == "EvaluatorsUnavailable")
        message = stuck["waiting"]["message"]
        assert "queue position 1" in message and "no evaluator takes hf work" in message
        assert (
            "kubectl get pods -l app.kubernetes.io/component=evaluator" in message
            and "autorl worker" in message
        )
        assert stuck["status"] == "pending"  # waiting, not failed

        with running(["worker"], settings, tmp_path / "worker.log"):
            scored = poll(client, path, admin, lambda v: v["baseline_status"] == "scored")
            assert scored["waiting"] is None and scored["evaluators"] == 1
        # A worker that stops deletes its report: nobody takes this experiment's work any more.
        gone = client.get(path, headers=admin).json()
        assert gone["evaluators"] == 0


def test_only_evaluators_of_the_experiments_queue_and_backend_count(
    make_settings: Callable[..., DeploymentSettings], fresh_pg_url: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    """A worker of another deployment's queue, or one that cannot run the experiment's backend (no
    OpenCompass command), is not counted as taking its work."""
    from autorl.store import Database, evaluator_presence

    settings = make_settings(database_url=fresh_pg_url, evaluator_heartbeat_s=0.5, baseline_unavailable_s=0.0)
    db = Database(fresh_pg_url)
    try:
        with serving_grader(
            settings.model_copy(update={"eval_backend": "opencompass"}), tmp_path / "g.log"
        ) as (
            _,
            client,
        ):
            experiment = register(client, settings, tiny_base_model, make_workspace(tmp_path), start=False)
            path = f"/v1/experiments/{experiment.name}"
            admin = admin_headers(settings)
            client.post(f"{path}/baseline", headers=admin)
            with db.session() as session:  # as two live workers report themselves
                evaluator_presence.report_evaluator(
                    session, name="other-deployment", queue="other-eval", backends=["hf"]
                )
                evaluator_presence.report_evaluator(session, name="hf-only", queue="local", backends=["hf"])
                evaluator_presence.report_evaluator(
                    session, name="opencompass", queue="local", backends=["opencompass"]
                )
            both = client.get(path, headers=admin).json()
            assert both["evaluators"] == 1 and both["waiting"]["reason"] == "WaitingForEvaluator"
            with db.session() as session:
                evaluator_presence.forget_evaluator(session, "opencompass")
            view = client.get(path, headers=admin).json()
            assert view["eval_config"]["backend"] == "opencompass"
            assert view["evaluators"] == 0
            assert view["waiting"]["reason"] == "EvaluatorsUnavailable"
            assert "no evaluator takes opencompass work" in view["waiting"]["message"]
    finally:
        with db.session() as session:
            for name in ("other-deployment", "hf-only", "opencompass"):
                evaluator_presence.forget_evaluator(session, name)
        db.dispose()
