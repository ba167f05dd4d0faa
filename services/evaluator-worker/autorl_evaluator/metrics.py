"""The worker's own Prometheus metrics, served on a port of its own (`autorl worker --metrics-port`).

Evaluations run in a child process (RQ's forked work horse, the local worker's subprocess), which
may be killed at its timeout; so the worker's own process measures each one around the child and
reads how it ended from the submission's row, the record the child and the timeout write. Nothing
is counted in a child, and no per-process files are needed. docs/OPERATIONS.md lists the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from autorl.errors import AutoRLError
from autorl.store import Database, Submission
from autorl.store.metric_counts import EVALUATION_DURATION_BUCKETS

log = logging.getLogger("autorl.evaluator.metrics")
METRICS_PORT_ENV = "AUTORL_WORKER_METRICS_PORT"
METRICS_HOST_ENV = "AUTORL_WORKER_METRICS_HOST"


@dataclass(frozen=True)
class RowState:
    status: str
    attempts: int
    failure_reason: str | None


def _row_state(db: Database, submission_id: int) -> RowState | None:
    try:
        with db.session() as session:
            row = session.get(Submission, submission_id)
            if row is None:
                return None
            reason = row.failure_reason.value if row.failure_reason is not None else None
            return RowState(row.status.value, row.attempts, reason)
    except AutoRLError as exc:
        log.warning("event=metrics_row_unreadable submission=%d reason=%s", submission_id, exc)
        return None


def outcome(before: RowState | None, after: RowState | None) -> str:
    """How one job ended: ``scored``, ``failed``, ``requeued`` (given back, e.g. at shutdown),
    ``unfinished`` (still running: the child was killed), ``skipped`` (it never claimed the
    submission: final, waiting, or taken by another worker) or ``unknown`` (database unreadable)."""
    if after is None:
        return "unknown"
    if before is not None and after.attempts == before.attempts:
        return "skipped"
    return {"scored": "scored", "failed": "failed", "queued": "requeued"}.get(after.status, "unfinished")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.duration = Histogram(
            "autorl_worker_evaluation_duration_seconds",
            "Wall time of each evaluation this worker ran, from its start to its record, by outcome",
            ["outcome"],
            buckets=EVALUATION_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.evaluations = Counter(
            "autorl_worker_evaluations",
            "Evaluation jobs this worker took, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "autorl_worker_evaluation_failures",
            "Evaluations this worker ran that failed, by reason class",
            ["reason"],
            registry=self.registry,
        )
        self.in_progress = Gauge(
            "autorl_worker_evaluations_in_progress",
            "Evaluations this worker is running now",
            registry=self.registry,
        )

    @contextmanager
    def evaluation(self, db: Database, submission_id: int) -> Iterator[None]:
        """Measure one evaluation job run inside the block."""
        before = _row_state(db, submission_id)
        started = time.monotonic()
        self.in_progress.inc()
        try:
            yield
        finally:
            self.in_progress.dec()
            after = _row_state(db, submission_id)
            ended = outcome(before, after)
            self.evaluations.labels(outcome=ended).inc()
            if ended != "skipped":
                self.duration.labels(outcome=ended).observe(time.monotonic() - started)
            if ended == "failed" and after is not None:
                self.failures.labels(reason=after.failure_reason or "unknown").inc()

    def serve(self, host: str, port: int) -> int:
        """Expose the metrics over HTTP in a background thread; returns the port bound."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        bound = int(server.server_address[1])
        log.info("event=metrics_serving host=%s port=%d", host, bound)
        return bound
