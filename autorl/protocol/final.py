"""The choice of an experiment's final and its one result on the test split (docs/PROTOCOL.md),
from the store: in test mode its best submission; in sealed mode its final evaluation (or, before
that exists, the submission it will take). One :class:`~autorl.protocol.result.FinalResult`, which
the grader's answer carries and results.csv's columns render (:func:`result_columns`), from the
store or read back from the grader's answer (:func:`answer_results`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from autorl.api.answers import ExperimentAnswer
from autorl.protocol.feedback import Feedback, Split
from autorl.protocol.result import Comparison, FinalResult, Selection
from autorl.protocol.statistics import Evaluated, comparison_of, interval_of
from autorl.provenance.lineage import experiment_lineage
from autorl.store import Experiment, Submission, SubmissionStatus, sealed_final, submissions


def uncertainty_view(submission: Submission, baseline: Evaluated | None) -> dict[str, Any]:
    """The score's 95 % interval and its comparison with the baseline on the same problems (the
    baseline itself is the reference of every comparison: it has none)."""
    if submission.status != SubmissionStatus.SCORED:
        return {"interval": None, "comparison": None}
    own = Evaluated.of(submission)
    interval = interval_of(own)
    comparison = None if submission.is_baseline else comparison_of(own, baseline)
    return {
        "interval": list(interval) if interval is not None else None,
        "comparison": Comparison.of(comparison) if comparison is not None else None,
    }


def scored_baseline(session: Session, experiment: Experiment, split: Split) -> Evaluated | None:
    row = submissions.baseline_submission(session, experiment, split)
    return Evaluated.of(row) if row is not None and row.status == SubmissionStatus.SCORED else None


def final_result(session: Session, experiment: Experiment) -> FinalResult | None:
    """The result on the test split (None while there is none), compared with the baseline on the
    test split."""
    baseline = scored_baseline(session, experiment, Split.TEST)
    if experiment.feedback != Feedback.SEALED:
        best = submissions.best_submission(session, experiment)
        if best is None:
            return None
        return _result(best, best.id, "best_on_test", baseline)
    final = sealed_final.final_submission(session, experiment)
    if final is None:
        chosen, selection = sealed_final.final_choice(session, experiment)
        if chosen is None:
            return None
        return FinalResult(submission_id=None, of=chosen.id, selection=selection, status=None, score=None)
    selection = "nominated" if experiment.nominated_submission_id is not None else "best_on_validation"
    return _result(final, final.final_of, selection, baseline)


def _result(
    evaluation: Submission, of: int | None, selection: Selection, baseline: Evaluated | None
) -> FinalResult:
    return FinalResult(
        submission_id=evaluation.id,
        of=of,
        selection=selection,
        status=evaluation.status.value,
        score=evaluation.score,
        error=evaluation.error,
        **uncertainty_view(evaluation, baseline),
    )


#: results.csv's last columns: what the agent may have brought in (autorl.provenance).
PROVENANCE_COLUMNS = ("test_overlap", "twin_score", "twin_p_value", "lineage")


def results_columns(session: Session, experiment: Experiment) -> dict[str, Any]:
    """results.csv's columns after ``workspace`` for this experiment, from the store."""
    final = final_result(session, experiment)
    agent_rows = [
        row for row in submissions.experiment_submissions(session, experiment) if row.number is not None
    ]
    provenance = {
        "test_overlap": experiment.test_overlap,
        "twin_score": experiment.twin_score,
        "twin_p_value": experiment.twin_p_value,
        "lineage": experiment_lineage(agent_rows, final.of if final is not None else None),
    }
    return result_columns(
        final, experiment.feedback, sealed_final.test_evaluations(session, experiment), provenance
    )


def result_columns(
    final: FinalResult | None,
    feedback: Feedback,
    test_evaluations: int | None,
    provenance: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """results.csv's columns after ``workspace`` from an experiment's final: its score, 95 %
    interval and McNemar p-value once scored, and how it was selected once it exists."""
    interval = final.final_interval if final is not None else None
    return {
        "feedback": Feedback(feedback).value,
        "final_score": final.final_score if final is not None else None,
        "final_low": interval[0] if interval else None,
        "final_high": interval[1] if interval else None,
        "final_p_value": final.final_p_value if final is not None else None,
        "selection": final.made_selection if final is not None else None,
        "test_evaluations": test_evaluations,
        **{name: (provenance or {}).get(name) for name in PROVENANCE_COLUMNS},
    }


def answer_columns(view: ExperimentAnswer | None, requested: Feedback) -> dict[str, Any]:
    """results.csv's columns after ``workspace`` from the grader's answer (None: the grader never
    answered), as :func:`results_columns` reads them from the store. The feedback mode is the one
    the grader recorded; ``requested`` only where it never answered."""
    return result_columns(
        None if view is None else view.final,
        requested if view is None else view.feedback,
        None if view is None else view.test_evaluations,
        None if view is None else view.model_dump(include=set(PROVENANCE_COLUMNS)),
    )


def answer_results(view: ExperimentAnswer | None, requested: Feedback) -> dict[str, Any]:
    """results.csv's numbers of an experiment from the grader's answer (None: the grader never
    answered): ``baseline``, ``best_score``, ``improvement``, ``submissions`` (scored) and the
    columns after ``workspace``. Every number is on the test split: a sealed experiment's best
    there is its final score (its best on validation is not a test score)."""
    columns = answer_columns(view, requested)
    baseline = None if view is None else view.baseline_score
    if columns["feedback"] == Feedback.SEALED:
        best = columns["final_score"]
        improvement = None if best is None or baseline is None else best - baseline
    else:
        best = None if view is None else view.best_score
        improvement = None if view is None else view.improvement
    scored = 0 if view is None else view.submissions
    return {
        "baseline": baseline,
        "best_score": best,
        "improvement": improvement,
        "submissions": scored,
        **columns,
    }
