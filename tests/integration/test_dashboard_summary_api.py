"""The dashboard's agent summary JSON against real Postgres: the grader's experiments grouped by task,
agent, base model and feedback mode with their counts and best and mean scores, only for a
signed-in operator."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autorl.store import Database, experiments
from autorl_grader.main import create_app
from tests.support.runs import add_submission, create_experiment, finish, scores, sealed_experiment
from tests.support.settings import DeploymentSettings

BASE = "https://testserver"  # the session cookie is Secure: the test client must speak https


@pytest.fixture
def pg_url(fresh_pg_url: str) -> str:
    """A database of each test's own: every test reads the summary of every experiment there is."""
    return fresh_pg_url


def seed(
    db: Database, workspace: Path, agent: str | None, baseline: float, *best: float, status: str = ""
) -> str:
    """An experiment of ``agent`` with its baseline and one scored submission per ``best`` value."""
    run = create_experiment(db, workspace)
    with db.session() as session:
        experiments.get_experiment(session, run.name).agent = agent
    add_submission(db, run.name, scores=scores(baseline), baseline=True)
    for minute, value in enumerate(best, start=1):
        add_submission(db, run.name, scores=scores(value), minutes=minute)
    if status:
        finish(db, run.name, status)
    return run.name


def test_summary_groups_the_experiments(settings: DeploymentSettings, db: Database, tmp_path: Path) -> None:
    seed(db, tmp_path / "a", "example_grpo", 10.0, 12.0, 30.0, status="completed")
    seed(db, tmp_path / "b", "example_grpo", 10.0, 20.0, status="completed")
    seed(db, tmp_path / "c", "example_grpo", 10.0)  # running, nothing scored yet
    seed(db, tmp_path / "d", "<b>claude</b>\u202e", 10.0, 40.0, status="failed")
    seed(db, tmp_path / "e", None, 10.0, 5.0, status="completed")
    seed(db, tmp_path / "f", "timed", 10.0, 15.0, status="timed_out")
    assert settings.admin_token is not None
    with TestClient(create_app(settings, reconcile=False), base_url=BASE) as client:
        assert client.get("/ui/api/summary").status_code == 401
        assert client.get("/ui/summary", follow_redirects=False).headers["location"] == "/ui/login"
        token = settings.admin_token.get_secret_value()
        assert client.post("/ui/login", data={"token": token}, follow_redirects=False).status_code == 303
        response = client.get("/ui/api/summary")
        assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
        assert "summary.js" in client.get("/ui/summary").text
    groups = response.json()["groups"]
    assert [g["agent"] for g in groups] == ["<b>claude</b>\\u202e", "example_grpo", "timed", "–"]
    claude, grpo, timed, none = groups
    assert grpo == {
        "task": "gsm8k",
        "agent": "example_grpo",
        "model": "builtin:tiny-qwen2",
        "feedback": "test",
        "runs": 3,
        "succeeded": 2,
        "scored_runs": 2,
        "submissions": 3,
        "baseline": 10.0,
        "best_score": 30.0,
        "mean_best_score": 25.0,
        "best_improvement": 20.0,
        "mean_improvement": 15.0,
    }
    # A failed experiment is not a success, whatever it scored.
    assert (claude["runs"], claude["succeeded"], claude["best_score"]) == (1, 0, 40.0)
    assert (none["best_improvement"], none["succeeded"]) == (-5.0, 1)
    # An experiment whose budget ran out completed, as its results row says (autorl results --grader).
    assert (timed["runs"], timed["succeeded"]) == (1, 1)


def test_sealed_experiments_are_grouped_apart_and_summarised_by_their_final_on_test(
    settings: DeploymentSettings, db: Database, tmp_path: Path
) -> None:
    seed(db, tmp_path / "a", "both_modes", 10.0, 12.0, 30.0, status="completed")
    sealed = sealed_experiment(db, tmp_path / "sealed")  # 60 % the best on validation
    with db.session() as session:
        experiments.get_experiment(session, sealed.run.name).agent = "both_modes"
    finish(db, sealed.run.name, "completed")
    assert settings.admin_token is not None
    with TestClient(create_app(settings, reconcile=False), base_url=BASE) as client:
        token = settings.admin_token.get_secret_value()
        assert client.post("/ui/login", data={"token": token}, follow_redirects=False).status_code == 303
        groups = client.get("/ui/api/summary").json()["groups"]
    by_mode = {g["feedback"]: g for g in groups if g["agent"] == "both_modes"}
    assert set(by_mode) == {"test", "sealed"}
    assert (by_mode["test"]["runs"], by_mode["test"]["best_score"]) == (1, 30.0)
    # Every number on test: the final evaluation (50 %) against the baseline on test (10 %), not
    # the best on validation (60 %) against either baseline; the final is not an agent submission.
    assert by_mode["sealed"] == {
        "task": "gsm8k",
        "agent": "both_modes",
        "model": "builtin:tiny-qwen2",
        "feedback": "sealed",
        "runs": 1,
        "succeeded": 1,
        "scored_runs": 1,
        "submissions": 2,
        "baseline": 10.0,
        "best_score": 50.0,
        "mean_best_score": 50.0,
        "best_improvement": 40.0,
        "mean_improvement": 40.0,
    }
