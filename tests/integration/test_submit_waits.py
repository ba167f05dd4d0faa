"""A submit that must wait (autorl_grader.snapshot_slots): for another grader replica's snapshot
lease, then for its files to become readable (the agent's pod adds group-read within seconds), each
wait counted from its own first refusal; while unreadable only the files are looked at again, and
the whole submit (the database's checks, the lease) is made again once they open."""

from __future__ import annotations

import time
from typing import Any

import pytest

from autorl.checkpoints import snapshot as snapshot_module
from autorl.store import experiments
from autorl_grader import submissions
from tests.support.grading import Grader


@pytest.fixture
def settings(make_settings: Any, pg_url: str, redis_url: str) -> Any:
    return make_settings(
        database_url=pg_url,
        redis_url=redis_url,
        submit_wait_s=0.5,
        unreadable_wait_s=2.0,
        snapshot_wait_s=10.0,
    )


def unreadable_until(moment: float, monkeypatch: pytest.MonkeyPatch) -> None:
    open_folder = snapshot_module._open_submission_folder

    def opened(*args: Any, **kwargs: Any) -> Any:
        if time.monotonic() < moment:
            raise snapshot_module._unreadable("output/ckpt/model.safetensors", "file", "output/ckpt")
        return open_folder(*args, **kwargs)

    monkeypatch.setattr(snapshot_module, "_open_submission_folder", opened)


def test_a_wait_for_another_replicas_lease_leaves_the_files_their_own_wait(
    grading: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = grading.register()
    grading.copy(experiment, "ckpt")
    started = time.monotonic()
    take_lease = experiments.take_snapshot_lease
    monkeypatch.setattr(
        experiments,
        "take_snapshot_lease",
        lambda *args, **kwargs: time.monotonic() >= started + 3.0 and take_lease(*args, **kwargs),
    )
    unreadable_until(started + 4.0, monkeypatch)  # readable 1 s after the lease, within its 2 s
    answer = grading.client.post(
        f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"}, params={"wait": "false"}
    )
    assert answer.status_code == 202 and answer.json()["status"] == "queued", answer.text


def test_files_that_stay_unreadable_are_looked_at_not_submitted_again_and_again(
    grading: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = grading.register()
    grading.copy(experiment, "ckpt")
    reserved = []
    reserve = submissions.reserve_snapshot
    monkeypatch.setattr(
        submissions,
        "reserve_snapshot",
        lambda *args, **kwargs: (reserved.append(1), reserve(*args, **kwargs))[1],
    )
    unreadable_until(time.monotonic() + 60, monkeypatch)
    began = time.monotonic()
    answer = grading.client.post(f"{experiment.url_path}/submit", json={"model_path": "output/ckpt"})
    assert answer.status_code == 400 and "cannot be read by the grader" in answer.json()["detail"], (
        answer.text
    )
    assert time.monotonic() - began >= 1.5  # it waited for group-read
    assert len(reserved) == 2, reserved  # the first try and the last: the database twice, not eight times
