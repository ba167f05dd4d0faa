"""Feedback modes through the grader and the real job function (``hf`` backend, tiny model):

- ``test``: every answer says ``"split": "test"``; the experiment's result is its best on test.
- ``sealed``: the baseline is evaluated on both splits; every submission is scored on the
  validation split and compared with the baseline there; the agent's routes never show a test
  evaluation; ``POST /final`` nominates once (every refusal answered); after the budget exactly
  one evaluation on the test split is made, of the nominated submission, else the best on
  validation (ties: the earliest)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from autorl.api.answers import MAX_FINAL_ATTEMPTS, ExperimentAnswer, NominatedAnswer, SubmissionAnswer
from autorl.errors import EVALUATOR_FAULT_PREFIX
from autorl.store import Database, Split, experiments, submissions
from autorl.store.models import FailureReason, utcnow
from autorl_evaluator.jobs import evaluate
from autorl_grader.main import create_app
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    agent_get,
    evaluating_settings,
    nominate,
    row_id,
    submit_accepted,
    submit_no_wait,
)
from tests.support.infra import serve
from tests.support.runs import fail_evaluation
from tests.support.settings import DeploymentSettings

LIMIT = 3
MAX_NEW_TOKENS = 6


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    """The grader's settings (its ``client`` is the integration tests' own): real evaluations of
    the tiny model on a few problems."""
    return evaluating_settings(make_settings, pg_url, limit=LIMIT, max_new_tokens=MAX_NEW_TOKENS)


def baselines(grading: Grader, name: str) -> None:
    """Ask for the baseline and evaluate every baseline evaluation the grader created."""
    grading.admin("POST", f"/{name}/baseline")
    with grading.db.session() as session:
        experiment = experiments.get_experiment(session, name)
        ids = [s.id for s in submissions.experiment_submissions(session, experiment) if not s.status.final]
    for submission_id in ids:
        assert evaluate(submission_id, grading.settings)["status"] == "scored"


@pytest.fixture
def sealed(grading: Grader) -> RegisteredExperiment:
    """A sealed experiment, started, with its baselines on test and on validation evaluated."""
    experiment = grading.register(feedback="sealed")
    baselines(grading, experiment.name)
    return experiment


class Submitted(NamedTuple):
    """A submission as its agent numbers it and as the database (and the admin API) knows it."""

    number: int
    id: int


def submit(grading: Grader, experiment: RegisteredExperiment, name: str) -> Submitted:
    accepted = submit_no_wait(grading.client, experiment, f"output/{name}")
    assert accepted.status_code == 202, accepted.text
    number: int = accepted.json()["submission_id"]
    submitted = Submitted(number, row_id(grading.db, experiment, number))
    if accepted.json()["status"] == "queued":  # else its score was known at once
        assert evaluate(submitted.id, grading.settings)["status"] == "scored"
    return submitted


def test_test_mode_scores_every_submission_on_the_test_split_and_its_result_is_the_best(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    assert experiment.view["feedback"] == "test"
    baselines(grading, experiment.name)
    grading.copy(experiment, "a")
    first = submit(grading, experiment, "a")
    answer = agent_get(grading.client, experiment, f"/submissions/{first.number}")
    assert answer["split"] == "test"
    assert all(s["split"] == "test" for s in agent_get(grading.client, experiment, "/scores")["submissions"])
    view = ExperimentAnswer.model_validate(grading.admin("GET", f"/{experiment.name}"))
    assert view.final is not None and view.final.selection == "best_on_test"
    assert view.final.score == view.best_score and view.final.of == view.best_submission == first.id
    assert view.final.interval == answer["interval"]
    assert view.test_evaluations == 1
    # /final belongs to sealed mode only.
    refused = grading.client.post(f"{experiment.url_path}/final", json={"submission_id": first.number})
    assert refused.status_code == 409 and "feedback: test" in refused.json()["error"]
    # The admin's final step changes nothing in test mode.
    assert grading.admin("POST", f"/{experiment.name}/final")["final"]["selection"] == "best_on_test"


def test_sealed_mode_shows_the_agent_validation_only_and_evaluates_the_nominated_one_on_test_once(
    grading: Grader,
) -> None:
    experiment = grading.register(feedback="sealed")
    assert experiment.view["feedback"] == "sealed"
    baselines(grading, experiment.name)
    with grading.db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        test_base = submissions.baseline_submission(session, row, Split.TEST)
        validation_base = submissions.baseline_submission(session, row, Split.VALIDATION)
        assert test_base is not None and validation_base is not None
        assert test_base.split == Split.TEST and validation_base.split == Split.VALIDATION
        # Different problems, different keys (the baseline cache keeps one per split).
        assert test_base.problems_digest != validation_base.problems_digest
        assert test_base.eval_key != validation_base.eval_key
        test_base_id, validation_base_id = test_base.id, validation_base.id
        validation_base_score = validation_base.score

    for name in ("a", "b", "c"):
        grading.copy(experiment, name)
    a = submit(grading, experiment, "a")
    answer = agent_get(grading.client, experiment, f"/submissions/{a.number}")
    SubmissionAnswer.model_validate(answer)
    assert answer["split"] == "validation"
    assert answer["baseline_score"] == validation_base_score
    with grading.db.session() as session:
        scored, base = (
            submissions.get_submission(session, a.id),
            submissions.get_submission(session, validation_base_id),
        )
        assert scored.problems_digest == base.problems_digest  # compared on the same problems
        assert scored.snapshot is not None  # kept: it may be nominated

    # The agent's routes never show a test-split evaluation: its numbers are its submissions and
    # the baseline on validation (0).
    shown_baseline = agent_get(grading.client, experiment, "/submissions/0")
    assert shown_baseline["is_baseline"] and shown_baseline["split"] == "validation"
    assert grading.client.get(f"{experiment.url_path}/submissions/{a.number + 1}").status_code == 404

    # /final: every refusal, JSON with detail and error naming the fix.
    def nominate(body: Any) -> Any:
        return grading.client.post(f"{experiment.url_path}/final", json=body)

    for malformed in (
        {},
        {"submission_id": "x"},
        {"submission_id": -1},
        {"submission_id": a.number, "extra": 1},
    ):
        refused = nominate(malformed)
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]
    unknown = nominate({"submission_id": 2**31 - 1})
    assert unknown.status_code == 400 and "GET /scores" in unknown.json()["error"]
    # 0 is the baseline's number: not one of the agent's submissions, refused as an unknown one.
    baseline = nominate({"submission_id": 0})
    assert baseline.status_code == 400 and "is the baseline" in baseline.json()["error"], baseline.text
    queued = submit_no_wait(grading.client, experiment, "output/b").json()["submission_id"]
    unscored = nominate({"submission_id": queued})
    assert unscored.status_code == 400 and "not scored" in unscored.json()["error"]
    assert evaluate(row_id(grading.db, experiment, queued), grading.settings)["status"] == "scored"
    accepted = nominate({"submission_id": a.number})
    assert accepted.status_code == 200, accepted.text
    nominated = NominatedAnswer.model_validate(accepted.json())
    assert (nominated.submission_id, nominated.split) == (a.number, "validation")
    again = nominate({"submission_id": queued})
    assert again.status_code == 409 and again.json()["detail"] == again.json()["error"]

    # After the budget: the platform's final step evaluates the nominated submission on test, once.
    with grading.db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        row.end_time = utcnow() - timedelta(seconds=1)
    late = nominate({"submission_id": a.number})
    assert late.status_code == 403 and "budget" in late.json()["error"]
    view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert view.final is not None and view.final.selection == "nominated" and view.final.of == a.id
    assert view.in_flight == 1 and view.test_evaluations == 0
    final_id = view.final.submission_id
    assert final_id is not None
    assert evaluate(final_id, grading.settings)["status"] == "scored"
    again_view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert again_view.final is not None and again_view.final.submission_id == final_id  # once
    assert again_view.test_evaluations == 1
    assert again_view.submissions == 2 and again_view.total_submissions == 2  # the final is not the agent's
    assert again_view.final.status == "scored" and again_view.final.interval is not None
    assert again_view.final.comparison is not None  # against the baseline on the test split
    with grading.db.session() as session:
        final_row = submissions.get_submission(session, final_id)
        assert (
            final_row.split == Split.TEST
            and final_row.problems_digest == submissions.get_submission(session, test_base_id).problems_digest
        )

    # Nothing the agent can read carries it: not /scores, not /submissions/N, not the totals.
    assert grading.client.get(f"{experiment.url_path}/submissions/3").status_code == 404
    listing = agent_get(grading.client, experiment, "/scores")
    assert [s["submission_id"] for s in listing["submissions"]] == [a.number, queued] == [1, 2]
    assert all(s["split"] == "validation" for s in listing["submissions"])
    assert listing["total_submissions"] == 2
    assert listing["best"]["submission_id"] in {a.number, queued}


def test_without_a_nomination_the_best_on_validation_is_evaluated_earliest_on_ties(
    grading: Grader, sealed: RegisteredExperiment
) -> None:
    experiment = sealed
    grading.copy(experiment, "first")
    grading.copy(experiment, "second")
    first = submit(grading, experiment, "first")
    second = submit(grading, experiment, "second")
    with grading.db.session() as session:  # an equal validation score: the earliest is taken
        submissions.get_submission(session, second.id).score = submissions.get_submission(
            session, first.id
        ).score
    view = ExperimentAnswer.model_validate(grading.admin("GET", f"/{experiment.name}"))
    assert view.final is not None and (view.final.of, view.final.status) == (first.id, None)
    assert view.final.selection == "best_on_validation"
    final = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert final.final is not None and final.final.of == first.id and final.final.submission_id is not None
    # The final has begun: no more submissions, no nomination.
    grading.copy(experiment, "late")
    late = grading.client.post(f"{experiment.url_path}/submit", json={"model_path": "output/late"})
    assert late.status_code == 409
    assert (
        grading.client.post(f"{experiment.url_path}/final", json={"submission_id": first.number}).status_code
        == 409
    )


def test_a_nomination_of_a_failed_submission_is_refused(grading: Grader) -> None:
    experiment = grading.register(feedback="sealed")
    grading.copy(experiment, "broken")
    failing = submit_accepted(grading.client, experiment, "output/broken")["submission_id"]
    failing_row = row_id(grading.db, experiment, failing)
    fail_evaluation(grading.db, failing_row, "the model does not load")
    assert agent_get(grading.client, experiment, f"/submissions/{failing}")["status"] == "failed"
    refused = nominate(grading.client, experiment, failing)
    assert refused.status_code == 400, refused.text
    assert "is failed, not scored" in refused.json()["error"]
    with grading.db.session() as session:  # a refusal costs nothing: a later nomination is still open
        assert experiments.get_experiment(session, experiment.name).nominated_submission_id is None


def test_a_nomination_of_another_experiments_scored_submission_is_refused(grading: Grader) -> None:
    ours = grading.register(feedback="sealed")
    theirs = grading.register(feedback="sealed")
    grading.copy(theirs, "a")
    theirs_a = submit(grading, theirs, "a")
    assert agent_get(grading.client, theirs, f"/submissions/{theirs_a.number}")["status"] == "scored"
    # Neither its number (ours has no submission 1 yet) nor its global id is ours to nominate.
    for their_id in (theirs_a.number, theirs_a.id):
        refused = nominate(grading.client, ours, their_id)
        assert refused.status_code == 400, refused.text
        # The same answer as for an id that exists nowhere: another experiment's ids are not revealed.
        assert refused.json()["error"] == (
            f"no submission {their_id} in this experiment; nominate an id from GET /scores"
        )
    with grading.db.session() as session:
        assert experiments.get_experiment(session, ours.name).nominated_submission_id is None
    # Its own experiment's agent may still nominate it.
    assert nominate(grading.client, theirs, theirs_a.number).status_code == 200


def test_a_nomination_before_the_budget_starts_is_refused(grading: Grader) -> None:
    experiment = grading.register(feedback="sealed", start=False)
    refused = nominate(grading.client, experiment, 1)
    assert refused.status_code == 403, refused.text
    assert "has not started" in refused.json()["error"] and "GET /time" in refused.json()["error"]
    with grading.db.session() as session:
        assert experiments.get_experiment(session, experiment.name).nominated_submission_id is None


def test_a_final_of_a_copy_of_the_base_model_takes_the_test_baseline_and_counts_no_test_evaluation(
    grading: Grader, sealed: RegisteredExperiment
) -> None:
    experiment = sealed
    grading.copy(experiment, "copy", unique=False)  # the base model's own files
    copy = submit(grading, experiment, "copy")
    assert nominate(grading.client, experiment, copy.number).status_code == 200
    with grading.db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        row.end_time = utcnow() - timedelta(seconds=1)
        test_baseline = submissions.baseline_submission(session, row, Split.TEST)
        assert test_baseline is not None
        test_baseline_id, test_baseline_score = test_baseline.id, test_baseline.score
    view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    # Scored at once with the baseline's score on test: no evaluation ran, and the baseline's own
    # evaluation is not the agent's, so the experiment caused none on test.
    assert view.final is not None and (view.final.of, view.final.status) == (copy.id, "scored")
    assert view.final.score == test_baseline_score and view.in_flight == 0
    assert view.test_evaluations == 0
    with grading.db.session() as session:
        assert view.final.submission_id is not None
        assert submissions.get_submission(session, view.final.submission_id).reused_from == test_baseline_id


#: How an evaluation fails, as the worker records it: the error and the reason.
FAILURES = {
    "evaluator": (
        f"{EVALUATOR_FAULT_PREFIX} (not your checkpoint's fault): the engine did not start",
        FailureReason.EVALUATION,
    ),
    "setup": ("the submission's snapshot is gone from the evaluator's storage", FailureReason.SETUP),
    "checkpoint": ("the model does not load", FailureReason.EVALUATION),
}


def fail_as_the_evaluator(db: Database, submission_id: int, *, how: str = "evaluator") -> None:
    """The worker's result path for a failure: the evaluator's own (an engine that would not
    start), one before the test split was loaded, or the checkpoint's."""
    error, reason = FAILURES[how]
    fail_evaluation(db, submission_id, error, reason=reason)


def test_a_final_that_failed_for_the_evaluator_s_fault_is_made_again_from_the_kept_snapshot(
    grading: Grader, sealed: RegisteredExperiment
) -> None:
    """The sealed result is not lost to an evaluator's failure: asked again, the platform makes a
    new final of the same submission from the same snapshot (kept meanwhile), up to three in all;
    a failure that computed no score is no test evaluation. A failure of the checkpoint's own is
    the result."""
    from autorl_grader.reconciler import reconcile_once

    experiment = sealed
    grading.copy(experiment, "a")
    a = submit(grading, experiment, "a")
    with grading.db.session() as session:
        row = experiments.get_experiment(session, experiment.name)
        row.end_time = utcnow() - timedelta(seconds=1)
        snapshot = submissions.get_submission(session, a.id).snapshot
    assert snapshot is not None and grading.settings.snapshot_dir is not None
    first = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert first.final is not None and first.final.submission_id is not None
    fail_as_the_evaluator(grading.db, first.final.submission_id)
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]  # prunes snapshots
    assert (grading.settings.snapshot_dir / snapshot).is_dir()  # kept: the final may be made again

    failed = ExperimentAnswer.model_validate(grading.admin("GET", f"/{experiment.name}"))
    assert failed.final is not None and failed.final.status == "failed"
    assert failed.test_evaluations == 0 and failed.in_flight == 0  # no score was computed on test
    second = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert (
        second.final is not None
        and second.final.of == a.id
        and second.final.selection == "best_on_validation"
    )
    assert second.final.submission_id not in (None, first.final.submission_id)
    assert second.in_flight == 1
    assert (
        evaluate(second.final.submission_id, grading.settings)["status"] == "scored"
    )  # from the kept snapshot
    scored = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert scored.final is not None and scored.final.submission_id == second.final.submission_id  # once
    assert scored.final.status == "scored" and scored.test_evaluations == 1
    reconcile_once(grading.client.app.state.grader)  # type: ignore[attr-defined]
    assert not (grading.settings.snapshot_dir / snapshot).exists()


def test_a_final_is_made_at_most_three_times_and_a_checkpoint_s_own_failure_is_final(grading: Grader) -> None:
    experiment = grading.register(feedback="sealed")
    grading.copy(experiment, "a")
    grading.copy(experiment, "b")
    a, b = submit(grading, experiment, "a"), submit(grading, experiment, "b")
    grading.end_budget(experiment)
    made = []
    for _ in range(MAX_FINAL_ATTEMPTS + 1):
        view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
        assert view.final is not None and view.final.submission_id is not None
        if view.final.status == "queued":
            made.append(view.final.submission_id)
            # Before the test split was loaded (its snapshot gone), or the evaluator's own fault:
            # either way no score was computed, so each is made again and none is a test evaluation.
            how = ("setup", "evaluator", "setup")[len(made) - 1]
            fail_as_the_evaluator(grading.db, view.final.submission_id, how=how)
    assert len(made) == MAX_FINAL_ATTEMPTS == len(set(made))
    assert view.final.submission_id == made[-1] and view.final.status == "failed" and view.in_flight == 0
    assert view.final.of in (a.id, b.id) and view.test_evaluations == 0

    other = grading.register(feedback="sealed")
    grading.copy(other, "c")
    c = submit(grading, other, "c")
    grading.end_budget(other)
    view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{other.name}/final"))
    assert view.final is not None and view.final.submission_id is not None and view.final.of == c.id
    fail_as_the_evaluator(grading.db, view.final.submission_id, how="checkpoint")
    again = ExperimentAnswer.model_validate(grading.admin("POST", f"/{other.name}/final"))
    assert again.final is not None and again.final.submission_id == view.final.submission_id
    assert again.final.status == "failed" and again.test_evaluations == 1


def test_autorl_run_asks_for_the_final_again_after_an_evaluator_s_failure_and_stops_when_none_is_made(
    grading: Grader,
) -> None:
    """`autorl run`'s final step (autorl_local.final_evaluation) against the grader's admin API:
    after a final that failed for the evaluator's fault it asks again and takes the next one's
    score; when every attempt fails it stops at the grader's last and reports it."""
    from autorl.api.admin_client import AdminClient
    from autorl_local.final_evaluation import evaluate_final

    def waiting(name: str) -> list[int]:
        with grading.db.session() as session:
            experiment = experiments.get_experiment(session, name)
            return [
                s.id for s in submissions.experiment_submissions(session, experiment) if not s.status.final
            ]

    def sealed_run_after_its_agent() -> str:
        experiment = grading.register(feedback="sealed")
        baselines(grading, experiment.name)
        grading.copy(experiment, "a")
        submit(grading, experiment, "a")
        grading.end_budget(experiment)
        return experiment.name

    with (
        serve(create_app(grading.settings, reconcile=False)) as served,
        AdminClient(served.url, grading.settings.admin_token_value) as admin_api,
    ):
        name = sealed_run_after_its_agent()
        phases: list[str] = []
        notes: list[str] = []
        outcomes = iter(("evaluator", "scored"))

        def wait() -> ExperimentAnswer:
            (final_id,) = waiting(name)
            if next(outcomes) == "evaluator":
                fail_as_the_evaluator(grading.db, final_id)
            else:
                assert evaluate(final_id, grading.settings)["status"] == "scored"
            return admin_api.experiment(name)

        ended = evaluate_final(admin_api, name, wait=wait, phase=phases.append, note=notes.append)
        assert ended is not None and ended.final is not None and ended.final.status == "scored"
        assert ended.test_evaluations == 1 and len(phases) == 2
        assert len(notes) == 1 and "not for the checkpoint's own reasons" in notes[0]
        assert "the engine did not start" in notes[0]  # the failure, as the evaluator recorded it

        name = sealed_run_after_its_agent()
        phases.clear()

        def always_fails() -> ExperimentAnswer:
            (final_id,) = waiting(name)
            fail_as_the_evaluator(grading.db, final_id)
            return admin_api.experiment(name)

        ended = evaluate_final(admin_api, name, wait=always_fails, phase=phases.append, note=notes.append)
        assert len(phases) == MAX_FINAL_ATTEMPTS
        assert ended is not None and ended.final is not None and ended.final.status == "failed"
        assert ended.final.error is not None and ended.final.error.startswith(EVALUATOR_FAULT_PREFIX)
        assert ended.test_evaluations == 0


def test_a_sealed_experiment_with_nothing_scored_has_no_final_and_no_test_evaluation(grading: Grader) -> None:
    experiment = grading.register(feedback="sealed")
    view = ExperimentAnswer.model_validate(grading.admin("POST", f"/{experiment.name}/final"))
    assert view.final is None and view.test_evaluations == 0 and view.in_flight == 0


def test_registration_refuses_an_unknown_feedback_mode(grading: Grader, tmp_path: Path) -> None:
    response = grading.client.post(
        "/v1/experiments",
        json={
            "name": "exp-bad-feedback",
            "task": "gsm8k",
            "model": "builtin:tiny-qwen2",
            "timeout_s": 60,
            "workspace": str(tmp_path),
            "base_model_dir": str(grading.base_model),
            "feedback": "validation",
        },
        headers=admin_headers(grading.settings),
    )
    assert response.status_code == 422 and "feedback" in response.json()["error"]
