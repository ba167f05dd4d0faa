"""The agent API in the reference AutoRL-Bench's shape, against a real grader and Postgres: every
refusal carries `error` beside `detail`, a missing `model_path` is a 400, `/health` lists
`available_gpus`, `/set_baseline` is refused, answers carry `timestamp` and `elapsed_seconds`.

Scored answers and scores.json are covered end to end in tests/e2e/test_reference_agents.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from tests.support.grading import RegisteredExperiment, admin_headers, copy_model, submit_accepted
from tests.support.settings import DeploymentSettings


def refusal(response: Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == body["detail"], body
    assert all(word in body["error"] for word in words), body
    return str(body["error"])


@pytest.mark.parametrize(
    "body",
    [{}, {"model_path": ""}, {"model_path": None}, {"path": "output/x"}, {"gpu": "0"}, None],
    ids=["empty-object", "empty-string", "null", "other-field", "only-gpu", "no-body"],
)
def test_a_missing_model_path_is_a_400_naming_the_field(
    client: TestClient, experiment: RegisteredExperiment, body: dict[str, object] | None
) -> None:
    response = client.post(f"{experiment.url_path}/submit", json=body)
    refusal(response, 400, "model_path", "OUTPUT_DIR")


def test_a_form_body_is_a_400_that_names_the_json_header(
    client: TestClient, experiment: RegisteredExperiment
) -> None:
    """`curl -d '{"model_path": ...}'` without `-H 'Content-Type: application/json'` sends a form."""
    response = client.post(
        f"{experiment.url_path}/submit",
        content='{"model_path": "output/v1"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    refusal(response, 400, "model_path", "Content-Type: application/json")


@pytest.mark.parametrize(
    ("content", "word"),
    [
        ('{"model_path": 7}', "model_path"),
        ('{"model_path": ["a"]}', "model_path"),
        ("[1, 2]", "body"),
        ("{not json", "JSON"),
    ],
)
def test_other_malformed_bodies_stay_422(
    client: TestClient, experiment: RegisteredExperiment, content: str, word: str
) -> None:
    response = client.post(
        f"{experiment.url_path}/submit", content=content, headers={"Content-Type": "application/json"}
    )
    refusal(response, 422, word)


def test_every_refusal_carries_error_beside_detail(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment, tiny_base_model: Path
) -> None:
    refusal(client.get("/scores"), 401, "GRADING_SERVER_URL")
    refusal(client.get("/a/not-a-token/time"), 401, "AUTORL_TOKEN")
    refusal(client.get(f"{experiment.url_path}/submissions/999999999"), 404)
    refusal(client.post(f"{experiment.url_path}/submit", json={"model_path": "models/x"}), 400, "OUTPUT_DIR")
    refusal(client.get(f"{experiment.url_path}/no-such-route"), 404)
    refusal(client.get(f"{experiment.url_path}/submit"), 405)
    refusal(client.get("/v1/experiments"), 401, "AUTORL_ADMIN_TOKEN")
    copy_model(tiny_base_model, experiment.output_dir / "late", unique=True)
    finished = client.post(
        f"/v1/experiments/{experiment.name}/finish",
        json={"status": "completed"},
        headers=admin_headers(settings),
    )
    assert finished.status_code == 200, finished.text
    refusal(
        client.post(f"{experiment.url_path}/submit", json={"model_path": "output/late"}), 409, "completed"
    )
    refusal(
        client.post(f"/v1/experiments/{experiment.name}/start", json={}, headers=admin_headers(settings)),
        409,
        "register a new one",
    )


@pytest.mark.parametrize("prefix", ["capability", "root", "no-token"])
def test_set_baseline_is_refused_and_changes_nothing(
    client: TestClient, experiment: RegisteredExperiment, prefix: str
) -> None:
    before = client.get(f"{experiment.url_path}/scores").json()["baseline_score"]
    route = {"capability": f"{experiment.url_path}/set_baseline", "root": "/set_baseline"}.get(
        prefix, "/set_baseline"
    )
    headers = experiment.bearer if prefix == "root" else {}
    refusal(
        client.post(route, json={"score": 100.0}, headers=headers),
        403,
        "baseline",
        "measured by the platform",
    )
    assert client.get(f"{experiment.url_path}/scores").json()["baseline_score"] == before


@pytest.mark.parametrize(
    ("visible", "listed"),
    [(None, []), ("", []), ("0", ["0"]), ("3, 1,2", ["1", "2", "3"]), ("10,9", ["9", "10"])],
)
def test_health_answers_task_workspace_and_gpus_as_the_reference(
    client: TestClient,
    experiment: RegisteredExperiment,
    monkeypatch: pytest.MonkeyPatch,
    visible: str | None,
    listed: list[str],
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    anonymous = client.get("/health")
    assert anonymous.status_code == 200
    assert anonymous.json() == {"status": "ok", "task": None, "workspace": None, "available_gpus": listed}
    own = {"status": "ok", "task": "gsm8k", "workspace": str(experiment.workspace), "available_gpus": listed}
    for answer in (
        client.get(f"{experiment.url_path}/health"),
        client.get("/health", headers=experiment.bearer),
    ):
        assert answer.status_code == 200 and answer.json() == own


def test_answers_carry_timestamp_and_elapsed_seconds(
    client: TestClient, experiment: RegisteredExperiment, tiny_base_model: Path
) -> None:
    copy_model(tiny_base_model, experiment.output_dir / "v1", unique=True)
    before = datetime.now(UTC).replace(microsecond=0)
    queued = submit_accepted(client, experiment, "output/v1")
    shown = client.get(f"{experiment.url_path}/submissions/{queued['submission_id']}").json()
    assert before <= datetime.fromisoformat(shown["timestamp"]) <= datetime.now(UTC)
    assert shown["elapsed_seconds"] is None  # not answered yet (no worker runs here)
    listed = client.get(f"{experiment.url_path}/scores").json()["submissions"]
    assert [(s["timestamp"], s["elapsed_seconds"]) for s in listed] == [(shown["timestamp"], None)]


def test_the_openapi_document_lists_the_reference_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "400" in paths["/submit"]["post"]["responses"]
    assert "403" in paths["/set_baseline"]["post"]["responses"]
    assert "/health" in paths
