"""The experiment's one result on the test split is one frozen value: results.csv's columns and the
Experiment's status render the same numbers from it, and the row's feedback mode is the one the
grader recorded, whatever the command line asked for."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autorl.crd import structural_schema
from autorl.experiment import ExperimentResourceStatus, ExperimentSpec
from autorl.protocol.feedback import FEEDBACK_MODES, Feedback, Split
from autorl.protocol.final import answer_results, result_columns
from autorl.protocol.result import FinalResult
from autorl_controller.operator.lifecycle import final_status, result_text
from tests.support.answers import experiment_answer

SCORED = FinalResult(
    submission_id=7,
    of=3,
    selection="nominated",
    status="scored",
    score=41.5,
    interval=[38.5, 44.5],
    comparison={
        "difference": 2.0,
        "interval": [0.5, 3.5],
        "p_value": 0.01,
        "discordant": [30, 4],
        "distinguishable": True,
    },
)


def test_the_result_is_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        SCORED.score = 99.0  # type: ignore[misc]


def test_the_results_row_reads_the_feedback_mode_the_grader_recorded() -> None:
    view = experiment_answer(
        feedback="sealed", final=SCORED, baseline_score=39.5, best_score=50.0, improvement=10.5, submissions=3
    )
    numbers = answer_results(view, Feedback.TEST)
    assert numbers["feedback"] == "sealed"
    # On the test split: a sealed run's best there is its final, not its best on validation.
    assert (numbers["best_score"], numbers["improvement"]) == (41.5, 2.0)
    assert answer_results(None, Feedback.SEALED)["feedback"] == "sealed"  # the grader never answered


@pytest.mark.parametrize(
    "final",
    [
        SCORED,
        SCORED.model_copy(update={"status": "failed", "score": None, "interval": None, "comparison": None}),
        FinalResult(submission_id=None, of=3, selection="best_on_validation", status=None, score=None),
        None,
    ],
)
def test_the_results_row_and_the_status_render_the_same_result(final: FinalResult | None) -> None:
    view = experiment_answer(feedback="sealed", final=final, test_evaluations=1)
    row = result_columns(final, view.feedback, view.test_evaluations)
    status = final_status(view)
    assert (row["feedback"], row["final_score"], row["final_low"], row["final_high"], row["selection"]) == (
        status.feedback,
        status.finalScore,
        status.finalLow,
        status.finalHigh,
        status.finalSelection,
    )
    assert row["final_p_value"] == (0.01 if final is SCORED else None)
    if final is SCORED:
        assert result_text(view) == "41.50 [38.50, 44.50] on test"


def test_every_surface_offers_the_same_feedback_modes() -> None:
    assert FEEDBACK_MODES == ("test", "sealed")
    assert Feedback.SEALED.scored_split == Split.VALIDATION and Feedback.TEST.scored_split == Split.TEST
    spec = structural_schema(ExperimentSpec)["properties"]["evaluation"]["properties"]["feedback"]
    status = structural_schema(ExperimentResourceStatus)["properties"]["feedback"]
    assert spec["enum"] == status["enum"] == list(FEEDBACK_MODES)
    with pytest.raises(ValidationError, match="'test' or 'sealed'"):
        ExperimentResourceStatus(feedback="hidden")  # type: ignore[arg-type]
