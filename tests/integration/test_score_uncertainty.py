"""Every score carries its 95 % interval and its paired comparison with the baseline, end to end:
the real job function (``hf`` backend, tiny model) stores each evaluation's per-problem
correctness, and the grader's ``/submit``, ``/submissions/N`` and ``/scores`` answers carry
``interval`` and ``comparison``; the baseline's own answer has an interval and no comparison."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.api.answers import SubmissionAnswer
from autorl.protocol.statistics import compare, wilson_interval
from autorl.store import submissions
from autorl_evaluator.jobs import evaluate, predictions_path
from tests.support.grading import (
    Grader,
    RegisteredExperiment,
    admin_headers,
    agent_get,
    evaluating_settings,
    number_of,
    row_id,
    submit_accepted,
)
from tests.support.runs import add_submission, create_experiment, scores
from tests.support.settings import DeploymentSettings

LIMIT = 3
MAX_NEW_TOKENS = 6


@pytest.fixture
def settings(make_settings: Callable[..., DeploymentSettings], pg_url: str) -> DeploymentSettings:
    return evaluating_settings(make_settings, pg_url, limit=LIMIT, max_new_tokens=MAX_NEW_TOKENS)


def test_an_evaluated_submission_answers_with_its_interval_and_its_comparison(
    grading: Grader, experiment: RegisteredExperiment
) -> None:
    asked = grading.client.post(
        f"/v1/experiments/{experiment.name}/baseline", headers=admin_headers(grading.settings)
    )
    baseline_id = asked.json()["submission_id"]
    assert evaluate(baseline_id, grading.settings)["status"] == "scored"
    grading.copy(experiment, "a")
    number = submit_accepted(grading.client, experiment, "output/a")["submission_id"]
    submission_id = row_id(grading.db, experiment, number)
    assert evaluate(submission_id, grading.settings)["status"] == "scored"

    with grading.db.session() as session:
        row = submissions.get_submission(session, submission_id)
        baseline_row = submissions.get_submission(session, baseline_id)
        correctness, baseline_correctness = row.correctness, baseline_row.correctness
        assert row.problems_digest == baseline_row.problems_digest and row.problems_digest
    assert correctness is not None and baseline_correctness is not None
    assert len(correctness) == LIMIT and set(correctness) <= {"0", "1"}
    # The string is what the score counts.
    answer = agent_get(grading.client, experiment, f"/submissions/{number}")
    assert answer["score"] == pytest.approx(100 * correctness.count("1") / LIMIT)
    assert answer["interval"] == pytest.approx(list(wilson_interval(correctness.count("1"), LIMIT)))
    expected = compare(correctness, baseline_correctness)
    assert answer["comparison"] == expected.as_dict()  # JSON numbers round-trip exactly
    assert answer["comparison"]["distinguishable"] is False  # three problems tell nothing apart
    SubmissionAnswer.model_validate(answer)

    listed = {s["submission_id"]: s for s in agent_get(grading.client, experiment, "/scores")["submissions"]}
    assert listed[number]["comparison"] == answer["comparison"]
    # The baseline (the agent's 0): an interval, and no comparison (it is what every score is
    # compared with).
    base = agent_get(grading.client, experiment, "/submissions/0")
    assert base["interval"] == pytest.approx(list(wilson_interval(baseline_correctness.count("1"), LIMIT)))
    assert base["comparison"] is None

    # /submit of the base model's own files answers at once, reusing the baseline's evaluation:
    # the same problems, right and wrong alike, so no discordant pair and no difference.
    grading.copy(experiment, "copy", unique=False)
    reused = grading.client.post(f"{experiment.url_path}/submit", json={"model_path": "output/copy"})
    assert reused.status_code == 200, reused.text
    body = reused.json()
    assert body["interval"] == pytest.approx(list(wilson_interval(baseline_correctness.count("1"), LIMIT)))
    assert body["comparison"]["discordant"] == [0, 0] and body["comparison"]["difference"] == 0
    assert body["comparison"]["p_value"] == 1.0 and body["comparison"]["distinguishable"] is False
    assert predictions_path(grading.settings, submission_id).is_file()


def test_the_baseline_has_an_interval_and_no_comparison_and_a_clear_gain_is_distinguishable(
    grading: Grader, tmp_path: Path
) -> None:
    run = create_experiment(grading.db, tmp_path / "workspace", started_minutes_ago=5)
    baseline = "1" * 60 + "0" * 140
    better = "1" * 60 + "1" * 40 + "0" * 100  # 40 gains, no losses: 30 % -> 50 %
    noisy = "0" * 3 + "1" * 57 + "1" * 4 + "0" * 136  # 4 gains, 3 losses: 30 % -> 30.5 %
    base_id = add_submission(grading.db, run.name, scores=scores(30.0), baseline=True, correctness=baseline)
    better_id = add_submission(grading.db, run.name, scores=scores(50.0), minutes=1, correctness=better)
    noisy_id = add_submission(grading.db, run.name, scores=scores(30.5), minutes=2, correctness=noisy)
    # Scored before per-problem correctness was kept:
    old_id = add_submission(grading.db, run.name, scores=scores(40.0), minutes=3)
    failed_id = add_submission(grading.db, run.name, error="failed", minutes=4)
    # As the agent numbers them (the baseline is its 0).
    base_id, better_id, noisy_id, old_id, failed_id = (
        number_of(grading.db, i) for i in (base_id, better_id, noisy_id, old_id, failed_id)
    )
    experiment = run.as_agent()
    listed = {s["submission_id"]: s for s in agent_get(grading.client, experiment, "/scores")["submissions"]}

    base = agent_get(grading.client, experiment, f"/submissions/{base_id}")
    assert base["interval"] == pytest.approx(list(wilson_interval(60, 200))) and base["comparison"] is None
    clear = agent_get(grading.client, experiment, f"/submissions/{better_id}")["comparison"]
    assert clear["difference"] == pytest.approx(20.0) and clear["discordant"] == [40, 0]
    assert clear["distinguishable"] is True and clear["p_value"] < 1e-9 and clear["interval"][0] > 0
    unclear = agent_get(grading.client, experiment, f"/submissions/{noisy_id}")["comparison"]
    assert unclear["discordant"] == [4, 3] and unclear["distinguishable"] is False
    # A score recorded without per-problem correctness still has an interval (from its score and
    # its number of problems) but nothing to pair with; a failure has neither.
    assert listed[old_id]["interval"] == pytest.approx(list(wilson_interval(4, 10)))
    assert listed[old_id]["comparison"] is None
    assert (listed[failed_id]["interval"], listed[failed_id]["comparison"]) == (None, None)
