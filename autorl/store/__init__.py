"""Persistence: SQLAlchemy 2 models, the functions that read and write them (a module per thing
stored, each function taking a session), Alembic migrations.

The database is the truth; workspace mirrors (`run_meta.json`, `scores.json`) are copies.
"""

from autorl.store.db import Database, migrate
from autorl.store.models import (
    BaselineCache,
    EvaluationCache,
    Experiment,
    FailureReason,
    Feedback,
    Split,
    Submission,
    SubmissionStatus,
)

__all__ = [
    "BaselineCache",
    "Database",
    "EvaluationCache",
    "Experiment",
    "FailureReason",
    "Feedback",
    "Split",
    "Submission",
    "SubmissionStatus",
    "migrate",
]
