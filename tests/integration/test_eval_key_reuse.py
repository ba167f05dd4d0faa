"""The evaluation key decides reuse, with real evaluations: the first evaluation completes a key
with the split's hash and the package versions, the next experiment records them and takes the
cached baseline, a protocol change measures the baseline again, and a score computed on another
split is never reused under the experiment's key."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autorl import eval_config
from autorl.store import Database, Submission, experiments
from autorl.tasks import get_task
from autorl.tasks.base import Problem, split_sha256, write_problems
from autorl_evaluator.jobs import evaluate
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    copy_model,
    new_experiment,
    row_id,
)
from tests.support.settings import DeploymentSettings


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], fresh_pg_url: str) -> DeploymentSettings:
    return make_settings(
        database_url=fresh_pg_url, eval_backend="hf", eval_limit=2, eval_max_new_tokens=6, submit_wait_s=0.0
    )


def recorded(client: TestClient, settings: DeploymentSettings, name: str) -> dict[str, Any]:
    config: dict[str, Any] = client.get(f"/v1/experiments/{name}", headers=admin_headers(settings)).json()[
        "eval_config"
    ]
    return config


def keys(settings: DeploymentSettings, name: str) -> tuple[str, dict[int, str]]:
    """The experiment's key and each of its submissions' keys."""
    db = Database(settings.database_url or "")
    with db.session() as session:
        experiment = experiments.get_experiment(session, name)
        result = experiment.eval_key, {s.id: s.eval_key for s in experiment.submissions}
    db.dispose()
    return result


def baseline(client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment) -> Any:
    return client.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))


def test_the_baseline_is_reused_under_its_key_only(
    client: TestClient,
    settings: DeploymentSettings,
    tiny_base_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = copy_model(tiny_base_model, tmp_path / "base", unique=True)
    model = f"local:{tmp_path.name}"
    first = new_experiment(client, settings, base, tmp_path, model=model)
    assert recorded(client, settings, first.name)["data_sha256"] is None  # nothing evaluated yet

    queued = baseline(client, settings, first)
    assert queued.status_code == 202, queued.text
    assert evaluate(queued.json()["submission_id"], settings)["status"] == "scored"
    # The first evaluation completed the key with what the worker measured.
    completed = recorded(client, settings, first.name)
    split = get_task("gsm8k").load_test_problems(
        settings.eval_dir / "data", source_dir=settings.data_source_dir
    )
    assert completed["data_sha256"] == split_sha256(split)
    assert completed["backend_versions"] == {
        "torch": importlib.metadata.version("torch"),
        "transformers": importlib.metadata.version("transformers"),
    }
    first_key, first_submissions = keys(settings, first.name)
    assert set(first_submissions.values()) == {first_key}
    assert first_key == eval_config.EvalConfig.model_validate(completed).key

    # The next experiment records the measured facts: the same key, and the cached baseline.
    second = new_experiment(client, settings, base, tmp_path, model=model)
    assert recorded(client, settings, second.name) == completed
    assert keys(settings, second.name)[0] == first_key
    reused = baseline(client, settings, second)
    assert reused.status_code == 200 and reused.json()["eval_seconds"] == 0, reused.text

    # A protocol change: a new key, so the baseline is evaluated again, and not taken from the cache.
    monkeypatch.setattr(eval_config, "EVAL_PROTOCOL_VERSION", eval_config.EVAL_PROTOCOL_VERSION + 1)
    third = new_experiment(client, settings, base, tmp_path, model=model)
    third_key = keys(settings, third.name)[0]
    assert third_key != first_key
    measured_again = baseline(client, settings, third)
    assert measured_again.status_code == 202, measured_again.text
    assert evaluate(measured_again.json()["submission_id"], settings)["status"] == "scored"
    assert keys(settings, third.name) == (third_key, {measured_again.json()["submission_id"]: third_key})


def test_a_score_computed_on_another_split_is_not_reused(
    client: TestClient, experiment: RegisteredExperiment, settings: DeploymentSettings, tiny_base_model: Path
) -> None:
    queued = baseline(client, settings, experiment)
    assert evaluate(queued.json()["submission_id"], settings)["status"] == "scored"
    experiment_key, _ = keys(settings, experiment.name)

    # The evaluator's copy of the split changes under the experiment (its first problems stay).
    cached = settings.eval_dir / "data" / "gsm8k" / "test.jsonl"
    split = get_task("gsm8k").load_test_problems(settings.eval_dir / "data")
    write_problems(cached, [*split[:-1], Problem("How many legs have 2 cats?", "2 * 4 = 8\n#### 8")])

    copy_model(tiny_base_model, experiment.output_dir / "x", unique=True)
    submitted = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/x"})
    assert submitted.status_code == 202, submitted.text
    first_id = row_id(settings.database_url, experiment, submitted.json()["submission_id"])
    assert evaluate(first_id, settings)["status"] == "scored"
    # Scored under the key it was computed under; the experiment's key stays what it recorded.
    key, submissions = keys(settings, experiment.name)
    assert key == experiment_key and submissions[first_id] != experiment_key

    # The same files again: that score is under another key, so they are evaluated again.
    again = client.post(f"{experiment.url_path}/submit", json={"model_path": "output/x"})
    assert again.status_code == 202 and again.json()["status"] == "queued", again.text
    db = Database(settings.database_url or "")
    with db.session() as session:
        again_id = row_id(db, experiment, again.json()["submission_id"])
        assert session.get(Submission, again_id).reused_from is None  # type: ignore[union-attr]
    db.dispose()
