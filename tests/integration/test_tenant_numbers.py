"""Tenants apart in what an agent is shown (real Postgres, a grader served over HTTP):

- every id an agent is shown counts its own experiment's submissions (1, 2, ... with no gaps),
  whatever other experiments submit in between; its numbers reach only its own submissions;
  ``POST /final`` and ``scores.json`` take and show them; the admin API keeps the global ids;
- ``GET /scores`` pages (``after``, ``limit``, ``next_after``); the default page lists every
  submission a reference client expects; an answer is built once per change of the experiment's
  submissions and never shown stale after one is scored;
- a sealed experiment shows its agent no time of the test split's work: the validation baseline
  is evaluated first and its times are not shown; a queue position counts the agent's own
  submissions only."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from autorl.api.answers import MAX_SCORES_PAGE, ExperimentAnswer
from autorl.client import GradingClient
from autorl.store import Database, Feedback, Split, Submission, claims, experiments, outcomes, submissions
from autorl_agent_runner.workspace.layout import Workspace
from autorl_agent_runner.workspace.mirrors import refresh_mirrors
from autorl_grader.api.routes import agent as agent_routes
from tests.support.grading import (
    admin_headers,
    agent_get,
    copy_model,
    new_experiment,
    row_id,
    submit_accepted,
)
from tests.support.infra import ServedApp
from tests.support.runs import (
    WORKER,
    SeededExperiment,
    add_submission,
    create_experiment,
    score_evaluation,
    scores,
)
from tests.support.settings import DeploymentSettings


def test_two_experiments_submitting_interleaved_each_see_their_own_numbers(
    grader: httpx.Client,
    served: ServedApp,
    settings: DeploymentSettings,
    db: Database,
    tiny_base_model: Path,
    tmp_path: Path,
) -> None:
    mine = new_experiment(grader, settings, tiny_base_model, tmp_path, feedback="sealed")
    theirs = new_experiment(grader, settings, tiny_base_model, tmp_path)
    shown: dict[str, list[int]] = {mine.name: [], theirs.name: []}
    for index in range(3):
        for experiment in (mine, theirs):
            folder = f"{experiment.name}-{index}"
            copy_model(tiny_base_model, experiment.output_dir / folder, unique=True)
            answer = submit_accepted(grader, experiment, f"output/{folder}")
            shown[experiment.name].append(answer["submission_id"])
            assert answer["queue_position"] == index + 1  # its own submissions ahead of it, plus one
    # Each counts its own, with no gap for the other's submissions in between.
    assert shown == {mine.name: [1, 2, 3], theirs.name: [1, 2, 3]}
    globals_ = {name: [row_id(db, name, n) for n in (1, 2, 3)] for name in shown}
    # The database's one sequence interleaves them: its gaps would count the other's submissions.
    ours, other = globals_[mine.name], globals_[theirs.name]
    assert ours[0] < other[0] < ours[1] < other[1] < ours[2] < other[2]

    # A number reaches only the caller's own submission; another's global ids reach nothing.
    for experiment in (mine, theirs):
        for number in (1, 2, 3):
            view = agent_get(grader, experiment, f"/submissions/{number}")
            assert view["submission_id"] == number
            assert view["model_path"] == f"output/{experiment.name}-{number - 1}"
    for their_id in globals_[theirs.name]:
        if their_id > 3:
            assert grader.get(f"{mine.url_path}/submissions/{their_id}").status_code == 404
    # The admin API keeps the global ids.
    admin_rows = grader.get(f"/v1/experiments/{mine.name}/submissions", headers=admin_headers(settings))
    assert [row["submission_id"] for row in admin_rows.json()] == globals_[mine.name]
    assert [row["number"] for row in admin_rows.json()] == [1, 2, 3]  # and the agent's, beside
    assert "number" not in agent_get(grader, mine, "/submissions/1")

    # Scored, then nominated by the agent's own number; the admin's final names the global id.
    for number, value in zip((1, 2, 3), (10.0, 30.0, 20.0), strict=True):
        score_evaluation(db, globals_[mine.name][number - 1], value)
        score_evaluation(db, globals_[theirs.name][number - 1], 90.0)
    listing = agent_get(grader, mine, "/scores")
    assert [s["submission_id"] for s in listing["submissions"]] == [1, 2, 3]
    assert listing["best"]["submission_id"] == 2 and listing["next_after"] is None
    nominated = grader.post(f"{mine.url_path}/final", json={"submission_id": 3})
    assert nominated.status_code == 200, nominated.text
    assert nominated.json()["submission_id"] == 3 and nominated.json()["score"] == 20.0
    again = grader.post(f"{mine.url_path}/final", json={"submission_id": 2})
    assert again.status_code == 409 and "(submission 3 was nominated)" in again.json()["error"]
    view = ExperimentAnswer.model_validate(
        grader.get(f"/v1/experiments/{mine.name}", headers=admin_headers(settings)).json()
    )
    assert view.final is not None and view.final.of == globals_[mine.name][2]

    # The workspace's scores.json, as the platform mirrors it: the agent's own numbers.
    workspace = Workspace(mine.workspace, "model")
    with GradingClient(f"{served.url}{mine.url_path}") as client:
        refresh_mirrors(workspace, client, log=print)
    mirrored = json.loads(workspace.scores.read_text())
    assert [entry["submission_id"] for entry in mirrored] == [1, 2, 3]
    assert all(entry["best"]["submission_id"] == 2 for entry in mirrored)


def test_scores_pages_and_a_reference_client_reads_every_submission_in_the_first(
    grader: httpx.Client, served: ServedApp, db: Database, tmp_path: Path
) -> None:
    run = create_experiment(db, tmp_path / "workspace")
    experiment = run.as_agent()
    for _ in range(101):  # one past the reference's 100 (failures of the platform's do not count)
        add_submission(db, run.name)
    first = agent_get(grader, experiment, "/scores")
    assert [s["submission_id"] for s in first["submissions"]] == list(range(1, 101))
    assert first["next_after"] == 100 and first["total_submissions"] == 101
    assert [
        s["submission_id"] for s in agent_get(grader, experiment, "/scores", after=100)["submissions"]
    ] == [101]
    page = agent_get(grader, experiment, "/scores", after=3, limit=2)
    assert ([s["submission_id"] for s in page["submissions"]], page["next_after"]) == ([4, 5], 5)
    last = agent_get(grader, experiment, "/scores", after=99, limit=5)
    assert ([s["submission_id"] for s in last["submissions"]], last["next_after"]) == ([100, 101], None)
    assert agent_get(grader, experiment, "/scores", after=101)["submissions"] == []
    for bad in ({"limit": 0}, {"limit": MAX_SCORES_PAGE + 1}, {"after": -1}, {"after": "x"}):
        refused = grader.get(f"{experiment.url_path}/scores", params=bad)
        assert refused.status_code == 422 and refused.json()["error"], bad
    # The typed client follows the pages.
    with GradingClient(f"{served.url}{experiment.url_path}") as client:
        assert [s.submission_id for s in client.scores().submissions] == list(range(1, 102))


def test_a_scores_answer_is_built_once_per_change_and_never_stale(
    grader: httpx.Client, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = create_experiment(db, tmp_path / "workspace")
    experiment = run.as_agent()
    built: list[int] = []
    real_view: Callable[..., Any] = agent_routes.scores_view

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real_view(*args, **kwargs)

    monkeypatch.setattr(agent_routes, "scores_view", counted)
    queued = add_submission(db, run.name)
    first = agent_get(grader, experiment, "/scores")
    assert first["submissions"][0]["status"] == "queued" and len(built) == 1
    assert agent_get(grader, experiment, "/scores") == first and len(built) == 1  # the same answer, kept
    # An evaluator (another process) takes it, then scores it: each change is seen at once.
    with db.session() as session:
        assert claims.claim(session, queued, worker=WORKER, lease_s=60)
    assert agent_get(grader, experiment, "/scores")["submissions"][0]["status"] == "running"
    with db.session() as session:
        assert outcomes.record_score(
            session, queued, worker=WORKER, scores=scores(42.0), n_samples=10, seconds=1.0
        )
    scored = agent_get(grader, experiment, "/scores")
    assert (scored["submissions"][0]["status"], scored["submissions"][0]["score"]) == ("scored", 42.0)
    assert scored["best"]["submission_id"] == 1 and len(built) == 3
    # A new submission, and a change made with a plain UPDATE of the row, are seen as well.
    add_submission(db, run.name, scores=scores(50.0))
    assert agent_get(grader, experiment, "/scores")["best"]["score"] == 50.0
    with db.session() as session:
        session.get(Submission, queued).score = 60.0  # type: ignore[union-attr]
    assert agent_get(grader, experiment, "/scores")["best"]["score"] == 60.0
    assert agent_get(grader, experiment, "/scores", limit=1)["next_after"] == 1  # another page: its own
    # A baseline recorded while the grader remembers the experiment's row without it (its token
    # is kept for a moment) is in the next answer all the same.
    add_submission(db, run.name, scores=scores(12.5), baseline=True)
    assert agent_get(grader, experiment, "/scores")["baseline_score"] == 12.5


def test_a_sealed_experiment_shows_its_agent_no_time_of_the_test_splits_work(
    grader: httpx.Client, settings: DeploymentSettings, db: Database, tiny_base_model: Path, tmp_path: Path
) -> None:
    """The validation baseline is evaluated before the test baseline (it never waits behind it),
    and a baseline's times are never shown to the agent: what the agent sees of it, of a copy of
    the base model that waited for it, and its queue positions stay the same however long the
    test baseline takes."""
    experiment = new_experiment(grader, settings, tiny_base_model, tmp_path, feedback="sealed")
    asked = grader.post(f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(settings))
    assert asked.status_code == 202, asked.text
    with db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        validation = submissions.baseline_submission(session, row, Split.VALIDATION)
        test = submissions.baseline_submission(session, row, Split.TEST)
        assert validation is not None and test is not None and test.id == asked.json()["submission_id"]
        validation_id, test_id = validation.id, test.id
        # Created first, so evaluators take it first (claims go by id among baselines); whatever
        # else this module's database holds may be claimable too, so the ids are compared.
        assert validation_id < test_id
    # The agent's budget has begun (an operator started it early): a copy of the base model waits
    # for the validation baseline; a trained checkpoint queues behind no baseline in its position.
    copy_model(tiny_base_model, experiment.output_dir / "trained", unique=True)
    shutil.copytree(tiny_base_model, experiment.output_dir / "copy")
    copy = submit_accepted(grader, experiment, "output/copy")
    trained = submit_accepted(grader, experiment, "output/trained")
    # Neither baseline is counted ahead of them (the copy is where the one it waits for is).
    assert (copy["queue_position"], trained["queue_position"]) == (1, 1)
    score_evaluation(db, validation_id, 25.0)

    def shown() -> tuple[Any, Any]:
        return agent_get(grader, experiment, "/submissions/0"), agent_get(
            grader, experiment, "/submissions/1"
        )

    before = shown()
    base, copied = before
    assert base["is_baseline"] and base["split"] == "validation" and base["score"] == 25.0
    assert all(base[field] is None for field in ("timestamp", "created_at", "finished_at", "eval_seconds"))
    assert base["elapsed_seconds"] is None
    assert (copied["status"], copied["reused_from"], copied["score"]) == ("scored", 0, 25.0)
    # The test baseline takes as long as it takes: nothing the agent sees changes.
    with db.session() as session:
        assert claims.claim(session, test_id, worker=WORKER, lease_s=60)
    assert shown() == before
    with db.session() as session:
        assert outcomes.record_score(
            session, test_id, worker=WORKER, scores=scores(30.0), n_samples=10, seconds=900.0
        )
    assert shown() == before
    assert agent_get(grader, experiment, "/submissions/2")["queue_position"] == 1
    assert "30.0" not in json.dumps(agent_get(grader, experiment, "/scores"))
    # Operators see every time.
    admin_rows = grader.get(f"/v1/experiments/{experiment.name}/submissions", headers=admin_headers(settings))
    by_id = {row["submission_id"]: row for row in admin_rows.json()}
    assert by_id[test_id]["eval_seconds"] == 900.0 and by_id[validation_id]["created_at"] is not None


def test_a_test_mode_baseline_shows_its_agent_no_time_either(
    db: Database, grader: httpx.Client, tmp_path: Path
) -> None:
    """A baseline is the platform's work before the agent's budget, queued behind other
    experiments' baselines: its times are not the agent's in either mode."""
    run = create_experiment(db, tmp_path / "workspace", feedback=Feedback.TEST)
    add_submission(db, run.name, scores=scores(12.5), baseline=True)
    base = agent_get(grader, run.as_agent(), "/submissions/0")
    assert base["score"] == 12.5 and base["timestamp"] is None and base["eval_seconds"] is None


def test_nothing_of_a_baseline_or_a_copy_of_the_base_tells_that_another_experiment_measured_it(
    db: Database, grader: httpx.Client, tmp_path: Path
) -> None:
    """Experiments of one base model share its baseline's score, never the news of it: a baseline
    reused from another experiment's looks as one evaluated for its own (its attempts too), and a
    copy of the base model submitted while the agent's own baseline is still being evaluated waits
    for that one, not for whichever experiment's baseline is scored first."""

    def of_one_base(folder: str) -> SeededExperiment:
        run = create_experiment(db, tmp_path / folder)
        with db.session() as session:
            experiments.get_experiment(session, run.name).eval_key = "one base, one evaluation"
        return run

    waiting = of_one_base("waiting")
    own_baseline = add_submission(db, waiting.name, baseline=True, files="the base model")
    measured = of_one_base("measured")
    add_submission(db, measured.name, baseline=True, files="the base model", scores=scores(12.5))
    later = of_one_base("later")
    add_submission(db, later.name, baseline=True, files="the base model")
    evaluated, reused = (agent_get(grader, run.as_agent(), "/submissions/0") for run in (measured, later))
    assert evaluated["score"] == reused["score"] == 12.5
    assert evaluated == {
        **reused,
        "submission_id": evaluated["submission_id"],
        "model_path": evaluated["model_path"],
    }

    copy = add_submission(db, waiting.name, files="the base model")
    with db.read_session() as session:
        assert session.get(Submission, copy).waits_for == own_baseline
    assert agent_get(grader, waiting.as_agent(), "/submissions/1")["status"] == "queued"
