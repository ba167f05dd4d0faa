"""The grader's answers are its answer models: every JSON answer of a run through the agent API
(and the admin calls around it) validates against the response model the OpenAPI document declares
for its route and status code, and a view that produced a field its model does not declare fails
instead of sending it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from autorl.store import Database, SubmissionStatus, experiments, submissions
from autorl.store.models import utcnow
from autorl_grader import views
from autorl_grader.main import create_app
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    copy_model,
    row_id,
)
from tests.support.openapi import assert_matches_document, grader_document
from tests.support.settings import DeploymentSettings

DIGEST = "d" * 64


@pytest.fixture
def answers() -> list[httpx.Response]:
    return []


@pytest.fixture
def client(settings: DeploymentSettings, answers: list[httpx.Response]) -> Iterator[TestClient]:
    with TestClient(create_app(settings, reconcile=False)) as test_client:
        test_client.event_hooks["response"] = [lambda response: answers.append(response)]
        yield test_client


def grader_db(client: TestClient) -> Database:
    """The grader's own database handle (the test's client started it)."""
    db: Database = client.app.state.grader.db  # type: ignore[attr-defined]
    return db


def finish_evaluation(
    db: Database, submission_id: int, *, correctness: str | None, error: str | None = None
) -> None:
    """Stand in for the worker that evaluated it: scored with ``correctness``, else failed."""
    with db.session() as session:
        row = submissions.get_submission(session, submission_id)
        row.finished_at, row.eval_seconds = utcnow(), 1.5
        if correctness is None:
            row.status, row.error = SubmissionStatus.FAILED, error
            return
        score = 100 * correctness.count("1") / len(correctness)
        row.status, row.n_samples = SubmissionStatus.SCORED, len(correctness)
        row.score = row.score_opencompass = row.score_flexible = row.score_strict = score
        row.correctness, row.problems_digest = correctness, DIGEST


def submit(client: TestClient, experiment: RegisteredExperiment, body: Any, **params: str) -> httpx.Response:
    return client.post(f"{experiment.url_path}/submit", json=body, params=params)


def test_every_answer_of_a_run_matches_the_model_its_document_declares(
    client: TestClient,
    experiment: RegisteredExperiment,
    settings: DeploymentSettings,
    tiny_base_model: Path,
    answers: list[httpx.Response],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin, db = admin_headers(settings), grader_db(client)
    baseline = client.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin)
    assert baseline.status_code == 202
    finish_evaluation(db, baseline.json()["submission_id"], correctness="1100000000")

    copy_model(tiny_base_model, experiment.output_dir / "one", unique=True)
    pending = submit(client, experiment, {"model_path": "output/one"}, wait="false")
    assert pending.status_code == 202 and pending.json()["status"] == "queued"
    first = pending.json()["submission_id"]
    assert client.get(f"{experiment.url_path}/submissions/{first}").json()["queue_position"] == 1
    finish_evaluation(db, row_id(db, experiment, first), correctness="1111000000")

    shutil.copytree(experiment.output_dir / "one", experiment.output_dir / "two")
    reused = submit(client, experiment, {"model_path": "output/two"})  # the same files: scored at once
    assert reused.status_code == 200, reused.text
    body = reused.json()
    assert body["status"] == "scored" and body["comparison"]["discordant"] == [2, 0]
    assert "queue_position" not in body and body["error"] is None and body["reused_from"] == first

    copy_model(tiny_base_model, experiment.output_dir / "three", unique=True)
    failing = submit(client, experiment, {"model_path": "output/three"}, wait="false").json()["submission_id"]
    finish_evaluation(
        db, row_id(db, experiment, failing), correctness=None, error="the model's config does not load"
    )
    failed = client.get(f"/submissions/{failing}", headers=experiment.bearer).json()
    # The contract's nulls stay in the answer: a failed evaluation has a null score and interval.
    assert failed["status"] == "failed" and failed["score"] is None and failed["interval"] is None

    for path in ("/scores", "/time", "/health", f"/submissions/{first}"):
        assert client.get(f"{experiment.url_path}{path}").status_code == 200
    assert client.get("/health").json()["task"] is None
    # Refusals are answers too.
    assert client.get(f"{experiment.url_path}/submissions/999999").status_code == 404
    assert submit(client, experiment, {"model_path": "output/none"}).status_code == 400
    assert submit(client, experiment, {"model_path": 7}).status_code == 422
    assert client.post(f"{experiment.url_path}/final", json={"submission_id": first}).status_code == 409
    assert client.post(f"{experiment.url_path}/set_baseline").status_code == 403
    assert client.get("/time", headers={"Authorization": "Bearer nope"}).status_code == 401
    for path in ("", "/submissions"):
        assert client.get(f"/v1/experiments/{experiment.name}{path}", headers=admin).status_code == 200

    document = grader_document()
    for response in answers:
        assert_matches_document(document, response)
    statuses = {(r.request.url.path.replace(experiment.url_path, ""), r.status_code) for r in answers}
    assert {("/submit", 200), ("/submit", 202), ("/scores", 200), ("/time", 200)} <= statuses

    # A view that produced a field its model does not declare fails instead of sending it.
    leaking = {"interval": None, "comparison": None, "leak": 1}
    monkeypatch.setattr(views, "uncertainty_view", lambda *_: leaking)
    with db.session() as session:
        row = submissions.get_submission(session, first)
        with pytest.raises(ValidationError, match="leak"):
            views.submission_view(session, experiments.get_experiment(session, experiment.name), row)
