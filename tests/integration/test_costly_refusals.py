"""A submit refused after the grader began reading the checkpoint's weights costs what an accepted
one costs: it counts against the experiment's submission limit, so that an agent cannot keep the
grader reading, hashing and writing whole checkpoints by making them change under the copy.
Refusals found before any weight data is read stay free. A real grader on Postgres, in-process;
the checkpoint is changed at the exact moment the grader starts copying its weights (as a trainer
still saving it, or an agent touching the file in a loop, would)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autorl.checkpoints import snapshot as snapshot_module
from autorl.store import Database, experiments
from autorl_grader.main import create_app
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    copy_model,
    make_workspace,
    register,
    submission_count,
    submit_accepted,
    submit_no_wait,
)
from tests.support.settings import DeploymentSettings
from tests.support.snapshots import CHANGED

#: Checkpoints in folders named so change while the grader copies their weights.
CHANGING = "changing"


def counted(left: int, limit: int) -> str:
    """The refusal of a checkpoint whose weights changed under the copy, counted."""
    return (
        f"{CHANGED}. This refusal counts against your limit of {limit} submissions, as a submission "
        f"does, because the grader had already read and copied the checkpoint's weights: {left} left"
    )


def limit_reached(experiment: RegisteredExperiment, limit: int, refused: int = 0) -> str:
    among = (
        f" ({refused} of them refused after the grader had read the checkpoint's weights, which counts "
        "as a submission but is not listed in GET /scores)"
        if refused
        else ""
    )
    return (
        f"experiment {experiment.name!r} reached its limit of {limit} submissions{among}; "
        "submit only your best checkpoints (GET /scores shows what you have)"
    )


@pytest.fixture
def weights_copied(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every weight file whose copy the grader began (its data read); one in a ``changing*``
    folder gets 1 KiB appended as its copy starts."""
    copy_weights = snapshot_module._copy_weights
    copied: list[Path] = []

    def copy_while_written(opened: Any, header: Any, writer: Any) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{opened.fd}"))
        copied.append(path)
        if path.parent.name.startswith(CHANGING):
            with path.open("ab") as weights:
                weights.write(b"\0" * 1024)
        copy_weights(opened, header, writer)

    monkeypatch.setattr(snapshot_module, "_copy_weights", copy_while_written)
    return copied


def costly_refusals(settings: DeploymentSettings, experiment: RegisteredExperiment) -> int:
    assert settings.database_url is not None
    db = Database(settings.database_url)
    try:
        with db.session() as session:
            return experiments.get_experiment(session, experiment.name).costly_refusals
    finally:
        db.dispose()


def snapshots_left(settings: DeploymentSettings) -> list[str]:
    assert settings.snapshot_dir is not None
    return sorted(path.name for path in settings.snapshot_dir.glob("*"))


def test_a_checkpoint_changed_during_the_copy_counts_against_the_limit(
    grading: Grader, weights_copied: list[Path]
) -> None:
    experiment = grading.register(max_submissions=1)
    grading.copy(experiment, f"{CHANGING}-a")
    grading.copy(experiment, "good")

    refused = submit_no_wait(grading.client, experiment, f"output/{CHANGING}-a")
    assert refused.status_code == 400, refused.text
    assert refused.json()["detail"] == counted(left=0, limit=1)
    assert "stop writing a checkpoint before you submit it" in refused.json()["detail"]
    assert len(weights_copied) == 1  # refused only once its weights were being read
    # Nothing half-written: no submission, no snapshot; the limit holds the refusal.
    assert submission_count(grading.settings, experiment) == 0 and snapshots_left(grading.settings) == []
    assert costly_refusals(grading.settings, experiment) == 1
    # GET /scores lists submissions; the refusal has no id there, and the 429 says what it took.
    assert grading.client.get(f"{experiment.url_path}/scores").json()["total_submissions"] == 0

    limited = submit_no_wait(grading.client, experiment, "output/good")
    assert limited.status_code == 429, limited.text
    assert limited.json()["detail"] == limit_reached(experiment, 1, refused=1)
    assert len(weights_copied) == 1  # refused before anything was read
    assert submission_count(grading.settings, experiment) == 0 and snapshots_left(grading.settings) == []
    # The operator sees what took the limit: no submission, one counted refusal.
    view = grading.client.get(
        f"/v1/experiments/{experiment.name}", headers=admin_headers(grading.settings)
    ).json()
    assert (view["total_submissions"], view["refused_submissions"], view["max_submissions"]) == (0, 1, 1)


def test_refusals_before_the_weights_are_read_do_not_count(
    grading: Grader, weights_copied: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = grading.register(max_submissions=1)
    output = experiment.output_dir
    shutil.copy(grading.base_model / "config.json", output / "config.json")  # not a checkpoint folder
    bad_config = copy_model(grading.base_model, output / "bad-config", unique=True)
    (bad_config / "config.json").write_text("{not json")
    truncated = copy_model(grading.base_model, output / "truncated", unique=True)
    short = (truncated / "model.safetensors").stat().st_size - 64
    with (truncated / "model.safetensors").open("r+b") as weights:
        weights.truncate(short)
    early = copy_model(grading.base_model, output / "early", unique=True)
    copy_model(grading.base_model, output / "good", unique=True)

    # The weights of output/early change after their header was checked, before their data is read.
    compare = snapshot_module.compare_to_base

    def compare_then_append(tensors: Any, base: Any, shown: str) -> None:
        compare(tensors, base, shown)
        if shown == "output/early":
            with (early / "model.safetensors").open("ab") as weights:
                weights.write(b"\0" * 1024)

    monkeypatch.setattr(snapshot_module, "compare_to_base", compare_then_append)

    refusals = {
        "output/missing": "model_path output/missing does not exist",
        "../elsewhere": "lies outside this experiment's output folder",
        "output/config.json": "output/config.json is a file, not a folder",
        "output/bad-config": "output/bad-config/config.json is not a readable JSON file",
        "output/truncated": f"output/truncated/model.safetensors is {short} bytes but its header declares",
        "output/early": CHANGED,
    }
    for model_path, reason in refusals.items():
        refused = submit_no_wait(grading.client, experiment, model_path)
        assert refused.status_code == 400, (model_path, refused.text)
        detail = refused.json()["detail"]
        assert reason in detail and "counts against your limit" not in detail, (model_path, detail)
    # None of them read a byte of tensor data, left a snapshot or counted.
    assert weights_copied == [] and snapshots_left(grading.settings) == []
    assert costly_refusals(grading.settings, experiment) == 0

    submit_accepted(grading.client, experiment, "output/good")
    limited = submit_no_wait(grading.client, experiment, "output/good")
    assert limited.status_code == 429 and limited.json()["detail"] == limit_reached(experiment, 1)


def test_concurrent_costly_refusals_and_submissions_never_exceed_the_limit(
    grading: Grader, weights_copied: list[Path]
) -> None:
    """Submits of changing and good checkpoints at once: accepted submissions and counted refusals
    together take exactly the limit, every other submit is a 429 that read nothing."""
    limit, submits = 3, 8
    experiment = grading.register(max_submissions=limit)
    paths = [f"output/{CHANGING}-{i}" if i % 2 else f"output/good-{i}" for i in range(submits)]
    for path in paths:
        copy_model(grading.base_model, experiment.workspace / path, unique=True)
    answers: dict[str, Any] = {}

    def send(path: str) -> None:
        answers[path] = submit_no_wait(grading.client, experiment, path)

    threads = [threading.Thread(target=send, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == submits
    accepted = [path for path, answer in answers.items() if answer.status_code == 202]
    refused = [path for path, answer in answers.items() if answer.status_code == 400]
    limited = [path for path, answer in answers.items() if answer.status_code == 429]
    assert len(accepted) + len(refused) == limit and len(limited) == submits - limit, answers
    assert all(CHANGING in path for path in refused) and not any(CHANGING in path for path in accepted)
    # Each counted refusal says how many were left after it: one fewer each time.
    lefts = sorted(int(answers[path].json()["detail"].rsplit(": ", 1)[1].split()[0]) for path in refused)
    assert all(
        answers[path].json()["detail"].startswith(f"{CHANGED}. This refusal counts") for path in refused
    )
    assert len(set(lefts)) == len(lefts) and all(0 <= left < limit for left in lefts)
    for path in limited:
        assert answers[path].json()["detail"] == limit_reached(experiment, limit, refused=len(refused))
    # Only the submits inside the limit read any weights.
    assert len(weights_copied) == limit
    assert costly_refusals(grading.settings, experiment) == len(refused)
    assert submission_count(grading.settings, experiment) == len(accepted)
    assert len(snapshots_left(grading.settings)) == len(accepted)


def test_costly_refusals_racing_on_two_graders_never_exceed_the_limit(
    make_settings: Callable[..., DeploymentSettings],
    pg_url: str,
    tiny_base_model: Path,
    tmp_path: Path,
    weights_copied: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two grader replicas copying changing checkpoints of one experiment at the same moment (the
    snapshot lease, here 1 ms, no longer keeps them apart): each refusal is counted under the
    experiment's row lock, and what counts stops at the limit."""
    settings = make_settings(database_url=pg_url, submit_wait_s=0.0, snapshot_lease_s=0.001)
    both_copying = threading.Barrier(2, timeout=60)
    copy_weights = snapshot_module._copy_weights

    def copy_together(opened: Any, header: Any, writer: Any) -> None:
        both_copying.wait()  # both graders have read the checks and start copying
        copy_weights(opened, header, writer)

    monkeypatch.setattr(snapshot_module, "_copy_weights", copy_together)
    with ExitStack() as stack:
        graders = [stack.enter_context(TestClient(create_app(settings, reconcile=False))) for _ in range(2)]
        experiment = register(
            graders[0], settings, tiny_base_model, make_workspace(tmp_path), max_submissions=1
        )
        for index in range(2):
            copy_model(tiny_base_model, experiment.output_dir / f"{CHANGING}-{index}", unique=True)
        copy_model(tiny_base_model, experiment.output_dir / "good", unique=True)
        answers: dict[int, Any] = {}

        def send(index: int) -> None:
            answers[index] = submit_no_wait(graders[index], experiment, f"output/{CHANGING}-{index}")

        threads = [threading.Thread(target=send, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert [answers[index].status_code for index in range(2)] == [400, 400], answers
        assert {answers[index].json()["detail"] for index in range(2)} == {counted(left=0, limit=1)}
        assert len(weights_copied) == 2
        assert costly_refusals(settings, experiment) == 1
        limited = submit_no_wait(graders[1], experiment, "output/good")
        assert limited.status_code == 429 and limited.json()["detail"] == limit_reached(
            experiment, 1, refused=1
        )
    assert submission_count(settings, experiment) == 0 and snapshots_left(settings) == []
