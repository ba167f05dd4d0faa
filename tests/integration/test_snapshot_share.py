"""Each experiment's share of the evaluator storage, which every experiment shares: one experiment
holds at most ``snapshots_per_experiment`` snapshots at once (checkpoints waiting for or in
evaluation, the one a sealed experiment keeps for its final), and a submit past it is refused
before any file is read (503, Retry-After), costing no submission, while other experiments go on.
A running sealed experiment keeps only the snapshot its final would take now (the best on
validation, or the nominated one); a nomination of a submission whose snapshot was let go takes
its folder again and is accepted only if it still holds the scored files. A real grader on
Postgres, in-process; evaluations run for real (``hf``, the tiny model) or are recorded through
the worker's own result path."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from autorl.api.answers import ExperimentAnswer, NominatedAnswer
from autorl.checkpoints import model_files
from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.store import Database, SubmissionStatus, experiments, submissions
from autorl_evaluator.failures import EvaluatorFaultError
from autorl_evaluator.jobs import evaluate
from autorl_grader.reconciler import reconcile_once
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    evaluating_settings,
    make_unique,
    nominate,
    row_id,
    submit_accepted,
    submit_no_wait,
)
from tests.support.runs import score_evaluation
from tests.support.settings import DeploymentSettings

SHARE = 2


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    """Real evaluations of the tiny model on 3 problems; each experiment may hold 2 snapshots."""
    return evaluating_settings(
        lambda **values: make_settings(**values, snapshots_per_experiment=SHARE),
        pg_url,
        limit=3,
        max_new_tokens=6,
    )


def on_disk(settings: DeploymentSettings) -> set[str]:
    assert settings.snapshot_dir is not None
    return (
        {path.name for path in settings.snapshot_dir.iterdir()} if settings.snapshot_dir.is_dir() else set()
    )


def snapshot_of(db: Database, submission_id: int) -> str | None:
    """The snapshot the submission (its global id) names."""
    with db.session() as session:
        return submissions.get_submission(session, submission_id).snapshot


def agents_snapshot(db: Database, experiment: RegisteredExperiment, number: int) -> str | None:
    """The snapshot the experiment's agent's submission ``number`` names."""
    return snapshot_of(db, row_id(db, experiment, number))


def counted(db: Database, experiment: RegisteredExperiment) -> tuple[int, int]:
    """What counts against the limit, and of it the costly refusals."""
    with db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        return submissions.limited_submissions_count(session, row), row.costly_refusals


def admin(grading: Grader, method: str, path: str) -> ExperimentAnswer:
    return ExperimentAnswer.model_validate(grading.admin(method, path))


def share_refusal(held: int) -> str:
    return (
        f"this experiment already holds {held} checkpoints in the evaluator storage, waiting for "
        f"evaluation or kept for its final (at most {SHARE} at once); retry once one has been scored "
        "(GET /scores shows each one's status). This refusal does not count against your submission limit"
    )


def test_an_experiment_past_its_share_is_refused_before_anything_is_read_and_others_go_on(
    grading: Grader,
) -> None:
    hostile = grading.register()
    victim = grading.register()
    for name in ("h0", "h1", "h2", "h3"):
        grading.copy(hostile, name)
    grading.copy(victim, "v0")

    h0, h1 = (submit_no_wait(grading.client, hostile, f"output/{name}") for name in ("h0", "h1"))
    assert (h0.status_code, h1.status_code) == (202, 202), (h0.text, h1.text)
    h0_number = h0.json()["submission_id"]
    h0_id, h1_id = (
        row_id(grading.db, hostile, h0_number),
        row_id(grading.db, hostile, h1.json()["submission_id"]),
    )
    held = on_disk(grading.settings)
    assert len(held) == SHARE

    refused = submit_no_wait(grading.client, hostile, "output/h2")
    assert refused.status_code == 503, refused.text
    assert refused.json()["detail"] == refused.json()["error"] == share_refusal(SHARE)
    assert int(refused.headers["Retry-After"]) > 0
    assert on_disk(grading.settings) == held  # refused before anything was copied
    assert counted(grading.db, hostile) == (2, 0)  # nor counted

    # Another experiment is not starved: its first submit is accepted.
    victim_snapshot = agents_snapshot(
        grading.db, victim, submit_accepted(grading.client, victim, "output/v0")["submission_id"]
    )
    assert victim_snapshot is not None and victim_snapshot in on_disk(grading.settings)

    # Once one is scored, the next is accepted.
    assert evaluate(h0_id, grading.settings)["status"] == "scored"
    # Identical checkpoints hold no snapshot of their own and take no part of the share: one
    # reusing h0's score, one waiting for h1's evaluation.
    shutil.copytree(hostile.output_dir / "h0", hostile.output_dir / "h0-again")
    shutil.copytree(hostile.output_dir / "h1", hostile.output_dir / "h1-again")
    reused = submit_no_wait(grading.client, hostile, "output/h0-again")
    assert reused.status_code == 202 and reused.json()["reused_from"] == h0_number, reused.text
    waiting_id = row_id(
        grading.db, hostile, submit_accepted(grading.client, hostile, "output/h1-again")["submission_id"]
    )
    with grading.db.session() as session:
        row = submissions.get_submission(session, waiting_id)
        assert (row.status, row.waits_for, row.snapshot) == (SubmissionStatus.QUEUED, h1_id, None)
    h2_snapshot = agents_snapshot(
        grading.db, hostile, submit_accepted(grading.client, hostile, "output/h2")["submission_id"]
    )
    assert on_disk(grading.settings) == {snapshot_of(grading.db, h1_id), h2_snapshot, victim_snapshot}

    again = submit_no_wait(grading.client, hostile, "output/h3")
    assert again.status_code == 503 and again.json()["detail"] == share_refusal(SHARE), again.text
    # The refusals took nothing of the limit: h0, h1, the two copies and h2 count, nothing else.
    assert counted(grading.db, hostile) == (5, 0)
    assert grading.client.get(f"{hostile.url_path}/scores").json()["total_submissions"] == 5


def test_a_nomination_of_a_submission_fingerprinted_by_the_earlier_scheme_is_accepted(
    grading: Grader,
) -> None:
    """A submission scored before an upgrade carries the earlier scheme's fingerprint (each file's
    SHA-256 over its bytes): nominating its unchanged folder is accepted, not refused as changed."""
    import hashlib

    experiment = grading.register(feedback="sealed")
    ids: dict[str, int] = {}
    for name, score in (("a", 10.0), ("b", 30.0)):
        grading.copy(experiment, name)
        ids[name] = submit_accepted(grading.client, experiment, f"output/{name}")["submission_id"]
        score_evaluation(grading.db, row_id(grading.db, experiment, ids[name]), score)
    kept = agents_snapshot(grading.db, experiment, ids["a"])
    assert grading.settings.snapshot_dir is not None and kept is not None
    folder = grading.settings.snapshot_dir / kept
    earlier = hashlib.sha256(b"autorl-snapshot-v2\0")
    for path in sorted(folder.iterdir()):
        name = path.name.encode()
        earlier.update(len(name).to_bytes(8, "big") + name + hashlib.sha256(path.read_bytes()).digest())
    with grading.db.session() as session:
        row = submissions.get_submission(session, row_id(grading.db, experiment, ids["a"]))
        assert row.fingerprint != earlier.hexdigest()
        row.fingerprint = earlier.hexdigest()
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    assert (
        agents_snapshot(grading.db, experiment, ids["a"]) is None
    )  # let go: the nomination takes the folder again

    accepted = nominate(grading.client, experiment, ids["a"])
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["submission_id"] == ids["a"] and counted(grading.db, experiment) == (2, 0)


def test_a_sealed_experiment_keeps_only_the_best_and_a_nomination_takes_an_unchanged_folder_again(
    grading: Grader,
) -> None:
    experiment = grading.register(feedback="sealed")
    scores = {"a": 10.0, "b": 30.0, "c": 20.0, "d": 5.0}
    ids: dict[str, int] = {}
    for name in (*scores, "e"):
        grading.copy(experiment, name)
    for name, score in scores.items():  # one at a time: each scored before the next
        ids[name] = submit_accepted(grading.client, experiment, f"output/{name}")["submission_id"]
        score_evaluation(grading.db, row_id(grading.db, experiment, ids[name]), score)
    ids["e"] = submit_accepted(grading.client, experiment, "output/e")["submission_id"]
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]

    # Only the best on validation (b) and the one in flight (e) are on disk.
    best, queued = (
        agents_snapshot(grading.db, experiment, ids["b"]),
        agents_snapshot(grading.db, experiment, ids["e"]),
    )
    assert best is not None and queued is not None
    assert on_disk(grading.settings) == {best, queued}
    assert all(agents_snapshot(grading.db, experiment, ids[name]) is None for name in ("a", "c", "d"))
    # The snapshot kept for the final is part of the share.
    grading.copy(experiment, "f")
    full = submit_no_wait(grading.client, experiment, "output/f")
    assert full.status_code == 503 and full.json()["detail"] == share_refusal(SHARE), full.text
    assert counted(grading.db, experiment) == (5, 0)

    # c's folder changed since it was scored: refused with the fix, counted (the grader read every
    # weight to find it out), nothing kept.
    make_unique(experiment.output_dir / "c")
    changed = nominate(grading.client, experiment, ids["c"])
    assert changed.status_code == 400, changed.text
    detail = changed.json()["detail"]
    assert detail.startswith(
        f"submission {ids['c']}'s folder output/c no longer holds the files that were scored; nominate a "
        "submission whose folder is unchanged, or leave the choice to the platform, which takes the best "
        "on validation, whose files are kept. This refusal counts against your limit of 100 submissions"
    ), detail
    assert counted(grading.db, experiment) == (6, 1)
    assert on_disk(grading.settings) == {best, queued}
    # d's folder is gone: refused with the fix before any weight is read, not counted.
    shutil.rmtree(experiment.output_dir / "d")
    gone = nominate(grading.client, experiment, ids["d"])
    assert gone.status_code == 400, gone.text
    assert gone.json()["detail"].startswith(
        f"submission {ids['d']}'s folder output/d no longer holds the files that were scored (model_path "
        "output/d does not exist"
    ), gone.text
    assert "leave the choice to the platform" in gone.json()["detail"]
    assert counted(grading.db, experiment) == (6, 1) and on_disk(grading.settings) == {best, queued}
    with grading.db.session() as session:
        assert experiments.get_experiment(session, experiment.name).nominated_submission_id is None

    # a's folder is unchanged: taken again, its snapshot is a's, kept for the final; b's is let go.
    accepted = nominate(grading.client, experiment, ids["a"])
    assert accepted.status_code == 200, accepted.text
    assert NominatedAnswer.model_validate(accepted.json()).model_dump(exclude={"message"}) == {
        "submission_id": ids["a"],
        "split": "validation",
        "score": 10.0,
    }
    taken_again = agents_snapshot(grading.db, experiment, ids["a"])
    assert taken_again is not None and on_disk(grading.settings) == {taken_again, queued}
    assert counted(grading.db, experiment) == (6, 1)
    assert nominate(grading.client, experiment, ids["b"]).status_code == 409  # once

    # After the budget, the final of a evaluates for real from the snapshot taken again.
    # A better one no longer matters: a was nominated.
    score_evaluation(grading.db, row_id(grading.db, experiment, ids["e"]), 50.0)
    grading.end_budget(experiment)
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    assert on_disk(grading.settings) == {taken_again}
    view = admin(grading, "POST", f"/{experiment.name}/final")
    assert view.final is not None and view.final.selection == "nominated"
    assert view.final.of == row_id(grading.db, experiment, ids["a"])
    assert view.final.submission_id is not None
    assert snapshot_of(grading.db, view.final.submission_id) == taken_again
    assert evaluate(view.final.submission_id, grading.settings)["status"] == "scored"
    done = admin(grading, "GET", f"/{experiment.name}")
    assert done.final is not None and done.final.status == "scored" and done.test_evaluations == 1


def scored_a_and_best_b(grading: Grader, **values: Any) -> tuple[RegisteredExperiment, dict[str, int]]:
    """A sealed experiment whose agent's a (10) and b (30) are scored: only b's snapshot is kept,
    so nominating a takes its folder again."""
    experiment = grading.register(feedback="sealed", **values)
    ids: dict[str, int] = {}
    for name, score in (("a", 10.0), ("b", 30.0)):
        grading.copy(experiment, name)
        ids[name] = submit_no_wait(grading.client, experiment, f"output/{name}").json()["submission_id"]
        score_evaluation(grading.db, row_id(grading.db, experiment, ids[name]), score)
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    return experiment, ids


def test_a_nomination_whose_folder_must_be_read_again_is_refused_at_the_limit(grading: Grader) -> None:
    experiment, ids = scored_a_and_best_b(grading, max_submissions=2)
    assert agents_snapshot(grading.db, experiment, ids["a"]) is None
    refused = nominate(grading.client, experiment, ids["a"])
    assert refused.status_code == 400, refused.text
    assert "your reached limit of 2 submissions no longer allows" in refused.json()["detail"]
    assert counted(grading.db, experiment) == (2, 0)
    # The best's files are kept: its nomination needs no read.
    assert nominate(grading.client, experiment, ids["b"]).status_code == 200


def test_a_nomination_whose_files_fail_a_check_unforeseen_is_a_logged_refusal_at_no_cost(
    grading: Grader, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As a submit's: the agent gets a 400 naming the fix, the platform's log the traceback."""
    experiment, ids = scored_a_and_best_b(grading)

    def unforeseen(*args: object) -> None:
        raise TypeError("a value no check expected")

    monkeypatch.setattr(model_files, "check_config", unforeseen)
    with caplog.at_level(logging.WARNING, logger="autorl.grader"):
        refused = nominate(grading.client, experiment, ids["a"])
    assert refused.status_code == 400, refused.text
    assert "TypeError while checking them" in refused.json()["detail"], refused.text
    logged = [r for r in caplog.records if "event=submission_malformed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is TypeError
    assert counted(grading.db, experiment) == (2, 0)


def test_a_failed_evaluation_keeps_its_snapshot_for_what_still_needs_it(
    grading: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real job function: a copy that waited for an evaluation that failed for the
    evaluator's fault takes that evaluation's snapshot, and a sealed final that failed so is made
    again from its own; each then scores for real."""
    from autorl_evaluator import backends

    real_backend = backends.get_backend

    class EngineDown:
        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            raise EvaluatorFaultError("the engine did not start")

    def fail_once() -> None:
        monkeypatch.setattr(backends, "get_backend", lambda name: EngineDown())

    experiment = grading.register(feedback="sealed")
    grading.copy(experiment, "a")
    shutil.copytree(experiment.output_dir / "a", experiment.output_dir / "a-again")
    first = row_id(
        grading.db, experiment, submit_no_wait(grading.client, experiment, "output/a").json()["submission_id"]
    )
    copy = row_id(
        grading.db,
        experiment,
        submit_no_wait(grading.client, experiment, "output/a-again").json()["submission_id"],
    )
    snapshot = snapshot_of(grading.db, first)
    assert (
        snapshot is not None
        and snapshot_of(grading.db, copy) is None
        and on_disk(grading.settings) == {snapshot}
    )

    fail_once()
    failed = evaluate(first, grading.settings)
    assert failed["status"] == "failed" and failed["error"].startswith(EVALUATOR_FAULT_PREFIX)
    assert snapshot_of(grading.db, copy) == snapshot and on_disk(grading.settings) == {snapshot}
    monkeypatch.setattr(backends, "get_backend", real_backend)
    assert evaluate(copy, grading.settings)["status"] == "scored"  # from the snapshot it took

    grading.end_budget(experiment)
    view = admin(grading, "POST", f"/{experiment.name}/final")
    assert view.final is not None and view.final.of == copy and view.final.submission_id is not None
    fail_once()
    assert evaluate(view.final.submission_id, grading.settings)["status"] == "failed"
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    assert on_disk(grading.settings) == {snapshot}  # kept: the final is made again from it
    monkeypatch.setattr(backends, "get_backend", real_backend)
    again = admin(grading, "POST", f"/{experiment.name}/final")
    assert again.final is not None and again.final.submission_id not in (None, view.final.submission_id)
    assert evaluate(again.final.submission_id, grading.settings)["status"] == "scored"
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    assert on_disk(grading.settings) == set()
