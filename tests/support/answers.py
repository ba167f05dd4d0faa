"""Grader answers as a client receives them, for tests of code that reads them without a grader:
every field a plausible value, the ones a test is about given."""

from __future__ import annotations

from typing import Any

from autorl.api.answers import Best, ExperimentAnswer, ProtocolScores, SubmissionAnswer


def submission_answer(submission_id: int, **fields: Any) -> SubmissionAnswer:
    score = fields.get("score")
    defaults: dict[str, Any] = {
        "submission_id": submission_id,
        "status": "scored" if score is not None else "queued",
        "score": None,
        "split": "test",
        "scores": ProtocolScores(opencompass=score, flexible=score, strict=score),
        "baseline_score": None,
        "improvement": None,
        "best": Best(submission_id=None, score=None),
        "total_submissions": submission_id,
        "model_path": f"output/ckpt-{submission_id}",
        "timestamp": "2026-01-01T00:00:00Z",
        "elapsed_seconds": None,
        "is_baseline": False,
        "reused_from": None,
        "n_samples": None,
        "eval_seconds": None,
        "attempts": 0,
        "error": None,
        "ignored_files": [],
        "created_at": 1767225600.0,
        "finished_at": None,
        "interval": None,
        "comparison": None,
    }
    return SubmissionAnswer.model_validate({**defaults, **fields})


def experiment_answer(**fields: Any) -> ExperimentAnswer:
    defaults: dict[str, Any] = {
        "name": "run",
        "task": "arith",
        "model": "builtin:tiny-qwen2",
        "agent": None,
        "driver_model": None,
        "status": "running",
        "message": None,
        "baseline_score": None,
        "baseline_status": None,
        "baseline_submission": None,
        "baseline_error": None,
        "best_score": None,
        "best_submission": None,
        "improvement": None,
        "submissions": 0,
        "total_submissions": 0,
        "failed_submissions": 0,
        "in_flight": 0,
        "max_submissions": 100,
        "timeout_s": 600,
        "start_time": None,
        "end_time": None,
        "remaining_s": None,
        "last_submit_time": None,
        "created_at": 1767225600.0,
        "finished_at": None,
        "workspace": "/workspace",
        "eval_config": {},
    }
    return ExperimentAnswer.model_validate({**defaults, **fields})
