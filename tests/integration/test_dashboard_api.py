"""The dashboard's doors and data against real Postgres: only a signed-in operator gets in, every
route refuses agent credentials in every form, and the JSON shows what the store holds."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.layout import runner_log_subpath
from autorl.store import Database
from autorl_grader.dashboard.assets import (
    ASSETS,
    CHARTJS_FILE,
    CHARTJS_LICENSE_FILE,
    CHARTJS_SHA256,
    asset_bytes,
)
from autorl_grader.dashboard.log_tail import MAX_TAIL_BYTES
from autorl_grader.dashboard.session import COOKIE_NAME, SessionSigner
from autorl_grader.main import create_app
from tests.support.dashboard import dashboard_routes
from tests.support.runs import SeededExperiment, add_submission, create_experiment, scores, sealed_experiment
from tests.support.settings import DeploymentSettings

BASE = "https://testserver"  # the session cookie is Secure: the test client must speak https


@pytest.fixture
def admin_token(settings: DeploymentSettings) -> str:
    assert settings.admin_token is not None
    return settings.admin_token.get_secret_value()


@pytest.fixture
def client(settings: DeploymentSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, reconcile=False), base_url=BASE) as test_client:
        yield test_client


@pytest.fixture
def run(db: Database, tmp_path: Path) -> SeededExperiment:
    run = create_experiment(db, tmp_path / "workspace", started_minutes_ago=5)
    add_submission(db, run.name, scores=scores(10.0), files="base", baseline=True)
    add_submission(db, run.name, scores=scores(12.0, strict=11.0), minutes=1)
    add_submission(db, run.name, scores=scores(30.0), minutes=2)
    add_submission(db, run.name, files="base", minutes=3)  # a copy of the base model: reused
    add_submission(db, run.name, error="the chat template failed", minutes=4)
    add_submission(db, run.name)  # still queued
    return run


def sign_in(client: TestClient, token: str) -> str:
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return response.cookies[COOKIE_NAME]


def test_sign_in_sets_a_secure_http_only_strict_cookie_that_is_not_the_token(
    client: TestClient, admin_token: str
) -> None:
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/login"
    response = client.post("/ui/login", data={"token": admin_token}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui"
    cookie = response.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"secure", "httponly", "samesite", "path"} <= attributes
    assert "samesite=strict" in cookie.lower()
    value = response.cookies[COOKIE_NAME]
    token_hashes = {
        hashlib.sha256(admin_token.encode()).hexdigest(),
        hmac.new(admin_token.encode(), b"", hashlib.sha256).hexdigest(),
    }
    assert admin_token not in value and not any(h in value for h in token_hashes)
    page = client.get("/ui")
    assert page.status_code == 200 and "Experiments" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_wrong_tokens_do_not_sign_in(client: TestClient, run: SeededExperiment) -> None:
    for wrong in ("nope", run.token, ""):
        response = client.post("/ui/login", data={"token": wrong}, follow_redirects=False)
        assert response.status_code == 401
        assert COOKIE_NAME not in response.cookies
        assert "not the admin token" in response.text
    assert client.get("/ui/api/experiments").status_code == 401


def test_agent_credentials_are_refused_on_every_dashboard_route(
    client: TestClient, admin_token: str, run: SeededExperiment
) -> None:
    routes = dashboard_routes(client.app)  # type: ignore[arg-type]
    assert len(routes) >= 9, routes
    signed_in_cookie = sign_in(client, admin_token)
    for method, path in routes:
        # The agent's bearer token, even beside a valid operator session.
        client.cookies.set(COOKIE_NAME, signed_in_cookie)
        bearer = client.request(
            method, path, headers={"Authorization": f"Bearer {run.token}"}, follow_redirects=False
        )
        assert bearer.status_code == 403, (method, path, bearer.status_code)
        assert "agent tokens never open it" in bearer.json()["detail"]
        client.cookies.clear()
        # The agent's capability URL has no dashboard under it.
        capability = client.request(method, f"/a/{run.token}{path}", follow_redirects=False)
        assert capability.status_code in (401, 404, 405), (method, path, capability.status_code)
        # The agent's token as the session cookie.
        client.cookies.set(COOKIE_NAME, run.token)
        forged = client.request(method, path, follow_redirects=False)
        client.cookies.clear()
        assert forged.status_code in (303, 401) or (path == "/ui/login" and method == "GET"), (method, path)
        assert forged.status_code != 200 or "Sign in" in forged.text, (method, path)


def test_without_a_session_pages_redirect_and_data_is_401(client: TestClient, run: SeededExperiment) -> None:
    assert client.get(f"/ui/experiments/{run.name}", follow_redirects=False).status_code == 303
    for path in (
        "/ui/api/experiments",
        f"/ui/api/experiments/{run.name}",
        f"/ui/api/experiments/{run.name}/log",
    ):
        response = client.get(path)
        assert response.status_code == 401 and "/ui/login" in response.json()["detail"]
    assert client.get(f"/ui/static/{CHARTJS_FILE}").status_code == 401
    assert client.get("/ui/static/dashboard.js").status_code == 401
    assert client.get("/ui/static/dashboard.css").status_code == 200  # the sign-in page's own style
    client.cookies.set(COOKIE_NAME, SessionSigner("x" * 32).issue())  # signed with another key
    assert client.get("/ui/api/experiments").status_code == 401


def test_sign_out_ends_the_session(client: TestClient, admin_token: str) -> None:
    cookie = sign_in(client, admin_token)
    assert client.get("/ui/api/experiments").status_code == 200
    assert client.post("/ui/logout", follow_redirects=False).status_code == 303
    client.cookies.set(COOKIE_NAME, cookie)  # replayed after sign-out
    assert client.get("/ui/api/experiments").status_code == 401


def test_experiments_table_data(client: TestClient, admin_token: str, run: SeededExperiment) -> None:
    sign_in(client, admin_token)
    response = client.get("/ui/api/experiments")
    assert response.headers["cache-control"] == "no-store"
    rows = {r["name"]: r for r in response.json()["experiments"]}
    row = rows[run.name]
    assert row["phase"] == "running" and row["task"] == "gsm8k" and row["model"] == "builtin:tiny-qwen2"
    assert row["agent"] == "example_grpo"
    assert (row["baseline_score"], row["best_score"], row["improvement"]) == (10.0, 30.0, 20.0)
    assert (row["submissions"], row["total_submissions"], row["failed_submissions"]) == (3, 5, 1)
    assert row["queued"] == 1 and row["queue_position"] >= 1
    assert 3000 < row["remaining_s"] <= 3300


def test_the_limit_used_leaves_out_failures_of_the_platform(
    client: TestClient, admin_token: str, run: SeededExperiment, db: Database
) -> None:
    sign_in(client, admin_token)
    add_submission(db, run.name, error=f"{EVALUATOR_FAULT_PREFIX}: the engine died", minutes=4.5)
    row = client.get(f"/ui/api/experiments/{run.name}").json()["experiment"]
    # Six of the agent's, two failed: the chat template's failure counts, the evaluator's does not.
    assert (row["total_submissions"], row["failed_submissions"], row["counted_submissions"]) == (6, 2, 5)
    assert row["max_submissions"] == 100


def test_experiment_detail_has_a_series_per_protocol(
    client: TestClient, admin_token: str, run: SeededExperiment
) -> None:
    sign_in(client, admin_token)
    detail = client.get(f"/ui/api/experiments/{run.name}").json()
    chart = detail["chart"]
    assert chart["headline"] == "opencompass"
    assert set(chart["protocols"]) == {"opencompass", "flexible", "strict"}
    opencompass = chart["protocols"]["opencompass"]
    assert [p["score"] for p in opencompass["points"]] == [12.0, 30.0, 10.0]
    assert [round(p["t_s"] / 60) for p in opencompass["points"]] == [1, 2, 3]
    assert opencompass["baseline"] == 10.0
    assert opencompass["split"] == "test" and opencompass["final"] is None
    assert chart["protocols"]["strict"]["points"][0]["score"] == 11.0
    assert chart["protocols"]["flexible"]["baseline"] == 11.0
    best_id = opencompass["best_submission"]
    subs = {s["submission_id"]: s for s in detail["submissions"]}
    assert subs[best_id]["score"] == 30.0
    reused = [s for s in subs.values() if s["reused"]]
    assert len(reused) == 1 and reused[0]["eval_seconds"] == 0.0
    failed = [s for s in subs.values() if s["status"] == "failed"]
    assert failed[0]["error"] == "the chat template failed"
    queued = [s for s in subs.values() if s["status"] == "queued"]
    assert queued[0]["queue_position"] >= 1
    assert detail["metrics"]["copy_model_count"] == 1
    assert detail["metrics"]["score_trajectory"] == [12.0, 30.0, 10.0, None, None]
    missing = client.get("/ui/api/experiments/no-such-experiment")
    assert missing.status_code == 404 and "GET /v1/experiments" in missing.json()["detail"]


def test_a_sealed_experiment_is_shown_on_validation_with_its_final_on_test_apart(
    client: TestClient, admin_token: str, db: Database, tmp_path: Path
) -> None:
    sealed = sealed_experiment(db, tmp_path / "sealed")
    sign_in(client, admin_token)
    rows = {r["name"]: r for r in client.get("/ui/api/experiments").json()["experiments"]}
    row = rows[sealed.run.name]
    assert row["feedback"] == "sealed" and row["test_evaluations"] == 1
    # The agent's numbers on validation; the result on test apart, with its interval.
    assert (row["validation_baseline_score"], row["best_score"], row["improvement"]) == (20.0, 60.0, 40.0)
    assert row["baseline_score"] == 10.0
    final = row["final"]
    assert (final["submission_id"], final["of"], final["selection"]) == (
        sealed.final,
        sealed.nominated,
        "nominated",
    )
    assert final["score"] == 50.0 and final["interval"][0] < 50.0 < final["interval"][1]

    detail = client.get(f"/ui/api/experiments/{sealed.run.name}").json()
    opencompass = detail["chart"]["protocols"]["opencompass"]
    # The validation points against the baseline on validation; the final is not among them.
    assert opencompass["split"] == "validation" and opencompass["baseline"] == 20.0
    assert [p["submission_id"] for p in opencompass["points"]] == [sealed.nominated, sealed.best]
    assert opencompass["best_submission"] == sealed.best
    assert opencompass["final"] == {
        "submission_id": sealed.final,
        "of": sealed.nominated,
        "t_s": 720.0,
        "score": 50.0,
        "baseline": 10.0,
    }
    flexible = detail["chart"]["protocols"]["flexible"]  # each protocol's own final and baselines
    assert (flexible["baseline"], flexible["final"]["score"], flexible["final"]["baseline"]) == (
        21.0,
        51.0,
        11.0,
    )

    subs = {s["submission_id"]: s for s in detail["submissions"]}
    assert (
        subs[sealed.test_baseline]["split"] == "test"
        and subs[sealed.validation_baseline]["split"] == "validation"
    )
    assert subs[sealed.final]["split"] == "test" and subs[sealed.final]["final_of"] == sealed.nominated
    assert subs[sealed.nominated]["final_of"] is None
    # Each row is compared with the baseline on its own split: 50 % on test against 10 %, 30 % on
    # validation against 20 %.
    assert subs[sealed.final]["comparison"]["difference"] == 40.0
    assert subs[sealed.nominated]["comparison"]["difference"] == 10.0
    # The admin API's rows (what `autorl run` prints) are compared the same way.
    admin = client.get(
        f"/v1/experiments/{sealed.run.name}/submissions", headers={"Authorization": f"Bearer {admin_token}"}
    ).json()
    rows = {s["submission_id"]: s for s in admin}
    assert (rows[sealed.final]["baseline_score"], rows[sealed.final]["improvement"]) == (10.0, 40.0)
    assert rows[sealed.final]["comparison"] == subs[sealed.final]["comparison"]
    assert (rows[sealed.nominated]["baseline_score"], rows[sealed.nominated]["improvement"]) == (20.0, 10.0)


def test_agent_log_tail_is_capped_and_never_follows_links(
    client: TestClient, admin_token: str, run: SeededExperiment, tmp_path: Path
) -> None:
    sign_in(client, admin_token)
    url = f"/ui/api/experiments/{run.name}/log"
    assert client.get(url).json() == {
        "available": False,
        "text": "",
        "size_bytes": 0,
        "truncated": False,
        "reason": "no agent log yet",
    }
    log = run.workspace / "agent.log"
    lines = [f"step {i} reward {i / 100:.2f}" for i in range(20000)]
    log.write_text("\n".join(lines) + "\n")
    tail = client.get(url).json()
    assert tail["available"] and tail["truncated"] and tail["size_bytes"] == log.stat().st_size
    assert len(tail["text"].encode()) <= MAX_TAIL_BYTES
    assert tail["text"].startswith("step ") and tail["text"].endswith("step 19999 reward 199.99\n")
    # A link to a file outside the workspace is not read; nor is a FIFO (reading it would hang).
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("the admin's secret\n")
    log.unlink()
    log.symlink_to(secret)
    linked = client.get(url).json()
    assert not linked["available"] and "secret" not in linked["text"]
    log.unlink()
    os.mkfifo(log)
    assert client.get(url).json()["reason"] == "the agent log is not a plain file"


def test_dashboard_disabled_without_an_admin_token(
    make_settings: Callable[..., DeploymentSettings], pg_url: str
) -> None:
    settings = make_settings(database_url=pg_url, admin_token="", local_mode=True)
    with TestClient(create_app(settings, reconcile=False), base_url=BASE) as client:
        for path in ("/ui", "/ui/login"):
            response = client.get(path)
            assert response.status_code == 503 and "AUTORL_ADMIN_TOKEN" in response.json()["detail"]
        assert client.post("/ui/login", data={"token": ""}).status_code == 503


def test_chartjs_is_the_pinned_release_with_its_licence() -> None:
    assert hashlib.sha256(asset_bytes(CHARTJS_FILE)).hexdigest() == CHARTJS_SHA256
    assert b"Chart.js v4.6.1" in asset_bytes(CHARTJS_FILE)[:200]
    assert b"The MIT License" in asset_bytes(CHARTJS_LICENSE_FILE)
    for name in ASSETS:  # every allow-listed file ships in the package
        assert asset_bytes(name)
    with pytest.raises(KeyError):
        asset_bytes("../main.py")


def test_the_runners_log_is_served_apart_from_the_agents(
    client: TestClient, admin_token: str, run: SeededExperiment, settings: DeploymentSettings
) -> None:
    sign_in(client, admin_token)
    url = f"/ui/api/experiments/{run.name}/log"
    assert client.get(url, params={"source": "runner"}).json()["reason"].startswith("no runner log")
    events = settings.home / runner_log_subpath(run.name)
    events.parent.mkdir(parents=True)
    events.write_text("[autorl 12:00:00] event=agent_start sandbox=user\n")
    (run.workspace / "agent.log").write_text("[autorl 12:00:01] event=agent_finished forged\n")
    assert client.get(url, params={"source": "runner"}).json()["text"] == events.read_text()
    assert "forged" in client.get(url, params={"source": "agent"}).json()["text"]
    assert "forged" in client.get(url).json()["text"]  # the agent's log, as before
    assert client.get(url, params={"source": "grader"}).status_code == 422
