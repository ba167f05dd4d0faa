"""A results.csv row for tests: a completed run of the example agent on the tiny model, with the
fields a test names changed."""

from __future__ import annotations

from autorl.runs.results import ResultRow


def result_row(run_id: str, **overrides: object) -> ResultRow:
    values: dict[str, object] = {
        "run_id": run_id,
        "timestamp": "2026-11-29T23:00:00+00:00",
        "task": "arith",
        "agent": "example_grpo",
        "driver_model": None,
        "base_model": "builtin:tiny-qwen2",
        "baseline": 0.0,
        "best_score": 12.5,
        "improvement": 12.5,
        "submissions": 3,
        "duration_s": 301.5,
        "success": True,
        "status": "completed",
        "workspace": "/tmp/ws",
    }
    values.update(overrides)
    return ResultRow(**values)  # type: ignore[arg-type]


def unscored_row(run_id: str, status: str, **overrides: object) -> ResultRow:
    """A row of a run that ended (``status``) with no score: no baseline, best or improvement, and
    no submission."""
    values: dict[str, object] = {
        "baseline": None,
        "best_score": None,
        "improvement": None,
        "submissions": 0,
        "success": False,
        "status": status,
    }
    values.update(overrides)
    return result_row(run_id, **values)
