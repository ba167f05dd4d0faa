"""The agent and admin APIs against real Postgres, with every refusal checked for its status code,
a message that names the fix, and no row written."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from autorl.api.answers import PendingAnswer, SubmissionAnswer
from autorl.api.request_bodies import MAX_MODEL_PATH_BYTES, MAX_MODEL_PATH_PARTS
from autorl.checkpoints import model_files
from autorl.client import SUBMIT
from autorl.errors import ConfigurationError
from autorl.experiment import MAX_BUDGET_S
from autorl.store import Database, SubmissionStatus, caches, claims, experiments, outcomes
from autorl.store import submissions as submission_store
from autorl.untrusted_text import printable
from autorl_evaluator.failures import EvaluatorFaultError, agent_message
from autorl_grader.main import create_app
from tests.support.checkpoints import read_safetensors, split_into_shards, write_safetensors
from tests.support.documents import claim
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    check_token_rotation,
    copy_model,
    new_experiment,
    row_id,
    submission_count,
)
from tests.support.runs import fail_evaluation, score_evaluation
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

#: What the tiny base model ships besides its weights and config.
TOKENIZER_FILES_OF_THE_BASE = (
    "generation_config.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
)


def submit(client: TestClient, experiment: RegisteredExperiment, model_path: str, **kwargs: Any) -> Any:
    return client.post(f"{experiment.url_path}/submit", json={"model_path": model_path}, **kwargs)


# -- authentication ----------------------------------------------------------------------------


def test_no_token_is_401_and_names_the_fix(client: TestClient) -> None:
    response = client.post("/submit", json={"model_path": "output/x"})
    assert response.status_code == 401
    assert "GRADING_SERVER_URL" in response.json()["detail"]


def test_wrong_token_is_401(client: TestClient, experiment: RegisteredExperiment) -> None:
    assert client.get("/a/not-a-token/time").status_code == 401
    response = client.get("/time", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert "AUTORL_TOKEN" in response.json()["detail"]


def test_capability_url_and_bearer_reach_the_same_experiment(
    client: TestClient, experiment: RegisteredExperiment
) -> None:
    by_url = client.get(f"{experiment.url_path}/time").json()
    by_header = client.get("/time", headers=experiment.bearer).json()
    assert by_url["timeout_s"] == by_header["timeout_s"] == 3600
    assert set(by_url) >= {
        "start_time",
        "timeout_s",
        "end_time",
        "remaining",
        "remaining_s",
        "last_submit_time",
    }


def test_admin_api_requires_the_admin_token(client: TestClient, experiment: RegisteredExperiment) -> None:
    assert client.get("/v1/experiments").status_code == 401
    response = client.get("/v1/experiments", headers=experiment.bearer)  # an agent token is not admin
    assert response.status_code == 401
    assert "AUTORL_ADMIN_TOKEN" in response.json()["detail"]


def test_grader_refuses_a_placeholder_admin_token(
    make_settings: Callable[..., DeploymentSettings], pg_url: str
) -> None:
    for token in ("", "changeme", "admin"):
        with pytest.raises(ConfigurationError, match="openssl rand"):  # as its settings are built
            make_settings(database_url=pg_url, admin_token=token)
    create_app(make_settings(database_url=pg_url, admin_token="", local_mode=True))  # fine on one machine


# -- checkpoint refusals -----------------------------------------------------------------------


def _prepare(kind: str, experiment: RegisteredExperiment, base: Path, tmp_path: Path) -> str:
    out = experiment.output_dir
    if kind == "outside":
        copy_model(base, tmp_path / "elsewhere")
        return str(tmp_path / "elsewhere")
    if kind == "symlink-escape":
        copy_model(base, tmp_path / "elsewhere")
        (out / "link").symlink_to(tmp_path / "elsewhere")
        return "output/link"
    if kind == "missing":
        return "output/never-saved"
    if kind == "file":
        (out / "model.safetensors").write_bytes(b"x")
        return "output/model.safetensors"
    target = copy_model(base, out / "ckpt")
    if kind == "no-config":
        (target / "config.json").unlink()
    elif kind == "no-safetensors":
        for weights in target.glob("*.safetensors"):
            weights.unlink()
    elif kind == "pickle":
        (target / "model.safetensors").unlink()
        (target / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    elif kind == "linked-weights":
        (target / "model.safetensors").unlink()
        (target / "model.safetensors").symlink_to(base / "model.safetensors")
    elif kind == "sparse":
        with (target / "model.safetensors").open("r+b") as handle:
            handle.truncate(8 * 1024**3)
    elif kind == "adapter":
        (target / "adapter_config.json").write_text("{}")
    elif kind == "architecture":
        config = json.loads((target / "config.json").read_text())
        config["architectures"], config["model_type"] = ["LlamaForCausalLM"], "llama"
        (target / "config.json").write_text(json.dumps(config))
    return "output/ckpt"


@pytest.mark.parametrize(
    ("kind", "fix"),
    [
        ("outside", "OUTPUT_DIR"),
        ("symlink-escape", "OUTPUT_DIR"),
        ("missing", "save_pretrained"),
        ("file", "folder"),
        ("no-config", "save_pretrained"),
        ("no-safetensors", "safetensors"),
        ("pickle", "save_pretrained"),
        ("adapter", "merge_and_unload()"),
        ("architecture", "architecture"),
        ("linked-weights", "copy the file"),
        ("sparse", "sparse"),
    ],
)
def test_bad_checkpoints_are_refused_with_the_fix_and_nothing_written(
    kind: str, fix: str, grading: Grader, experiment: RegisteredExperiment, tmp_path: Path
) -> None:
    path = _prepare(kind, experiment, grading.base_model, tmp_path)
    response = submit(grading.client, experiment, path)
    assert response.status_code == 400, response.text
    assert fix in response.json()["detail"]
    assert submission_count(grading.settings, experiment) == 0


#: A tensor name that would drive a terminal and forge a line where a refusal is shown.
HOSTILE_NAME = "\x1b[2J\x1b]8;;https://x.example\x07\nautorl: score 99.00\u202e"


def _malform(kind: str, target: Path) -> None:
    """Rewrite the structure of the checkpoint's header or (sharded) index as ``kind`` says."""
    if kind.startswith("header"):
        header, data = read_safetensors(target / "model.safetensors")
        entry = header["model.norm.weight"]
        if kind == "header: sizes past 2**63":
            entry["shape"] = [10**299] * 20
        elif kind == "header: a list as dtype":
            entry["dtype"] = ["F32"]
        else:
            header[HOSTILE_NAME * 40] = header.pop("model.norm.weight")
        write_safetensors(target / "model.safetensors", header, data)
        return
    shards = split_into_shards(target)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    if kind == "index: a list as shard":
        weight_map["model.norm.weight"] = shards
    elif kind == "index: an object as shard":
        weight_map["model.norm.weight"] = {"file": shards[0]}
    elif kind == "index: a hidden-character name":
        weight_map[HOSTILE_NAME] = shards[0]
    else:
        weight_map.update({f"{i}" + "A" * 1_300_000: shards[0] for i in range(3)})
    (target / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "kind",
    [
        "header: sizes past 2**63",
        "header: a list as dtype",
        "header: a long hidden-character name",
        "index: a list as shard",
        "index: an object as shard",
        "index: a hidden-character name",
        "index: three names of 1.3 M characters",
    ],
)
def test_a_checkpoint_of_any_structure_is_refused_as_json_at_no_cost(kind: str, grading: Grader) -> None:
    """Whatever the header or index holds, the answer is a 400 naming the fix, its names escaped
    and bounded; nothing is written, the limit is untouched, and the next submit is served."""
    experiment = grading.register(max_submissions=1)
    _malform(kind, grading.copy(experiment, "bad"))
    refused = submit(grading.client, experiment, "output/bad")
    assert refused.status_code == 400, refused.text
    answer = refused.json()
    assert answer["detail"] == answer["error"] and "save_pretrained" in answer["detail"]
    assert answer["detail"].isprintable() and len(answer["detail"]) < 800, answer["detail"]
    assert submission_count(grading.settings, experiment) == 0
    assert grading.settings.snapshot_dir is not None and not any(grading.settings.snapshot_dir.glob("*"))
    grading.copy(experiment, "good")
    accepted = submit(grading.client, experiment, "output/good", params={"wait": "false"})
    assert accepted.status_code == 202, accepted.text


def test_an_unforeseen_failure_checking_the_files_is_a_logged_refusal_at_no_cost(
    grading: Grader, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unforeseen(*args: object) -> None:
        raise TypeError("a value no check expected")

    experiment = grading.register(max_submissions=1)
    grading.copy(experiment, "ckpt")
    monkeypatch.setattr(model_files, "check_config", unforeseen)
    with caplog.at_level(logging.WARNING, logger="autorl.grader"):
        refused = submit(grading.client, experiment, "output/ckpt")
    assert refused.status_code == 400, refused.text
    answer = refused.json()
    assert answer["detail"] == answer["error"]
    assert answer["detail"].startswith(
        "output/ckpt: the checkpoint's files could not be read as a model (TypeError while checking them); "
        "save the model with model.save_pretrained(path)"
    )
    logged = [r for r in caplog.records if "event=submission_malformed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is TypeError
    assert submission_count(grading.settings, experiment) == 0
    monkeypatch.undo()
    accepted = submit(grading.client, experiment, "output/ckpt", params={"wait": "false"})
    assert accepted.status_code == 202, accepted.text


def test_ignored_file_names_add_bounded_bytes_to_each_answer_and_to_scores(
    client: TestClient, experiment: RegisteredExperiment, tiny_base_model: Path
) -> None:
    # Ignored files are never opened, but their names are the agent's and are listed: 150 junk
    # files named with 250 undecodable bytes each added 177 KB to each submission in GET /scores.
    submissions = 3
    for number in range(submissions):
        target = copy_model(tiny_base_model, experiment.output_dir / f"c{number}", unique=True)
        for junk in range(150):
            name = b"\xff" * 250 + b"%05d" % junk
            os.close(os.open(os.fsencode(target) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644))
        response = submit(client, experiment, f"output/c{number}", params={"wait": "false"})
        assert response.status_code == 202, response.text
        ignored = response.json()["ignored_files"]
        assert len(ignored) == 21 and ignored[-1] == "(and 135 more)"  # 150 + the base's 5
        assert all(len(name) <= 100 for name in ignored)
        assert len(json.dumps(ignored, ensure_ascii=False).encode()) < 2_500  # measured: 2.4 KB
    scores = client.get(f"{experiment.url_path}/scores")
    assert scores.status_code == 200
    assert [len(entry["ignored_files"]) for entry in scores.json()["submissions"]] == [21] * submissions
    # Each submission's entry is its ignored files and 0.7 KB besides (measured: 9.3 KB for the
    # three), where 100 such submissions made an answer of 17.7 MB (177 KB each).
    assert len(scores.content) < submissions * 4_000, len(scores.content)


def test_a_trainer_checkpoint_is_accepted_and_the_answer_lists_what_was_ignored(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    target = grading.copy(experiment, "trainer")
    (target / "training_args.bin").write_bytes(b"\x80\x04pickle")
    (target / "checkpoint-10").mkdir()
    response = submit(grading.client, experiment, "output/trainer", params={"wait": "false"})
    assert response.status_code == 202, response.text
    # The trainer's files and the checkpoint's own tokenizer: none of them is evaluated.
    ignored = sorted(["checkpoint-10/", "training_args.bin", *TOKENIZER_FILES_OF_THE_BASE])
    assert response.json()["ignored_files"] == ignored
    view = grading.client.get(f"{experiment.url_path}/submissions/{response.json()['submission_id']}").json()
    assert view["ignored_files"] == ignored
    # The snapshot the evaluator will read holds none of them.
    assert grading.settings.snapshot_dir is not None
    [snapshot] = list(grading.settings.snapshot_dir.iterdir())
    assert "training_args.bin" not in {path.name for path in snapshot.iterdir()}


def test_a_path_in_the_agents_own_view_of_the_workspace_is_accepted(grading: Grader) -> None:
    # In a pod the agent sees its workspace at /workspace; the grader sees it elsewhere.
    experiment = grading.register(agent_workspace="/workspace")
    grading.copy(experiment, "pod")
    response = submit(grading.client, experiment, "/workspace/output/pod", params={"wait": "false"})
    assert response.status_code == 202, response.text
    view = grading.client.get(f"{experiment.url_path}/submissions/{response.json()['submission_id']}").json()
    assert view["model_path"] == "output/pod"
    # A path outside the agent's workspace is not rebased: it lies outside the output folder.
    outside = submit(grading.client, experiment, "/elsewhere/output/pod")
    assert (
        outside.status_code == 400 and "outside this experiment's output folder" in outside.json()["detail"]
    )


def test_missing_model_path_is_400_with_a_readable_detail(
    client: TestClient, experiment: RegisteredExperiment
) -> None:
    response = client.post(f"{experiment.url_path}/submit", json={"path": "output/x"})
    assert response.status_code == 400  # as the reference answers it
    assert "model_path" in response.json()["detail"]


@pytest.mark.parametrize(
    "hidden", ["\x1b]0;pwned\x07", "\n", "\u202e", "\u200b", "\x9b", "\u034f", "\u3164", "\u0336"]
)
def test_a_model_path_with_hidden_characters_is_400_with_the_fix(
    grading: Grader, experiment: RegisteredExperiment, hidden: str
) -> None:
    # A real checkpoint under that name: the name alone is refused, before any file is read.
    grading.copy(experiment, f"m{hidden}x")
    response = submit(grading.client, experiment, f"output/m{hidden}x", params={"wait": "false"})
    assert response.status_code == 400
    body = response.json()
    assert body["detail"] == body["error"]
    assert "model_path holds characters that do not print" in body["detail"]
    assert printable(hidden[0]) in body["detail"] and "rename the checkpoint folder" in body["detail"]
    assert submission_count(grading.settings, experiment) == 0


@pytest.mark.parametrize(
    "path",
    [
        "output/" + "/".join(["d" * 200] * 20) + "/x",  # 4,027 bytes, but 22 folders: accepted
        "output/" + "/".join(["d" * 250] * 20) + "/x",  # 5,027 bytes
        "output/" + "/".join(["d"] * 70),  # 71 folders
        "output/" + "é" * 2100,  # 4,207 bytes in UTF-8 (2,107 characters)
    ],
    ids=["within", "bytes", "folders", "utf8-bytes"],
)
def test_a_model_path_past_the_size_limits_is_400_before_any_file_is_read(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment, path: str
) -> None:
    """The path is stored and repeated in answers, the dashboard and logs: its size is bounded
    where it arrives, whatever the folder holds (none of these exists)."""
    response = submit(client, experiment, path, params={"wait": "false"})
    assert response.status_code == 400
    detail = response.json()["detail"]
    if len(path.encode()) <= MAX_MODEL_PATH_BYTES and len(Path(path).parts) <= MAX_MODEL_PATH_PARTS:
        assert "limit is" not in detail  # refused for another reason: the folder does not exist
    else:
        assert f"the limit is {MAX_MODEL_PATH_BYTES} bytes and {MAX_MODEL_PATH_PARTS} folders" in detail
        assert "output/step-100" in detail and len(detail) < 400
    assert submission_count(settings, experiment) == 0


# -- limits, deadline, scoping -----------------------------------------------------------------


@pytest.fixture
def limit_of_one(
    client: TestClient, register_experiment: Callable[..., RegisteredExperiment], tiny_base_model: Path
) -> tuple[RegisteredExperiment, Any]:
    """An experiment that accepts one submission, and the answer to its first (not waited for)."""
    experiment = register_experiment(max_submissions=1)
    copy_model(tiny_base_model, experiment.output_dir / "a", unique=True)
    first = submit(client, experiment, "output/a", params={"wait": "false"})
    assert first.status_code == 202
    return experiment, first


def test_submission_limit_is_429(
    client: TestClient, settings: DeploymentSettings, limit_of_one: tuple[RegisteredExperiment, Any]
) -> None:
    experiment, first = limit_of_one
    assert first.json()["status"] == "queued" and first.json()["queue_position"] >= 1
    second = submit(client, experiment, "output/a")
    assert second.status_code == 429
    assert second.json()["detail"] == (
        f"experiment {experiment.name!r} reached its limit of 1 submissions; "
        "submit only your best checkpoints (GET /scores shows what you have)"
    )
    assert submission_count(settings, experiment) == 1


def test_a_refusal_leaves_the_limit_untouched(grading: Grader) -> None:
    experiment = grading.register(max_submissions=1)
    target = grading.copy(experiment, "bad")
    (target / "config.json").write_text("{not json")
    refused = submit(grading.client, experiment, "output/bad")
    assert refused.status_code == 400
    detail = refused.json()["detail"]
    assert detail.startswith("output/bad/config.json is not a readable JSON file (")
    assert submission_count(grading.settings, experiment) == 0
    assert grading.settings.snapshot_dir is not None and not any(grading.settings.snapshot_dir.glob("*"))
    # Saved again, the same checkpoint is the experiment's one accepted submission.
    shutil.copy(grading.base_model / "config.json", target / "config.json")
    accepted = submit(grading.client, experiment, "output/bad", params={"wait": "false"})
    assert accepted.status_code == 202, accepted.text


def test_concurrent_submits_at_the_limit_accept_exactly_the_limit(grading: Grader) -> None:
    """Concurrent submits of one experiment take their turn one at a time: while one holds the
    experiment (here: waits on its row, which another transaction holds), the others wait in the
    event loop, not in the database. Never more accepted than the limit, each other a 429, no row
    or snapshot left of a refused one."""
    limit, submits = 2, 6
    experiment = grading.register(max_submissions=limit)
    for index in range(submits):
        grading.copy(experiment, f"c{index}")
    assert grading.settings.database_url is not None
    db = Database(grading.settings.database_url)
    answers: dict[int, Any] = {}

    def send(index: int) -> None:
        answers[index] = submit(grading.client, experiment, f"output/c{index}", params={"wait": "false"})

    threads = [threading.Thread(target=send, args=(index,)) for index in range(submits)]
    try:
        # Another transaction holds the experiment's row until a submit waits on it; by then every
        # submit has been sent, and only the one whose turn it is has reached the database.
        with db.session() as holder:
            experiments.get_experiment(holder, experiment.name, for_update=True)
            for thread in threads:
                thread.start()
            wait_for(lambda: _backends_waiting_on_a_lock(db) >= 1, "a submit to reach the database", 60, 0.02)
            for thread in threads:
                thread.join(timeout=0.5)
            assert _backends_waiting_on_a_lock(db) == 1
        for thread in threads:
            thread.join(timeout=60)
        statuses = sorted(answer.status_code for answer in answers.values())
        assert statuses == [202] * limit + [429] * (submits - limit)
        for answer in answers.values():
            if answer.status_code == 429:
                assert answer.json()["detail"] == (
                    f"experiment {experiment.name!r} reached its limit of {limit} submissions; "
                    "submit only your best checkpoints (GET /scores shows what you have)"
                )
        accepted = {
            answer.json()["submission_id"] for answer in answers.values() if answer.status_code == 202
        }
        with db.session() as session:
            rows = submission_store.experiment_submissions(
                session, experiments.get_experiment(session, experiment.name)
            )
            submitted = [row for row in rows if not row.is_baseline]
            assert {row.number for row in submitted} == accepted
            assert all(row.fingerprint and row.status is SubmissionStatus.QUEUED for row in submitted)
            snapshots = {row.snapshot for row in rows if row.snapshot is not None}
    finally:
        db.dispose()
    # Each accepted submission has its snapshot; no refused one left its copy behind.
    assert grading.settings.snapshot_dir is not None
    assert {path.name for path in grading.settings.snapshot_dir.iterdir()} == snapshots


def _backends_waiting_on_a_lock(db: Database) -> int:
    with db.session() as session:
        return int(
            session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
            or 0
        )


def test_a_failure_of_the_evaluator_does_not_count_against_the_limit(
    client: TestClient, settings: DeploymentSettings, limit_of_one: tuple[RegisteredExperiment, Any]
) -> None:
    experiment, first = limit_of_one
    # The evaluator could not start its engine: the agent is told so, and may submit again.
    assert settings.database_url is not None
    db = Database(settings.database_url)
    submission_id = first.json()["submission_id"]
    first_row = row_id(db, experiment, submission_id)
    fault = EvaluatorFaultError("vLLM could not start the model on this worker's GPUs")
    fail_evaluation(db, first_row, agent_message(fault))
    failed = client.get(f"{experiment.url_path}/submissions/{submission_id}").json()
    assert failed["status"] == "failed" and failed["error"].startswith("evaluator error (not your checkpoint")
    second = submit(client, experiment, "output/a", params={"wait": "false"})
    assert second.status_code == 202, second.text
    second_row = row_id(db, experiment, second.json()["submission_id"])
    # A failure of the checkpoint itself counts.
    fail_evaluation(db, second_row, "the checkpoint ...")
    assert submit(client, experiment, "output/a").status_code == 429


def test_submission_after_the_deadline_is_refused(grading: Grader, experiment: RegisteredExperiment) -> None:
    started = grading.client.post(
        f"/v1/experiments/{experiment.name}/start",
        json={"timeout_s": 1},
        headers=admin_headers(grading.settings),
    )
    assert started.status_code == 200
    grading.copy(experiment, "late")
    time.sleep(1.2)
    assert grading.client.get(f"{experiment.url_path}/time").json()["remaining_s"] == 0
    response = submit(grading.client, experiment, "output/late")
    assert response.status_code == 403
    assert response.json()["detail"].endswith("submissions are accepted only before GET /time's end_time")
    assert submission_count(grading.settings, experiment) == 0


def test_submission_before_the_budget_starts_is_refused_with_when_it_will(grading: Grader) -> None:
    experiment = grading.register(start=False)
    grading.copy(experiment, "early")
    response = submit(grading.client, experiment, "output/early")
    assert response.status_code == 403
    assert response.json()["detail"] == (
        f"the time budget of experiment {experiment.name!r} has not started yet; submissions are "
        "accepted once GET /time shows a start_time (the platform starts it when your agent starts)"
    )
    assert grading.client.get(f"{experiment.url_path}/time").json()["start_time"] is None
    assert submission_count(grading.settings, experiment) == 0
    grading.client.post(
        f"/v1/experiments/{experiment.name}/start", json={}, headers=admin_headers(grading.settings)
    )
    assert submit(grading.client, experiment, "output/early", params={"wait": "false"}).status_code == 202


@pytest.mark.parametrize(
    ("offset_s", "counts_from"),
    [(-1.5, "asked"), (-3600.0, "registration"), (3600.0, "now")],
    ids=["earlier", "before-registration", "future"],
)
def test_budget_starts_when_the_controller_says_it_did(
    grading: Grader, offset_s: float, counts_from: str
) -> None:
    """The controller starts the clock at the agent container's start, seen a tick later; the grader
    takes that time, but never one in the future nor one before the experiment existed."""
    before = time.time()
    experiment = grading.register(start=False)
    registered = time.time()
    time.sleep(2.0)  # the container started 1.5 s ago, after the registration
    asked = time.time() + offset_s
    started = grading.client.post(
        f"/v1/experiments/{experiment.name}/start",
        json={"start_time": asked},
        headers=admin_headers(grading.settings),
    )
    after = time.time()
    assert started.status_code == 200, started.text
    start = started.json()["start_time"]
    if counts_from == "asked":
        assert start == pytest.approx(asked, abs=1e-3)
    elif counts_from == "registration":
        assert before - 0.01 <= start <= registered + 0.01
    else:
        assert asked - 3600 - 0.01 <= start <= after + 0.01
    assert started.json()["end_time"] == pytest.approx(start + 3600)
    assert grading.client.get(f"{experiment.url_path}/time").json()["start_time"] == pytest.approx(start)


def test_budget_start_time_must_be_a_positive_epoch(grading: Grader) -> None:
    experiment = grading.register(start=False)
    refused = grading.client.post(
        f"/v1/experiments/{experiment.name}/start",
        json={"start_time": -5},
        headers=admin_headers(grading.settings),
    )
    assert refused.status_code == 422
    assert "start_time" in refused.text


def test_finished_experiment_refuses_submissions(grading: Grader, experiment: RegisteredExperiment) -> None:
    grading.client.post(
        f"/v1/experiments/{experiment.name}/finish",
        json={"status": "completed"},
        headers=admin_headers(grading.settings),
    )
    grading.copy(experiment, "after")
    response = submit(grading.client, experiment, "output/after")
    assert response.status_code == 409
    assert "completed" in response.json()["detail"]


def test_an_experiment_sees_only_its_own_submissions(grading: Grader) -> None:
    mine = grading.register()
    other = grading.register()
    grading.copy(mine, "m")
    submission_id = submit(grading.client, mine, "output/m", params={"wait": "false"}).json()["submission_id"]
    assert grading.client.get(f"{mine.url_path}/submissions/{submission_id}").status_code == 200
    response = grading.client.get(f"{other.url_path}/submissions/{submission_id}")
    assert response.status_code == 404
    assert grading.client.get(f"{other.url_path}/scores").json()["submissions"] == []


def test_gpu_field_is_accepted_and_ignored(
    client: TestClient, experiment: RegisteredExperiment, tiny_base_model: Path
) -> None:
    copy_model(tiny_base_model, experiment.output_dir / "g", unique=True)
    response = client.post(
        f"{experiment.url_path}/submit",
        params={"wait": "false"},
        json={"model_path": "output/g", "gpu": "0,1"},
    )
    assert response.status_code == 202


def test_blocking_submit_answers_202_with_the_id_when_the_wait_ends(
    client: TestClient, experiment: RegisteredExperiment, tiny_base_model: Path
) -> None:
    copy_model(tiny_base_model, experiment.output_dir / "w", unique=True)
    started = time.monotonic()
    response = submit(client, experiment, "output/w")  # no worker runs: the 0.5 s wait ends
    assert response.status_code == 202
    assert time.monotonic() - started < 10
    body = response.json()
    assert body["status"] == "queued" and isinstance(body["submission_id"], int)
    shown = client.get(f"{experiment.url_path}/submissions/{body['submission_id']}").json()
    assert shown["status"] == "queued" and shown["model_path"] == "output/w"


# -- admin API ---------------------------------------------------------------------------------


def test_register_conflict_and_unknown_task(grading: Grader, experiment: RegisteredExperiment) -> None:
    body = {
        "name": experiment.name,
        "task": "gsm8k",
        "model": "m",
        "timeout_s": 10,
        "workspace": str(experiment.workspace),
        "base_model_dir": str(grading.base_model),
    }
    conflict = grading.client.post("/v1/experiments", json=body, headers=admin_headers(grading.settings))
    assert conflict.status_code == 409
    assert "/token" in conflict.json()["detail"]
    unknown = grading.client.post(
        "/v1/experiments",
        json={**body, "name": "fresh-name-1", "task": "chess"},
        headers=admin_headers(grading.settings),
    )
    assert unknown.status_code == 400
    assert "gsm8k" in unknown.json()["detail"]
    negative = grading.client.post(
        "/v1/experiments",
        json={**body, "name": "fresh-name-2", "timeout_s": -5},
        headers=admin_headers(grading.settings),
    )
    assert negative.status_code == 422
    assert "timeout_s" in negative.json()["detail"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 10**12),  # more than SQLite's and PostgreSQL's integers hold
        ("timeout_s", MAX_BUDGET_S + 1),
        ("max_submissions", 2**31),
    ],
)
def test_a_number_the_database_cannot_store_is_refused_with_its_bound(
    grading: Grader, experiment: RegisteredExperiment, field: str, value: int
) -> None:
    """Every integer of a body that reaches the database has a bound it fits: 422 naming the field and
    the bound, not a 500 from the driver, and nothing is written."""
    body = {
        "name": "too-large",
        "task": "gsm8k",
        "model": "m",
        "timeout_s": 10,
        "workspace": str(experiment.workspace),
        "base_model_dir": str(grading.base_model),
        field: value,
    }
    headers = admin_headers(grading.settings)
    refused = grading.client.post("/v1/experiments", json=body, headers=headers)
    assert refused.status_code == 422, refused.text
    assert field in refused.text and "less than or equal to" in refused.text
    assert grading.client.get("/v1/experiments/too-large", headers=headers).status_code == 404


@pytest.mark.parametrize(
    "body", [{"timeout_s": 10**12}, {"timeout_s": MAX_BUDGET_S + 1}, {"start_time": 1e300}]
)
def test_a_start_the_database_cannot_store_is_refused_with_its_bound(
    grading: Grader, experiment: RegisteredExperiment, body: dict[str, float]
) -> None:
    headers = admin_headers(grading.settings)
    before = grading.client.get(f"/v1/experiments/{experiment.name}", headers=headers).json()
    refused = grading.client.post(f"/v1/experiments/{experiment.name}/start", json=body, headers=headers)
    assert refused.status_code == 422, refused.text
    assert next(iter(body)) in refused.text and "less than or equal to" in refused.text
    after = grading.client.get(f"/v1/experiments/{experiment.name}", headers=headers).json()
    assert after["timeout_s"] == before["timeout_s"] and after["end_time"] == before["end_time"]


def test_rotating_a_token_revokes_the_old_one(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    check_token_rotation(client, settings, experiment)


def test_ops_endpoints(
    client: TestClient, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"
    assert "autorl_database_up 1" in client.get("/metrics", headers=admin_headers(settings)).text
    assert "/submit" in client.get("/openapi.json").json()["paths"]


def test_metrics_describe_every_experiment_so_only_the_admin_reads_them(
    client: TestClient, experiment: RegisteredExperiment
) -> None:
    for headers in ({}, experiment.bearer):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401
        assert "AUTORL_ADMIN_TOKEN" in response.json()["detail"]
    assert client.get(f"{experiment.url_path}/metrics").status_code == 404


def test_access_log_never_shows_a_token(
    settings: DeploymentSettings, experiment: RegisteredExperiment, caplog: pytest.LogCaptureFixture
) -> None:
    from autorl_grader.logging_setup import RedactTokens

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1", "GET", f"{experiment.url_path}/time", "1.1", 200),
        None,
    )
    RedactTokens().filter(record)
    assert experiment.token not in record.getMessage()
    assert "/a/<redacted>/time" in record.getMessage()


# -- unavailable services ----------------------------------------------------------------------


def test_redis_down_is_503_and_nothing_is_written(
    make_settings: Callable[..., DeploymentSettings], pg_url: str, tiny_base_model: Path, tmp_path: Path
) -> None:
    from tests.support.infra import free_port

    settings = make_settings(database_url=pg_url, redis_url=f"redis://:down@127.0.0.1:{free_port()}/0")
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = new_experiment(client, settings, tiny_base_model, tmp_path)
        copy_model(tiny_base_model, experiment.output_dir / "c", unique=True)
        response = submit(client, experiment, "output/c")
        assert response.status_code == 503
        assert "Redis" in response.json()["detail"]
        unready = client.get("/readyz")
        assert unready.status_code == 503
        # The refusal's shape, with the probe's own status beside it.
        assert unready.json()["status"] == "unavailable"
        assert unready.json()["error"] == unready.json()["detail"] and "Redis" in unready.json()["error"]
    assert submission_count(settings, experiment) == 0
    # Nor a copy of the checkpoint in the evaluators' storage.
    assert settings.snapshot_dir is not None and not any(settings.snapshot_dir.glob("*"))


def test_postgres_down_is_503(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> None:
    from tests.support.infra import free_port

    settings = make_settings(database_url=f"postgresql+psycopg://postgres:down@127.0.0.1:{free_port()}/x")
    app = create_app(settings, run_migrations=False, reconcile=False)
    client = TestClient(app)  # no lifespan: the database is down from the start
    response = client.get("/a/some-token/time")
    assert response.status_code == 503
    assert "AUTORL_DATABASE_URL" in response.json()["detail"]


def test_identical_weights_reuse_the_score(grading: Grader, experiment: RegisteredExperiment) -> None:
    from autorl.store import SubmissionStatus
    from autorl.store import submissions as submission_store

    first_dir = grading.copy(experiment, "one")
    first = submit(grading.client, experiment, "output/one", params={"wait": "false"}).json()["submission_id"]
    db = Database(grading.settings.database_url or "")
    with db.session() as session:  # stand in for a worker that finished the first evaluation
        row = submission_store.get_submission(session, row_id(db, experiment, first))
        row.status, row.score, row.score_flexible, row.score_strict, row.n_samples = (
            SubmissionStatus.SCORED,
            37.5,
            40.0,
            12.5,
            8,
        )
    db.dispose()
    shutil.copytree(first_dir, experiment.output_dir / "two")
    response = submit(grading.client, experiment, "output/two")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "scored" and body["score"] == 37.5
    assert body["reused_from"] == first and body["eval_seconds"] == 0.0
    assert body["submission_id"] != first and body["total_submissions"] == 2
    # Nothing to evaluate for the second: its snapshot is gone at once. The first's, scored, was
    # let go by that submit (in test mode no evaluation needs it any more): the storage is empty.
    db = Database(grading.settings.database_url or "")
    with db.session() as session:
        assert submission_store.get_submission(session, row_id(db, experiment, first)).snapshot is None
        assert (
            submission_store.get_submission(session, row_id(db, experiment, body["submission_id"])).snapshot
            is None
        )
    db.dispose()
    assert grading.settings.snapshot_dir is not None
    assert list(grading.settings.snapshot_dir.iterdir()) == []


def test_submit_without_waiting_answers_as_the_agents_guide_says(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    """docs/AGENTS.md says what `?wait=false` answers: the status of a submission still to be
    evaluated and that of one whose score is already known (identical files reused it)."""
    said = claim(
        r"`\?wait=false`: at once, (\d{3}) `\{submission_id, status: \"(\w+)\", queue_position\}`.*?, "
        r"or (\d{3}) with the whole answer when the score is already known",
        "docs/AGENTS.md",
    )
    pending_status, pending_state, known_status = int(said[1]), said[2], int(said[3])
    first_dir = grading.copy(experiment, "one")
    pending = submit(grading.client, experiment, "output/one", params={"wait": "false"})
    assert pending.status_code == pending_status and pending.json()["status"] == pending_state
    db = Database(grading.settings.database_url or "")
    with db.session() as session:  # stand in for a worker that scored it
        row = submission_store.get_submission(
            session, row_id(db, experiment, pending.json()["submission_id"])
        )
        row.status, row.score, row.n_samples = SubmissionStatus.SCORED, 50.0, 8
    db.dispose()
    shutil.copytree(first_dir, experiment.output_dir / "two")
    known = submit(grading.client, experiment, "output/two", params={"wait": "false"})
    assert known.status_code == known_status == 202  # the contract: ?wait=false answers 202
    assert known.json()["status"] == "scored" and known.json()["score"] == 50.0
    # The client reads either 202 as what it is.
    assert isinstance(SUBMIT.read(pending, "/submit"), PendingAnswer)
    read = SUBMIT.read(known, "/submit")
    assert isinstance(read, SubmissionAnswer) and read.final and read.score == 50.0


def test_an_accepted_submission_is_logged_for_operators(
    grading: Grader, experiment: RegisteredExperiment, caplog: pytest.LogCaptureFixture
) -> None:
    grading.copy(experiment, "logged")
    with caplog.at_level(logging.INFO, logger="autorl.grader"):
        response = submit(grading.client, experiment, "output/logged", params={"wait": "false"})
    assert response.status_code == 202, response.text
    accepted = [r.getMessage() for r in caplog.records if "event=submission_accepted" in r.getMessage()]
    # Operators read the global id (the admin API's), not the agent's number of it.
    global_id = row_id(grading.settings.database_url, experiment, response.json()["submission_id"])
    assert accepted == [
        f"event=submission_accepted experiment={experiment.name} submission={global_id} reused=False"
    ]


def test_the_headline_score_follows_the_experiments_protocol(grading: Grader) -> None:
    strict = grading.register(protocol="strict")
    default = grading.register()
    assert strict.view["eval_config"]["protocol"] == "strict"
    assert default.view["eval_config"]["protocol"] == "opencompass"
    grading.copy(strict, "s")
    submission_id = submit(grading.client, strict, "output/s", params={"wait": "false"}).json()[
        "submission_id"
    ]
    db = Database(grading.settings.database_url or "")
    evaluated = row_id(db, strict, submission_id)
    with db.session() as session:
        assert claims.claim(session, evaluated, worker="w", lease_s=60)
        assert outcomes.record_score(
            session,
            evaluated,
            worker="w",
            scores={"opencompass": 50.0, "flexible": 60.0, "strict": 10.0},
            n_samples=10,
            seconds=1.0,
            protocol="strict",
        )
    db.dispose()
    body = grading.client.get(f"{strict.url_path}/submissions/{submission_id}").json()
    assert body["score"] == 10.0
    assert body["scores"] == {"opencompass": 50.0, "flexible": 60.0, "strict": 10.0}


def test_baseline_is_measured_once_per_model_and_settings(grading: Grader, tmp_path: Path) -> None:
    from autorl.store import SubmissionStatus, experiments

    base = copy_model(grading.base_model, tmp_path / "base", unique=True)
    model = f"local:{tmp_path.name}"
    first = new_experiment(grading.client, grading.settings, base, tmp_path, model=model)
    headers = admin_headers(grading.settings)
    queued = grading.client.post(f"/v1/experiments/{first.name}/baseline", headers=headers)
    assert queued.status_code == 202 and queued.json()["status"] == "queued"
    again = grading.client.post(f"/v1/experiments/{first.name}/baseline", headers=headers)
    assert again.json()["submission_id"] == queued.json()["submission_id"]  # idempotent
    db = Database(grading.settings.database_url or "")
    score_evaluation(db, queued.json()["submission_id"], 12.5)
    with db.session() as session:
        eval_key = experiments.get_experiment(session, first.name).eval_key
        assert caches.cached_baseline(session, task="gsm8k", model=model, eval_key=eval_key) is not None
    db.dispose()
    second = new_experiment(grading.client, grading.settings, base, tmp_path, model=model)
    reused = grading.client.post(f"/v1/experiments/{second.name}/baseline", headers=headers)
    assert reused.status_code == 200
    assert reused.json()["score"] == 12.5
    # Reused, but another experiment's submission id is never shown.
    assert reused.json()["reused_from"] is None and reused.json()["eval_seconds"] == 0
    view = grading.client.get(f"/v1/experiments/{second.name}", headers=headers).json()
    assert view["baseline_score"] == 12.5 and view["baseline_status"] == SubmissionStatus.SCORED.value


def test_single_machine_sqlite_store_enforces_the_deadline(
    make_settings: Callable[..., DeploymentSettings], tiny_base_model: Path, tmp_path: Path
) -> None:
    """SQLite (the single-machine default) keeps no time zone; deadlines must still compare."""
    settings = make_settings(local_mode=True, submit_wait_s=0.0)
    assert (settings.database_url or "").startswith("sqlite")
    with TestClient(create_app(settings, reconcile=False)) as client:
        experiment = new_experiment(client, settings, tiny_base_model, tmp_path)
        client.post(
            f"/v1/experiments/{experiment.name}/start",
            json={"timeout_s": 60},
            headers=admin_headers(settings),
        )
        copy_model(tiny_base_model, experiment.output_dir / "in-time", unique=True)
        assert submit(client, experiment, "output/in-time").status_code == 202
        remaining = client.get(f"{experiment.url_path}/time").json()["remaining_s"]
        assert 0 < remaining <= 60
        client.post(
            f"/v1/experiments/{experiment.name}/start", json={"timeout_s": 1}, headers=admin_headers(settings)
        )
        time.sleep(1.2)
        copy_model(tiny_base_model, experiment.output_dir / "late", unique=True)
        assert submit(client, experiment, "output/late").status_code == 403
