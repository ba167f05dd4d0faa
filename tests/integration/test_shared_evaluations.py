"""Identical submissions of one experiment in flight at the same time are evaluated once.

Real concurrency through a grader served over HTTP, on Postgres and on SQLite: the copies are
submitted together, exactly one of them is handed to evaluators, the others wait for its result
and take its score; after a failure the next copy is evaluated itself. Another experiment's
identical files are never waited for, nor their score reused (that would tell its agent, by the
time a score takes, that someone else submitted them); only a baseline of the same base model is
shared across experiments."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from autorl.store import (
    Database,
    FailureReason,
    Submission,
    SubmissionStatus,
    claims,
    experiments,
    outcomes,
    submissions,
)
from tests.support.checkpoints import read_safetensors, write_safetensors
from tests.support.grading import (
    RegisteredExperiment,
    admin_headers,
    agent_get,
    copy_model,
    new_experiment,
    number_of,
    row_id,
    submit_accepted,
    submit_no_wait,
)
from tests.support.reference import REFERENCE_BEST_FIELDS
from tests.support.runs import WORKER, fail_evaluation, score_evaluation
from tests.support.settings import DeploymentSettings

COPIES = 4


@pytest.fixture(params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("fresh_pg_url")
        return url
    return f"sqlite:///{tmp_path / 'autorl.db'}"


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], database_url: str) -> DeploymentSettings:
    return make_settings(database_url=database_url, submit_wait_s=0.0)


def identical_copies(experiment: RegisteredExperiment, base: Path, count: int) -> list[str]:
    """``count`` folders with the same files (not the base model's: those would wait for the baseline)."""
    first = copy_model(base, experiment.output_dir / "copy-0", unique=True)
    for i in range(1, count):
        shutil.copytree(first, experiment.output_dir / f"copy-{i}")
    return [f"output/copy-{i}" for i in range(count)]


def submit_together(
    grader: httpx.Client, db: Database, experiment: RegisteredExperiment, paths: list[str]
) -> list[int]:
    """Submit ``paths`` at once; their global ids (the database's, the evaluators')."""
    barrier = threading.Barrier(len(paths))
    ids: list[int] = []
    errors: list[str] = []

    def one(path: str) -> None:
        barrier.wait()
        response = submit_no_wait(grader, experiment, path)
        if response.status_code == 202:
            ids.append(response.json()["submission_id"])
        else:
            errors.append(response.text)

    threads = [threading.Thread(target=one, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return sorted(row_id(db, experiment, number) for number in ids)


def rows(db: Database, ids: list[int]) -> dict[int, Submission]:
    with db.session() as session:
        found = {i: session.get(Submission, i) for i in ids}
        session.expunge_all()
    return {i: row for i, row in found.items() if row is not None}


def claimable(db: Database) -> set[int]:
    with db.session() as session:
        return {c.submission_id for c in claims.claimable_in_fair_order(session)}


def agent_view(
    grader: httpx.Client, db: Database, experiment: RegisteredExperiment, submission_id: int
) -> dict[str, Any]:
    """The submission whose global id is ``submission_id`` as its agent sees it (by its number)."""
    body: dict[str, Any] = agent_get(grader, experiment, f"/submissions/{number_of(db, submission_id)}")
    return body


def test_concurrent_identical_submissions_share_one_evaluation(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path)
    ids = submit_together(grader, db, experiment, identical_copies(experiment, tiny_base_model, COPIES))
    assert len(ids) == COPIES
    first, *others = ids
    found = rows(db, ids)
    # One evaluation is queued; every other copy waits for it, not for one another.
    assert found[first].waits_for is None
    assert {found[i].waits_for for i in others} == {first}
    assert claimable(db) & set(ids) == {first}
    with db.session() as session:  # a worker handed a waiting copy's id anyway cannot take it
        assert not claims.claim(session, others[0], worker=WORKER, lease_s=60)
    assert all(agent_view(grader, db, experiment, i)["status"] == "queued" for i in ids)
    # Each copy is where the evaluation it waits for is; a later submission is not behind them.
    assert {agent_view(grader, db, experiment, i)["queue_position"] for i in ids} == {1}
    copy_model(tiny_base_model, experiment.output_dir / "other", unique=True)
    [later] = submit_together(grader, db, experiment, ["output/other"])
    assert agent_view(grader, db, experiment, later)["queue_position"] == 2
    with db.session() as session:
        assert claims.claim(session, first, worker=WORKER, lease_s=60)
    assert {agent_view(grader, db, experiment, i)["queue_position"] for i in others} == {0}
    assert agent_view(grader, db, experiment, later)["queue_position"] == 1
    with db.session() as session:  # back in the queue, as the reconciler leaves a dead worker's
        claims.release(session, first, worker=WORKER, error="worker stopped")

    score_evaluation(db, first, 42.0, seconds=2.0)
    for i in ids:
        view = agent_view(grader, db, experiment, i)
        assert (view["status"], view["score"]) == ("scored", 42.0), view
    found = rows(db, ids)
    assert [found[i].reused_from for i in others] == [first] * len(others)
    assert all(found[i].eval_seconds == 0.0 and found[i].waits_for is None for i in others)
    assert found[first].eval_seconds == 2.0


def test_a_copy_of_the_base_model_waits_for_the_baseline_in_flight(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path)
    baseline = grader.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))
    assert baseline.status_code == 202, baseline.text
    baseline_id = baseline.json()["submission_id"]
    shutil.copytree(tiny_base_model, experiment.output_dir / "untouched")
    [copy_id] = submit_together(grader, db, experiment, ["output/untouched"])
    assert rows(db, [copy_id])[copy_id].waits_for == baseline_id
    score_evaluation(db, baseline_id, 8.0)
    view = agent_view(grader, db, experiment, copy_id)
    # The baseline, as the agent numbers it (0), never its global id.
    assert (view["status"], view["score"], view["reused_from"]) == ("scored", 8.0, 0)


def test_after_an_evaluator_failure_the_next_copy_is_evaluated_not_failed(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path)
    first, second, third = submit_together(
        grader, db, experiment, identical_copies(experiment, tiny_base_model, 3)
    )
    fail_evaluation(db, first, "out of memory")
    found = rows(db, [first, second, third])
    assert found[first].status == SubmissionStatus.FAILED
    assert found[first].failure_reason == FailureReason.EVALUATION
    assert (found[second].status, found[second].waits_for) == (SubmissionStatus.QUEUED, None)
    assert (found[third].status, found[third].waits_for) == (SubmissionStatus.QUEUED, second)
    assert claimable(db) & {first, second, third} == {second}
    score_evaluation(db, second, 17.0)
    assert agent_view(grader, db, experiment, third)["score"] == 17.0
    assert agent_view(grader, db, experiment, first)["status"] == "failed"


def test_another_experiments_identical_evaluation_is_never_waited_for(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    mine = new_experiment(grader, settings, tiny_base_model, tmp_path / "mine")
    theirs = new_experiment(grader, settings, tiny_base_model, tmp_path / "theirs")
    [path] = identical_copies(theirs, tiny_base_model, 1)
    shutil.copytree(theirs.workspace / path, mine.workspace / path)
    [their_id] = submit_together(grader, db, theirs, [path])
    [my_id] = submit_together(grader, db, mine, [path])
    found = rows(db, [their_id, my_id])
    assert found[their_id].fingerprint == found[my_id].fingerprint
    assert found[my_id].waits_for is None
    assert {their_id, my_id} <= claimable(db)


def trained_copy(base: Path, target: Path) -> Path:
    """The base model with one weight changed, as training leaves it: not the base model's files."""
    shutil.copytree(base, target)
    header, data = read_safetensors(target / "model.safetensors")
    # The lowest byte of the first float32 weight: a new value, still finite.
    write_safetensors(target / "model.safetensors", header, bytes([data[0] ^ 1]) + data[1:])
    return target


def measure_baseline(
    grader: httpx.Client, settings: DeploymentSettings, experiment: RegisteredExperiment
) -> int:
    response = grader.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))
    assert response.status_code in (200, 202), response.text
    baseline_id: int = response.json()["submission_id"]
    return baseline_id


def test_another_experiments_scored_checkpoint_is_evaluated_again_not_reused(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    """Same base model, same evaluation settings, same bytes: the second experiment's submission
    is queued for its own evaluation, and nothing in its answers comes from the first's."""
    model = f"local:shared-{uuid.uuid4().hex[:8]}"
    theirs = new_experiment(grader, settings, tiny_base_model, tmp_path / "theirs", model=model)
    mine = new_experiment(grader, settings, tiny_base_model, tmp_path / "mine", model=model)
    path = "output/trained"
    trained_copy(tiny_base_model, theirs.workspace / path)
    shutil.copytree(theirs.workspace / path, mine.workspace / path)
    their_baseline = measure_baseline(grader, settings, theirs)
    score_evaluation(db, their_baseline, 8.0)
    [their_id] = submit_together(grader, db, theirs, [path])
    score_evaluation(db, their_id, 42.0)

    answer = submit_accepted(grader, mine, path)
    my_number = answer["submission_id"]
    my_id = row_id(db, mine, my_number)
    assert answer["status"] == "queued"
    found = rows(db, [their_id, my_id])
    assert found[their_id].fingerprint == found[my_id].fingerprint
    assert (found[my_id].reused_from, found[my_id].waits_for) == (None, None)
    assert my_id in claimable(db)
    view = agent_view(grader, db, mine, my_id)
    assert (view["status"], view["score"], view["reused_from"], view["eval_seconds"]) == (
        "queued",
        None,
        None,
        None,
    )
    assert view["queue_position"] == 1 and set(view["best"].values()) == {None}
    scores = grader.get(f"{mine.url_path}/scores").json()
    assert [row["submission_id"] for row in scores["submissions"]] == [my_number] == [1]
    assert "42.0" not in str(scores)  # the other experiment's score shows nowhere

    score_evaluation(db, my_id, 30.0, seconds=2.0)  # its own evaluation, its own score
    view = agent_view(grader, db, mine, my_id)
    assert (view["status"], view["score"], view["eval_seconds"], view["reused_from"]) == (
        "scored",
        30.0,
        2.0,
        None,
    )
    # best is the best submission's whole entry, as the reference's (its own, never theirs).
    assert (
        view["best"] == {key: view[key] for key in REFERENCE_BEST_FIELDS}
        and view["best"]["model_path"] == path
    )
    # Within the experiment, identical files still take its own earlier score at once.
    shutil.copytree(mine.workspace / path, mine.output_dir / "again")
    again = submit_no_wait(grader, mine, "output/again")
    assert again.status_code == 202 and again.json()["status"] == "scored", again.text
    assert again.json()["best"] == view["best"]  # the earlier one stays best (equal score, lower id)
    assert (again.json()["score"], again.json()["reused_from"], again.json()["eval_seconds"]) == (
        30.0,
        my_number,
        0.0,
    )


def test_a_copy_of_the_base_model_takes_its_own_experiments_baseline_measured_once_for_all(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    """Experiments of one base model share its baseline's evaluation, never the news of it: a copy
    of the base model submitted before its own experiment's baseline is queued (it never takes
    the score the moment another experiment's baseline ends); once its own baseline takes the
    measured score, a copy takes that at once and 0 GPU-seconds."""
    model = f"local:shared-{uuid.uuid4().hex[:8]}"
    theirs = new_experiment(grader, settings, tiny_base_model, tmp_path / "theirs", model=model)
    mine = new_experiment(grader, settings, tiny_base_model, tmp_path / "mine", model=model)
    their_baseline = measure_baseline(grader, settings, theirs)
    score_evaluation(db, their_baseline, 8.0)

    shutil.copytree(tiny_base_model, mine.output_dir / "untouched")
    copy = submit_no_wait(grader, mine, "output/untouched")
    assert copy.status_code == 202 and copy.json()["status"] == "queued", copy.text
    # The experiment's own baseline takes the measured score (no second evaluation), and the
    # copy its score with it: its own baseline's, never naming the other experiment's id.
    # Once the experiment's own baseline takes the measured score (no second evaluation), a copy
    # takes it at once, 0 GPU-seconds, naming its own baseline, never the other experiment's id.
    measure_baseline(grader, settings, mine)
    shutil.copytree(tiny_base_model, mine.output_dir / "untouched-again")
    again = submit_no_wait(grader, mine, "output/untouched-again")
    assert again.status_code == 202 and again.json()["status"] == "scored", again.text
    assert (again.json()["score"], again.json()["eval_seconds"], again.json()["reused_from"]) == (8.0, 0.0, 0)

    # Another base model's baseline is not this experiment's to take, even with the same bytes.
    elsewhere = new_experiment(grader, settings, tiny_base_model, tmp_path / "elsewhere")
    shutil.copytree(tiny_base_model, elsewhere.output_dir / "untouched")
    measured = submit_no_wait(grader, elsewhere, "output/untouched")
    assert measured.status_code == 202 and measured.json()["status"] == "queued", measured.text


# SQLite runs one write transaction at a time (BEGIN IMMEDIATE): nothing interleaves there.
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_an_evaluation_ending_while_a_copy_is_submitted_still_hands_it_the_score(
    settings: DeploymentSettings, db: Database, tiny_base_model: Path, grader: httpx.Client, tmp_path: Path
) -> None:
    """The copy's check and the evaluation's end are ordered by the experiment's row lock: the
    evaluation cannot end between the copy's "wait for it" and its commit (it would miss the copy)."""
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path)
    [first] = submit_together(grader, db, experiment, identical_copies(experiment, tiny_base_model, 1))
    with db.session() as session:
        assert claims.claim(session, first, worker=WORKER, lease_s=60)
        fingerprint = submissions.get_submission(session, first).fingerprint
    copy_inserted, scored = threading.Event(), threading.Event()

    def end_the_evaluation() -> None:
        copy_inserted.wait()
        with db.session() as session:
            scores = {"opencompass": 55.0}
            outcomes.record_score(session, first, worker=WORKER, scores=scores, n_samples=5, seconds=1.0)
        scored.set()

    worker = threading.Thread(target=end_the_evaluation)
    worker.start()
    with db.session() as session:  # as the grader's accept(): lock, check, insert, commit
        locked = experiments.get_experiment(session, experiment.name, for_update=True)
        copy = submissions.create_submission(
            session, locked, model_path="output/copy", fingerprint=fingerprint
        )
        assert copy.waits_for == first
        copy_id = copy.id
        copy_inserted.set()
        time.sleep(1.0)
        assert not scored.is_set()  # the evaluation's end waits for this commit
    worker.join(timeout=30)
    assert scored.is_set()
    found = rows(db, [copy_id])[copy_id]
    assert (found.status, found.score, found.reused_from) == (SubmissionStatus.SCORED, 55.0, first)


def test_the_reconciler_settles_copies_whose_evaluation_ended_without_them(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path)
    first, second = submit_together(grader, db, experiment, identical_copies(experiment, tiny_base_model, 2))
    score_evaluation(db, first, 12.5)
    with db.session() as session:  # as if the copy had been committed after the evaluation's end
        waiting = submissions.get_submission(session, second)
        waiting.status, waiting.score, waiting.waits_for = SubmissionStatus.QUEUED, None, first
    with db.session() as session:
        assert outcomes.settle_orphaned_waiting(session) == 1
    assert agent_view(grader, db, experiment, second)["score"] == 12.5
