"""Makes sure nothing is lost: requeues what a dead worker held, and feeds the queue from the
database in fair order (what Redis lost, and each experiment's next job); the fair share learns
the tokens of experiments that another replica registered."""

from __future__ import annotations

import logging
import threading

from autorl.errors import ServiceUnavailableError
from autorl.store import FailureReason, SubmissionStatus, claims, outcomes
from autorl_grader.provenance import remove_checked_copies
from autorl_grader.state import GraderState
from autorl_grader.submissions import prune_orphan_snapshots

log = logging.getLogger("autorl.grader.reconciler")


def reconcile_once(state: GraderState) -> dict[str, int]:
    """One pass. Returns counts of what it did (for logs and tests)."""
    failed = 0
    requeued: set[int] = set()
    with state.db.session() as session:
        for submission in claims.stale_submissions(session):
            if submission.attempts >= state.settings.max_eval_attempts:
                outcomes.record_failure(
                    session,
                    submission.id,
                    error=f"evaluation was interrupted {submission.attempts} times (its worker stopped); "
                    "submit again or ask an operator to check the evaluator workers",
                    reason=FailureReason.INTERRUPTED,
                )
                failed += 1
            else:
                submission.status = SubmissionStatus.QUEUED
                submission.worker = None
                submission.lease_expires_at = None
                requeued.add(submission.id)
        settled = outcomes.settle_orphaned_waiting(session)
    if requeued:
        state.dispatcher.discard_jobs(requeued)
    enqueued = state.dispatcher.dispatch(state.db)
    prune_orphan_snapshots(state)
    remove_checked_copies(state)
    if requeued or failed or enqueued or settled:
        log.info(
            "event=reconciled requeued=%d failed=%d enqueued=%d settled=%d",
            len(requeued),
            failed,
            enqueued,
            settled,
        )
    return {"requeued": len(requeued), "failed": failed, "enqueued": enqueued, "settled": settled}


class Reconciler(threading.Thread):
    def __init__(self, state: GraderState, interval_s: float) -> None:
        super().__init__(name="autorl-reconciler", daemon=True)
        self.state = state
        self.interval_s = interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.state.know_experiment_tokens()
                reconcile_once(self.state)
            except ServiceUnavailableError as exc:
                log.warning("event=reconcile_skipped reason=%s", exc)
            except Exception:
                log.exception("event=reconcile_error")

    def stop(self) -> None:
        self.stopped.set()
