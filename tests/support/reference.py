"""The reference AutoRL-Bench's shapes that tests compare the platform's answers with."""

from __future__ import annotations

#: The reference's scores.json entry, which its /submit answer repeats whole as ``best``.
REFERENCE_BEST_FIELDS = (
    "submission_id",
    "score",
    "timestamp",
    "model_path",
    "baseline_score",
    "improvement",
    "elapsed_seconds",
)
