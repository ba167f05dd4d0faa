"""The dashboard's agent summary JSON against real Postgres: the grader's experiments grouped by task,
agent and base model with their counts and best and mean scores, only for a signed-in operator."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from autorl.store import Database
from autorl.store import repository as repo
from autorl_grader.main import create_app
from tests.integration.test_dashboard_api import db, settings
from tests.support.runs import add_submission, create_experiment, finish, scores
from tests.support.settings import DeploymentSettings

BASE = "https://testserver"  # the session cookie is Secure: the test client must speak https
__all__ = ["db", "settings"]  # the fixtures, shared with the dashboard's other API tests


def seed(
    db: Database, workspace: Path, agent: str | None, baseline: float, *best: float, status: str = ""
) -> str:
    """An experiment of ``agent`` with its baseline and one scored submission per ``best`` value."""
    run = create_experiment(db, workspace)
    with db.session() as session:
        repo.get_experiment(session, run.name).agent = agent
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
    assert [g["agent"] for g in groups] == ["<b>claude</b>\\u202e", "example_grpo", "–"]
    claude, grpo, none = groups
    assert grpo == {
        "task": "gsm8k",
        "agent": "example_grpo",
        "model": "builtin:tiny-qwen2",
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
