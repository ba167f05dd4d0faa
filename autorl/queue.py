"""One dispatch interface for evaluations.

- `RQDispatcher`: RQ on Redis (cluster). The job is `autorl_evaluator.jobs.evaluate(submission_id)`,
  named by its dotted path so the core never imports the evaluator, and serialized as JSON: nothing
  in Redis is ever unpickled. The database is the queue of record; Redis holds at most
  `queue_depth_per_experiment` waiting jobs of each experiment, fed from the database in fair
  order (baselines first, at the front) and put in the fair order of the moment at every dispatch,
  so one flooding experiment cannot starve another, nor keep its next job ahead of one that comes
  after it.
- `LocalDispatcher`: single machine. The submissions table is the queue: `autorl worker` processes
  poll it in the same fair order and claim rows atomically, so nothing is lost when any process
  restarts.

Either way the submission row is committed before `dispatch` is called; the grader's reconciler and
every RQ worker call `dispatch` again, and the job's atomic claim makes a duplicate harmless.

A cluster's provenance check of a closed experiment (`autorl_evaluator.provenance_job.
check_provenance(experiment_id)`) is the one other job: `dispatch_provenance` queues it once (the
controller asks again until the store records it; the job does nothing for a recorded check).
`autorl run` makes its checks itself, so the local dispatcher queues none.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from autorl.errors import ServiceUnavailableError
from autorl.settings import PlatformSettings
from autorl.store import Database, claims, eval_keys

EVALUATE_JOB = "autorl_evaluator.jobs.evaluate"
PROVENANCE_JOB = "autorl_evaluator.provenance_job.check_provenance"
#: RQ kills a job that runs longer than the evaluation's own hard timeout plus this margin.
JOB_TIMEOUT_MARGIN_S = 300
#: Retries after a worker died mid-job (RQ moves abandoned jobs to the failed registry).
JOB_RETRY_MAX = 2
JOB_RETRY_INTERVALS_S = [30, 120]
#: How long one dispatch may hold the dispatch lock, and wait for it, in seconds.
DISPATCH_LOCK_S = 30
DISPATCH_LOCK_WAIT_S = 10
#: Attempts at putting the waiting jobs in fair order while workers take jobs; the next dispatch tries again.
REORDER_TRIES = 5


class Dispatcher(Protocol):
    kind: str

    def dispatch(self, db: Database) -> int:
        """Hand queued submissions to the evaluators in fair order; returns how many were handed."""
        ...

    def discard_jobs(self, submission_ids: set[int]) -> None:
        """Forget the queue's jobs of these submissions (their workers died, or they are final), so
        that ``dispatch`` hands each in afresh when the database says it waits."""
        ...

    def dispatch_provenance(self, experiment_id: int, timeout_s: int) -> bool:
        """Queue the provenance check of a closed experiment unless its job waits or runs; False
        where no queue takes it (the local dispatcher)."""
        ...

    def ping(self) -> None: ...


def job_id(prefix: str, submission_id: int) -> str:
    """Prefixed, so that deployments (and test runs) sharing one Redis never collide."""
    return f"{prefix}-submission-{submission_id}"


def provenance_job_id(prefix: str, experiment_id: int) -> str:
    return f"{prefix}-provenance-{experiment_id}"


def submission_of(prefix: str, job: str) -> int | None:
    """The submission id a job id of this deployment names, or None for any other id."""
    head, _, number = job.rpartition("-")
    if head != f"{prefix}-submission" or not number.isdigit():
        return None
    return int(number)


class RQDispatcher:
    kind = "rq"

    def __init__(
        self,
        redis_url: str,
        queue_name: str,
        eval_timeout_s: int,
        prefix: str = "autorl",
        depth_per_experiment: int = 1,
    ) -> None:
        from redis import Redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        self.redis = Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=30)
        self.queue = Queue(queue_name, connection=self.redis, serializer=JSONSerializer)
        #: For a submission whose recorded config holds no timeout (recorded before it was).
        self.eval_timeout_s = eval_timeout_s
        self.prefix = prefix
        self.depth_per_experiment = depth_per_experiment

    def dispatch(self, db: Database) -> int:
        from redis.exceptions import LockError, RedisError

        try:
            # One dispatcher at a time (grader requests, its reconciler, every worker): the
            # per-experiment depth holds and no submission is pushed twice by a race.
            with self.redis.lock(
                f"{self.prefix}-dispatch-lock", timeout=DISPATCH_LOCK_S, blocking_timeout=DISPATCH_LOCK_WAIT_S
            ):
                return self._dispatch_locked(db)
        except LockError:
            return 0  # another dispatcher holds the lock and does the same work
        except RedisError as exc:
            raise ServiceUnavailableError(f"the queue (Redis) is unreachable: {exc}") from exc

    def _dispatch_locked(self, db: Database) -> int:
        waiting = self.waiting_submissions()
        with db.session() as session:
            candidates = claims.claimable_in_fair_order(session, taken=sorted(self._taken_submissions()))
        claimable = {c.submission_id for c in candidates}
        stale = waiting - claimable
        if stale:  # finished, cancelled or claimed elsewhere: their jobs would only be skipped
            self.discard_jobs(stale)
        depth: Counter[int] = Counter(c.experiment_id for c in candidates if c.submission_id in waiting)
        handed = 0
        with db.session() as session:
            for candidate in candidates:
                if candidate.submission_id in waiting:
                    continue
                if not candidate.ahead and depth[candidate.experiment_id] >= self.depth_per_experiment:
                    continue
                if self._job_active(candidate.submission_id):
                    continue
                # RQ's job timeout follows the submission's recorded evaluation timeout, not this
                # process's own setting (another grader, or an older one, may have recorded it).
                timeout_s = eval_keys.evaluation_timeout_s(
                    session, candidate.submission_id, self.eval_timeout_s
                )
                self._enqueue(candidate.submission_id, at_front=candidate.ahead, timeout_s=timeout_s)
                if not candidate.ahead:
                    depth[candidate.experiment_id] += 1
                handed += 1
        self._reorder([job_id(self.prefix, c.submission_id) for c in candidates])
        return handed

    def _reorder(self, fair_order: list[str]) -> None:
        """Put the waiting evaluation jobs in ``fair_order`` (today's fair order), other jobs where
        they are. A job keeps the place it was queued at; the order it was queued in goes stale as
        soon as work starts or ends (an experiment that always has its next job waiting would be
        ahead of one that submits after it, whoever's turn it is), so the order is renewed at every
        dispatch: on every submit, every job a worker starts, every reconciliation. A worker that
        takes a job meanwhile makes the rewrite start again."""
        from redis.exceptions import WatchError
        from rq.utils import as_text

        rank = {job: place for place, job in enumerate(fair_order)}
        with self.redis.pipeline() as pipe:
            for _ in range(REORDER_TRIES):
                try:
                    pipe.watch(self.queue.key)  # type: ignore[no-untyped-call]
                    jobs = [as_text(raw) for raw in pipe.lrange(self.queue.key, 0, -1)]
                    ours = [job for job in jobs if job in rank]
                    ordered = sorted(ours, key=rank.__getitem__)
                    if ours == ordered:
                        pipe.unwatch()
                        return
                    fair = iter(ordered)
                    pipe.multi()
                    pipe.delete(self.queue.key)
                    pipe.rpush(self.queue.key, *(next(fair) if job in rank else job for job in jobs))
                    pipe.execute()
                    return
                except WatchError:
                    continue

    def waiting_submissions(self) -> set[int]:
        """Submissions whose jobs wait in the queue (not yet taken by a worker)."""
        from rq.utils import as_text

        ids = (submission_of(self.prefix, as_text(raw)) for raw in self.redis.lrange(self.queue.key, 0, -1))
        return {i for i in ids if i is not None}

    def _taken_submissions(self) -> set[int]:
        """Submissions whose jobs a worker has taken off the queue (RQ's intermediate list) or
        started."""
        from rq.utils import as_text

        jobs = [
            *(as_text(raw) for raw in self.redis.lrange(self.queue.intermediate_queue_key, 0, -1)),
            *self.queue.started_job_registry.get_job_ids(cleanup=False),  # RQ's clean-up is the workers'
        ]
        return {i for i in (submission_of(self.prefix, job) for job in jobs) if i is not None}

    def discard_jobs(self, submission_ids: set[int]) -> None:
        from redis.exceptions import RedisError
        from rq.job import Job

        # A dead worker's job stays "started" in RQ until RQ's own clean-up, hours later with
        # evaluation-length timeouts: dispatch would take it for a live one and never hand it in.
        started = self.queue.started_job_registry.key
        try:
            with self.redis.pipeline() as pipe:
                for submission_id in submission_ids:
                    job = job_id(self.prefix, submission_id)
                    pipe.lrem(self.queue.key, 0, job)
                    pipe.zrem(started, job)
                    pipe.delete(Job.key_for(job))
                pipe.execute()
        except RedisError as exc:
            raise ServiceUnavailableError(f"the queue (Redis) is unreachable: {exc}") from exc

    def dispatch_provenance(self, experiment_id: int, timeout_s: int) -> bool:
        from redis.exceptions import RedisError
        from rq import Retry

        job = provenance_job_id(self.prefix, experiment_id)
        try:
            if self._active(job):
                return True
            self.queue.enqueue(
                PROVENANCE_JOB,
                experiment_id,
                job_id=job,
                job_timeout=timeout_s + JOB_TIMEOUT_MARGIN_S,
                retry=Retry(max=JOB_RETRY_MAX, interval=JOB_RETRY_INTERVALS_S),
                result_ttl=86_400,
                failure_ttl=7 * 86_400,
                description=f"check what experiment {experiment_id}'s agent brought in",
            )
        except RedisError as exc:
            raise ServiceUnavailableError(f"the queue (Redis) is unreachable: {exc}") from exc
        return True

    def _job_active(self, submission_id: int) -> bool:
        """A job taken by a worker but not yet claimed in the database, or a retry RQ scheduled."""
        return self._active(job_id(self.prefix, submission_id))

    def _active(self, job_name: str) -> bool:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job, JobStatus

        try:
            job = Job.fetch(job_name, connection=self.redis, serializer=self.queue.serializer)
        except NoSuchJobError:
            return False
        return job.get_status() in (
            JobStatus.QUEUED,
            JobStatus.STARTED,
            JobStatus.SCHEDULED,
            JobStatus.DEFERRED,
        )

    def _enqueue(self, submission_id: int, *, at_front: bool, timeout_s: int) -> None:
        from rq import Retry

        self.queue.enqueue(
            EVALUATE_JOB,
            submission_id,
            job_id=job_id(self.prefix, submission_id),
            job_timeout=timeout_s + JOB_TIMEOUT_MARGIN_S,
            retry=Retry(max=JOB_RETRY_MAX, interval=JOB_RETRY_INTERVALS_S),
            result_ttl=86_400,
            failure_ttl=7 * 86_400,
            description=f"evaluate submission {submission_id}",
            at_front=at_front,
        )

    def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            self.redis.ping()
        except RedisError as exc:
            raise ServiceUnavailableError(
                f"the queue (Redis) is unreachable ({exc}); check AUTORL_REDIS_URL and that Redis is running"
            ) from exc


class LocalDispatcher:
    """The database is the queue; local workers poll it in fair order. Dispatching is a no-op."""

    kind = "local"

    def dispatch(self, db: Database) -> int:
        return 0

    def discard_jobs(self, submission_ids: set[int]) -> None:
        return None

    def dispatch_provenance(self, experiment_id: int, timeout_s: int) -> bool:
        return False

    def ping(self) -> None:
        return None


def make_dispatcher(settings: PlatformSettings) -> Dispatcher:
    if settings.redis_url:
        return RQDispatcher(
            settings.redis_url,
            settings.queue_name,
            settings.eval_timeout_s,
            settings.redis_key_prefix,
            settings.queue_depth_per_experiment,
        )
    return LocalDispatcher()
