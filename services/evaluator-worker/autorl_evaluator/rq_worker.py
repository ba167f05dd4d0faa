"""The RQ worker: it runs only `evaluate(submission_id)` and a closed experiment's provenance
check, `check_provenance(experiment_id)`, whatever a queue holds.

RQ trusts Redis: it unpickles payloads, imports any dotted function name, and imports and calls
callbacks named in a job's hash (also while cleaning its registries). Anything that reaches Redis
would run code here. So, by construction:

- payloads are JSON (`JSONSerializer`): nothing read from Redis is ever unpickled;
- `EvaluationJob` can resolve those two functions only, and never resolves a callback or sends a
  webhook, wherever RQ asks it to;
- `EvaluationWorker` checks every job before anything runs: `evaluate` or `check_provenance` with
  exactly one integer argument, no keyword arguments, the job id this deployment gives that
  submission or experiment, no callbacks, webhooks or dependencies. Anything else (an unreadable
  hash included) is removed and logged, never imported, never run; the worker stays up.

What a submission id means is decided by the database: `evaluate` claims the row, and a row that is
not waiting is skipped; `check_provenance` does nothing for an experiment whose check is recorded.
A warm worker runs a provenance check in its own process after stopping its warm child (the check
loads the final and the base model itself).

RQ's stop-job command (``rq.command.send_stop_job_command``, an operator's) for the job a worker runs
kills the process evaluating it, the forked work horse or the warm child, with its process group;
RQ marks the job stopped and does not retry it, and the submission fails with the reason
``stopped`` (:func:`record_stopped`). A stop for a job the worker does not run changes nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from redis import Redis
from rq import Queue, SimpleWorker, Worker
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.worker import SHUTDOWN_SIGNAL

from autorl.errors import AutoRLError
from autorl.queue import EVALUATE_JOB, PROVENANCE_JOB, Dispatcher, job_id, provenance_job_id
from autorl.store import Database, FailureReason, outcomes
from autorl_evaluator import local_worker
from autorl_evaluator.metrics import WorkerMetrics
from autorl_evaluator.warm_child import EvaluationStoppedError, WarmChild

log = logging.getLogger("autorl.evaluator.rq")


class JobRefusedError(AutoRLError):
    """A job in the queue is neither the evaluation of one submission id nor a provenance check."""


class EvaluationJob(Job):
    """A job as the worker loads it from Redis: it resolves only the evaluation function."""

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name == PROVENANCE_JOB and self.instance is None:
            return self.provenance_check()
        if self.func_name != EVALUATE_JOB or self.instance is not None:
            raise JobRefusedError(f"job {self.id!r} does not name {EVALUATE_JOB}; refused")
        return self.evaluation()

    def evaluation(self) -> Callable[[int], dict[str, Any]]:
        """What runs an evaluation job."""
        from autorl_evaluator.jobs import evaluate

        return evaluate

    def provenance_check(self) -> Callable[[int], dict[str, Any]]:
        """What runs a provenance check job."""
        from autorl_evaluator.provenance_job import check_provenance

        return check_provenance

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, *args: Any, **kwargs: Any) -> None:
        return None


def refusal(job: Job, prefix: str) -> str | None:
    """Why the worker must not run this job, or None for the evaluation of one submission or the
    provenance check of one experiment."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as exc:  # not JSON (a pickled payload, garbage): it is never unpickled
        return f"unreadable payload ({type(exc).__name__})"
    named = {EVALUATE_JOB: job_id, PROVENANCE_JOB: provenance_job_id}
    if func_name not in named or instance is not None:
        return f"function {func_name!r} is not {EVALUATE_JOB} or {PROVENANCE_JOB}"
    if kwargs:
        return "keyword arguments given"
    if len(args) != 1 or type(args[0]) is not int:
        return "arguments are not exactly one integer id"
    expected = named[func_name](prefix, args[0])
    if job.id != expected:
        return f"job id is not {expected!r}"
    # The hash fields RQ would import, call or follow after the job (private in RQ; read as data).
    if any(getattr(job, f"_{kind}_callback_name", None) for kind in ("success", "failure", "stopped")):
        return "callbacks given"
    if job.webhooks:
        return "webhooks given"
    if job.dependency_ids:
        return "dependencies given"
    return None


#: How long, at most, the thread that listens for RQ's commands (stop a job) waits in one read.
COMMAND_READ_S = 1.0
#: What the agent and the operator read on a submission whose evaluation an operator stopped.
STOPPED_ERROR = (
    "evaluation was stopped by an operator (RQ's stop-job command) before it finished; no score was "
    "recorded: submit the checkpoint again to have it evaluated"
)


def record_stopped(db: Database, submission_id: int, pid: int) -> bool:
    """Fail a submission whose evaluation job an operator stopped, where process ``pid`` (the work
    horse or warm child that was killed) held it or it still waits; never one that is final or that
    another process holds. True when it failed now."""
    from autorl_evaluator.jobs import worker_prefix

    with db.session() as session:
        failed = outcomes.record_failure(
            session,
            submission_id,
            error=STOPPED_ERROR,
            reason=FailureReason.STOPPED,
            worker_prefix=worker_prefix(pid),
        )
    log.warning("event=evaluation_stopped submission=%d pid=%d failed=%s", submission_id, pid, failed)
    return failed


class EvaluationOnly:
    """The checks of both worker classes: refuse before anything runs, then feed the queue."""

    connection: Redis
    pubsub: Any
    pubsub_thread: Any
    pubsub_channel_name: str
    #: The job RQ's stop-job command named, set by RQ before it calls ``kill_horse``.
    _stopped_job_id: str | None

    def __init__(
        self,
        queues: list[Queue],
        *,
        connection: Redis,
        key_prefix: str,
        dispatcher: Dispatcher | None = None,
        db: Database | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        super().__init__(  # type: ignore[call-arg]
            queues, connection=connection, job_class=EvaluationJob, serializer=JSONSerializer
        )
        self.key_prefix = key_prefix
        self.dispatcher = dispatcher
        self.db = db
        self.metrics = metrics
        #: The process ``kill_horse`` killed for a stop-job command (its claims are the job's).
        self.stopped_pid: int | None = None

    def subscribe(self) -> None:
        """RQ's subscription to this worker's command channel, its thread reading for at most
        :data:`COMMAND_READ_S` at a time instead of RQ's 60 s. Stopping the worker waits out the read
        in progress (redis-py's ``stop()``), and when the reply to the worker's unsubscribe reached
        the thread before the stop did (a loaded machine), the thread began another read: a worker
        asked to stop took a minute, and its pod that long to end."""
        log.info("event=commands_subscribed channel=%s", self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})  # type: ignore[attr-defined]
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=COMMAND_READ_S,
            daemon=True,
            exception_handler=self._pubsub_exception_handler,  # type: ignore[attr-defined]
        )

    def execute_job(self, job: Job, queue: Queue) -> None:
        # A stop that reached the previous job after its evaluation ended must not stop this one
        # (RQ forgets it only when a job fails; a job id comes back when a submission is re-run).
        self._stopped_job_id, self.stopped_pid = None, None
        reason = refusal(job, self.key_prefix)
        if reason is not None:
            self.discard(job.id, queue, reason)
            return
        self.feed()
        if self.metrics is None or self.db is None or job.func_name == PROVENANCE_JOB:
            super().execute_job(job, queue)  # type: ignore[misc]
            return
        with self.metrics.evaluation(self.db, job.args[0]):
            super().execute_job(job, queue)  # type: ignore[misc]

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any = None,
        exc_string: str = "",
        execution: Any = None,
    ) -> None:
        # RQ marks a job its stop-job command named as stopped here (and forgets the name).
        if self._stopped_job_id == job.id and self.db is not None and job.func_name == EVALUATE_JOB:
            record_stopped(self.db, job.args[0], self.stopped_pid or os.getpid())
        super().handle_job_failure(  # type: ignore[misc]
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string, execution=execution
        )

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        while True:
            try:
                found: tuple[Job, Queue] | None = super().dequeue_job_and_maintain_ttl(  # type: ignore[misc]
                    timeout, max_idle_time
                )
                return found
            except Exception as exc:
                # RQ names the job it could not load; without that, it is not a job's fault.
                bad_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if bad_id is None or queue is None:
                    raise
                self.discard(str(bad_id), queue, f"unreadable job ({type(exc).__name__})")

    def discard(self, bad_id: str, queue: Queue, reason: str) -> None:
        log.warning("event=job_refused job=%r queue=%s reason=%r", bad_id, queue.name, reason)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 0, bad_id)
            pipe.lrem(queue.key, 0, bad_id)
            pipe.delete(Job.key_for(bad_id))
            pipe.execute()
        # A refused job may have borrowed a real submission's job id: hand that one in again.
        self.feed()

    def feed(self) -> None:
        """A job just left the queue: its experiment may hand the next one in (fair order)."""
        if self.dispatcher is None or self.db is None:
            return
        try:
            self.dispatcher.dispatch(self.db)
        except AutoRLError as exc:
            log.warning("event=dispatch_failed reason=%s", exc)


class EvaluationWorker(EvaluationOnly, Worker):
    """`autorl worker`: each evaluation in a forked work horse, killed at the job's timeout."""

    job_class = EvaluationJob

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        if not self.horse_pid:
            # No horse yet (a stop between the job's start and the fork): RQ would signal the
            # group of process 0, which is this worker's own.
            return
        self.stopped_pid = self.horse_pid
        super().kill_horse(sig)


class InProcessEvaluationWorker(EvaluationOnly, SimpleWorker):
    """The same checks, jobs run in the worker's own process (tests run it in burst mode)."""

    job_class = EvaluationJob


class WarmEvaluationWorker(EvaluationOnly, SimpleWorker):
    """`autorl worker` with ``AUTORL_EVAL_WARM_WORKER``: the same checks, each job run in the
    worker's own process by handing its submission id to one long-lived child
    (:mod:`autorl_evaluator.warm_child`) that this process owns, so the model or engine of an
    architecture stays resident from job to job.

    The guarantees of a work horse per job hold: past the recorded hard timeout plus
    ``CHILD_MARGIN_S`` (before RQ's own job timeout, which is 300 s later) the child's whole group
    is killed and the submission failed as the local worker fails it; RQ's own timeout, if it
    fires first, or a cold shutdown stops the child as well; RQ's stop-job command for the job
    kills the child's group (``kill_horse``, from RQ's command thread) and the job ends stopped, as
    a killed horse's does; a child that dies mid-evaluation (kill -9, the out-of-memory killer)
    fails the job as a dead horse does (RQ retries it; the submission is handed out again once the
    dead child's lease expires); the next job starts a fresh child; the worker's stop takes the
    child's group down with it.
    """

    def __init__(
        self,
        queues: list[Queue],
        *,
        connection: Redis,
        key_prefix: str,
        db: Database,
        own_timeout_s: int,
        warm: WarmChild | None = None,
        dispatcher: Dispatcher | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        super().__init__(
            queues,
            connection=connection,
            key_prefix=key_prefix,
            dispatcher=dispatcher,
            db=db,
            metrics=metrics,
        )
        self.store = db
        self.own_timeout_s = own_timeout_s
        self.warm = warm or WarmChild()
        self.job_class = _job_handing_to(self.evaluate_in_child, self.check_in_process)

    def evaluate_in_child(self, submission_id: int) -> dict[str, Any]:
        job = job_id(self.key_prefix, submission_id)
        limit_s = local_worker.evaluation_limit_s(self.store, submission_id, self.own_timeout_s)
        try:
            status = self.warm.run(
                submission_id,
                limit_s + local_worker.CHILD_MARGIN_S,
                stop_requested=lambda: self._stopped_job_id == job,
            )
        except (TimeoutError, JobTimeoutException):  # the child's group is gone either way
            local_worker.record_timeout(self.store, submission_id, limit_s)
            return {"submission_id": submission_id, "status": "failed", "reason": FailureReason.TIMEOUT.value}
        except EvaluationStoppedError:
            raise  # the job fails; RQ marks it stopped and handle_job_failure records why
        except ChildProcessError as exc:
            log.warning("event=warm_worker_failed submission=%d reason=%s", submission_id, exc)
            raise
        return {"submission_id": submission_id, "status": status}

    def check_in_process(self, experiment_id: int) -> dict[str, Any]:
        """A provenance check, in this process once the warm child (and the GPU memory it holds)
        is gone; the next evaluation starts a fresh child."""
        from autorl_evaluator.provenance_job import check_provenance

        self.warm.stop()
        return check_provenance(experiment_id)

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        """RQ's stop-job command, from its command thread once it has marked the job stopped: the
        warm child evaluating it is this worker's horse."""
        pid = self.warm.interrupt(sig)
        if pid is not None:
            self.stopped_pid = pid

    def teardown(self) -> None:
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        finally:
            self.warm.stop()


def _job_handing_to(
    evaluation: Callable[[int], dict[str, Any]], check: Callable[[int], dict[str, Any]]
) -> type[EvaluationJob]:
    """The job class of one warm worker: checked as every job is, an evaluation run by
    ``evaluation``, a provenance check by ``check``."""

    class WarmEvaluationJob(EvaluationJob):
        def evaluation(self) -> Callable[[int], dict[str, Any]]:
            return evaluation

        def provenance_check(self) -> Callable[[int], dict[str, Any]]:
            return check

    return WarmEvaluationJob


def evaluation_queue(name: str, connection: Redis) -> Queue:
    """The queue as workers read it: JSON payloads, loaded as `EvaluationJob`s."""
    return Queue(name, connection=connection, job_class=EvaluationJob, serializer=JSONSerializer)
