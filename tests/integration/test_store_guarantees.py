"""What the store guarantees an experiment, on SQLite (single machine) and Postgres (cluster) alike:
limits hold under concurrent submits, submissions only inside the budget, a finished experiment's
unevaluated submissions are cancelled (a late result no longer counts), and queue positions count
only the experiment's own queue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from autorl.store import Database, claims, experiments, outcomes, submission_filters, submissions
from autorl_grader.main import create_app
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    copy_model,
    new_experiment,
    row_id,
    submit_copy,
    submit_no_wait,
)
from tests.support.infra import serve
from tests.support.settings import DeploymentSettings

CONCURRENT_SUBMITS = 30
LIMIT = 3


@pytest.fixture(params=["sqlite", "postgres"])
def settings(
    request: pytest.FixtureRequest, make_settings: Callable[..., DeploymentSettings]
) -> DeploymentSettings:
    if request.param == "sqlite":  # the single-machine default: SQLite in the home, local workers
        return make_settings(local_mode=True, submit_wait_s=0.0)
    return make_settings(database_url=request.getfixturevalue("pg_url"), submit_wait_s=0.0)


def test_concurrent_submits_never_exceed_the_limit(
    settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    # Every submit in flight at once: the limit refuses, not the fair share (test_fair_share.py).
    settings = settings.model_copy(update={"agent_requests_in_flight": CONCURRENT_SUBMITS})
    app = create_app(settings, reconcile=False)
    with serve(app) as grader, TestClient(app) as admin:
        experiment = new_experiment(admin, settings, tiny_base_model, tmp_path, max_submissions=LIMIT)
        copy_model(tiny_base_model, experiment.output_dir / "ckpt", unique=True)
        url = f"{grader.url}{experiment.url_path}/submit?wait=false"

        def one(_: int) -> httpx.Response:
            return httpx.post(url, json={"model_path": "output/ckpt"}, timeout=120)

        with ThreadPoolExecutor(CONCURRENT_SUBMITS) as pool:
            responses = list(pool.map(one, range(CONCURRENT_SUBMITS)))
    assert Counter(r.status_code for r in responses) == {202: LIMIT, 429: CONCURRENT_SUBMITS - LIMIT}
    refused = next(r for r in responses if r.status_code == 429)
    assert "limit of 3" in refused.json()["detail"]
    with db.session() as session:
        stored = submissions.experiment_submissions(
            session, experiments.get_experiment(session, experiment.name)
        )
        assert len(stored) == LIMIT


def test_finishing_cancels_what_was_not_evaluated_and_freezes_the_numbers(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    ids = []
    for name in ("scored", "running", "queued"):
        grading.copy(experiment, name)
        ids.append(submit_no_wait(grading.client, experiment, f"output/{name}").json()["submission_id"])
    agent_numbers = dict(zip(("scored", "running", "queued"), ids, strict=True))
    scored, running, queued = (row_id(grading.db, experiment, number) for number in ids)
    with grading.db.session() as session:
        assert claims.claim(session, scored, worker="w1", lease_s=60)
        assert outcomes.record_score(
            session, scored, worker="w1", scores={"opencompass": 40.0}, n_samples=4, seconds=1
        )
        assert claims.claim(session, running, worker="w2", lease_s=60)

    finished = grading.client.post(
        f"/v1/experiments/{experiment.name}/finish",
        json={"status": "timed_out"},
        headers=admin_headers(grading.settings),
    ).json()
    with (
        grading.db.session() as session
    ):  # the evaluation in flight ends after the experiment: it does not count
        assert not outcomes.record_score(
            session, running, worker="w2", scores={"opencompass": 99.0}, n_samples=4, seconds=1
        )
        assert not claims.claim(session, queued, worker="w3", lease_s=60)
    assert finished["in_flight"] == 0 and finished["submissions"] == 1 and finished["best_score"] == 40.0
    later = grading.client.get(
        f"/v1/experiments/{experiment.name}", headers=admin_headers(grading.settings)
    ).json()
    numbers = ("baseline_score", "best_score", "improvement", "submissions", "total_submissions", "in_flight")
    assert {k: later[k] for k in numbers} == {k: finished[k] for k in numbers}
    rows = {
        s["submission_id"]: s
        for s in grading.client.get(f"{experiment.url_path}/scores").json()["submissions"]
    }
    assert rows[agent_numbers["scored"]]["status"] == "scored"
    for cancelled in (agent_numbers["running"], agent_numbers["queued"]):
        assert rows[cancelled]["status"] == "failed" and rows[cancelled]["score"] is None
        assert rows[cancelled]["error"].startswith("cancelled: the experiment finished")


def test_queue_positions_count_only_the_experiments_own_queue(grading: Grader) -> None:
    flooding = grading.register()
    quiet = grading.register()
    positions = []
    for index in range(3):
        grading.copy(flooding, f"f{index}")
        positions.append(
            submit_no_wait(grading.client, flooding, f"output/f{index}").json()["queue_position"]
        )
    grading.copy(quiet, "q")
    mine = submit_no_wait(grading.client, quiet, "output/q").json()
    assert positions == [1, 2, 3]
    assert mine["queue_position"] == 1  # another experiment's queue is not the caller's to see
    assert (
        grading.client.get(f"{quiet.url_path}/submissions/{mine['submission_id']}").json()["queue_position"]
        == 1
    )


def test_only_an_error_that_begins_with_the_evaluator_fault_prefix_is_the_evaluator_s(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    """On SQLite as on PostgreSQL the prefix is compared exactly (SQLite's LIKE ignores case), and
    a long error keeps its beginning, so a long evaluator fault stays the evaluator's."""
    from autorl.errors import EVALUATOR_FAULT_PREFIX
    from autorl.store.models import FailureReason

    errors = {
        "exact": f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault): the engine did not start",
        "long": f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault): " + "log line\n" * 1000,
        "other_case": "Evaluator Error: looks like the prefix",
        "checkpoint": "the model does not load",
    }
    ids = {}
    for name, error in errors.items():
        ids[name] = submit_copy(grading.client, grading.db, experiment, grading.base_model, name)
        with grading.db.session() as session:
            assert claims.claim(session, ids[name], worker="worker-1", lease_s=60)
        with grading.db.session() as session:
            outcomes.record_failure(
                session, ids[name], error=error, reason=FailureReason.EVALUATION, worker="worker-1"
            )
    with grading.db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        assert submissions.limited_submissions_count(session, row) == 2  # other_case and checkpoint
        stored = {name: submissions.get_submission(session, ids[name]) for name in errors}
        assert [name for name, sub in stored.items() if submission_filters.failed_for_the_platform(sub)] == [
            "exact",
            "long",
        ]
        long_error = stored["long"].error or ""
        assert len(long_error) <= outcomes.MAX_ERROR_CHARS and long_error.endswith("log line\n")
