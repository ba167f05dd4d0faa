"""Evaluators that report themselves alive: their presence, the queue and backends each serves."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from autorl.store.models import Evaluator, utcnow


def report_evaluator(session: Session, *, name: str, queue: str, backends: Sequence[str]) -> None:
    """An evaluator says it is alive and takes work from ``queue`` for ``backends``."""
    now = utcnow()
    row = session.get(Evaluator, name)
    if row is None:
        session.add(Evaluator(name=name, queue=queue, backends=list(backends), started_at=now, last_seen=now))
    else:
        row.queue, row.backends, row.last_seen = queue, list(backends), now


def forget_evaluator(session: Session, name: str) -> None:
    """An evaluator stops: it takes no more work."""
    row = session.get(Evaluator, name)
    if row is not None:
        session.delete(row)


def live_evaluators(session: Session, *, queue: str, backend: str, alive_s: float) -> int:
    """Evaluators that reported within ``alive_s`` seconds, take work from ``queue`` and run ``backend``."""
    since = utcnow() - timedelta(seconds=alive_s)
    rows = session.scalars(select(Evaluator).where(Evaluator.queue == queue, Evaluator.last_seen >= since))
    return sum(1 for row in rows if backend in (row.backends or []))
