"""The single-machine worker: the submissions table is the queue.

It claims nothing itself; it finds the next claimable submission and runs `evaluate` in a child
process group with a hard timeout, so a hung evaluation (or anything it started) is killed whole and
the submission is failed with the reason, leaving the worker ready for the next one. With
``AUTORL_EVAL_WARM_WORKER`` the child lives on between evaluations
(:mod:`autorl_evaluator.warm_child`), keeping the model resident, and is replaced after a timeout.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

from autorl.errors import ServiceUnavailableError
from autorl.parent_death import dying_with_parent
from autorl.process_group import kill_group
from autorl.store import Database, FailureReason, claims, eval_keys, outcomes
from autorl_evaluator.gpu_memory import visible_gpu_memory
from autorl_evaluator.metrics import WorkerMetrics
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.warm_child import WarmChild

log = logging.getLogger("autorl.evaluator.local")
POLL_INTERVAL_S = 1.0
#: The child gets the evaluation's own timeout plus this margin for start-up and writing the result.
CHILD_MARGIN_S = 60.0
KILL_GRACE_S = 10.0
GPU_POLL_INTERVAL_S = 5.0


class LocalWorker:
    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None) -> None:
        self.settings = settings
        self.db = Database(settings.database_url)
        self.metrics = metrics or WorkerMetrics()
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None
        self.warm = WarmChild() if settings.eval_warm_worker else None

    def request_stop(self, *_: object) -> None:
        if self.stopping:  # second signal: stop now
            if self.child is not None:
                kill_group(self.child.pid, self.child, grace_s=KILL_GRACE_S)
            if self.warm is not None:
                self.warm.stop()
        self.stopping = True

    def run(self, *, burst: bool = False) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        log.info("event=worker_started mode=local burst=%s warm=%s", burst, self.warm is not None)
        try:
            return self._loop(burst)
        finally:
            if self.warm is not None:
                self.warm.stop()

    def _loop(self, burst: bool) -> int:
        while not self.stopping:
            try:
                with self.db.session() as session:
                    submission_id = claims.next_claimable_id(session)
            except ServiceUnavailableError as exc:
                log.warning("event=poll_failed reason=%s", exc)
                submission_id = None
            if submission_id is None:
                if burst:
                    return 0
                time.sleep(POLL_INTERVAL_S)
                continue
            self.run_one(submission_id)
        return 0

    def wait_for_gpu_share(self) -> None:
        """Hold an evaluation back while a training agent fills the GPUs it shares with us."""
        fraction = self.settings.eval_gpu_min_free_fraction
        if fraction is None:
            return
        waiting_since: float | None = None
        while not self.stopping:
            free = gpu_free_fractions()
            if not free or min(free) >= fraction:
                if waiting_since is not None:
                    log.info("event=gpu_share_free waited_s=%.0f", time.monotonic() - waiting_since)
                return
            if waiting_since is None:
                waiting_since = time.monotonic()
                shown = ",".join(f"{f:.2f}" for f in free)
                log.info("event=gpu_share_wait free=%s needed=%.2f", shown, fraction)
            time.sleep(GPU_POLL_INTERVAL_S)

    def run_one(self, submission_id: int) -> None:
        self.wait_for_gpu_share()
        if self.stopping:
            return
        with self.metrics.evaluation(self.db, submission_id):
            self.run_child(submission_id)

    def run_child(self, submission_id: int) -> None:
        limit_s = evaluation_limit_s(self.db, submission_id, self.settings.eval_timeout_s)
        timeout = limit_s + CHILD_MARGIN_S
        if self.warm is not None:
            try:
                self.warm.run(submission_id, timeout)
            except TimeoutError:
                record_timeout(self.db, submission_id, limit_s)
            except ChildProcessError as exc:
                log.warning("event=warm_worker_failed submission=%d reason=%s", submission_id, exc)
            return
        self.child = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "autorl_evaluator.jobs", str(submission_id)]),
            start_new_session=True,
        )
        try:
            self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.child.pid, self.child, grace_s=KILL_GRACE_S)
            record_timeout(self.db, submission_id, limit_s)
        finally:
            self.child = None


def evaluation_limit_s(db: Database, submission_id: int, own_timeout_s: int) -> int:
    """The recorded config's hard timeout, as the evaluation itself obeys it (not this worker's);
    the process that runs it gets :data:`CHILD_MARGIN_S` more."""
    with db.session() as session:
        return eval_keys.evaluation_timeout_s(session, submission_id, own_timeout_s)


def record_timeout(db: Database, submission_id: int, limit_s: int) -> None:
    """Fail a submission whose evaluation process was killed at its hard timeout."""
    with db.session() as session:
        outcomes.record_failure(
            session,
            submission_id,
            error=f"evaluation exceeded its hard timeout of {limit_s} s and was "
            "stopped (AUTORL_EVAL_TIMEOUT_S)",
            reason=FailureReason.TIMEOUT,
        )


def gpu_free_fractions() -> list[float]:
    """Free / total memory of each GPU this process may use; empty without NVIDIA GPUs."""
    return [gpu.free_bytes / gpu.total_bytes for gpu in visible_gpu_memory()]
