"""One dispatch interface for evaluations.

- `RQDispatcher`: RQ on Redis (cluster). The job is `autorl_evaluator.jobs.evaluate(submission_id)`,
  named by its dotted path so the core never imports the evaluator.
- `LocalDispatcher`: single machine. The submissions table is the queue: `autorl worker` processes
  poll it and claim rows atomically, so nothing is lost when any process restarts.

Either way the submission row is committed before `enqueue` is called; the grader's reconciler calls
`enqueue` again for rows the queue lost, and the job's atomic claim makes that harmless.
"""

from __future__ import annotations

from typing import Protocol

from autorl.errors import ServiceUnavailableError
from autorl.settings import Settings

EVALUATE_JOB = "autorl_evaluator.jobs.evaluate"
#: RQ kills a job that runs longer than the evaluation's own hard timeout plus this margin.
JOB_TIMEOUT_MARGIN_S = 300
#: Retries after a worker died mid-job (RQ moves abandoned jobs to the failed registry).
JOB_RETRY_MAX = 2
JOB_RETRY_INTERVALS_S = [30, 120]


class Dispatcher(Protocol):
    kind: str

    def enqueue(self, submission_id: int) -> None: ...

    def is_queued(self, submission_id: int) -> bool: ...

    def ping(self) -> None: ...


def job_id(prefix: str, submission_id: int) -> str:
    """Prefixed, so that deployments (and test runs) sharing one Redis never collide."""
    return f"{prefix}-submission-{submission_id}"


class RQDispatcher:
    kind = "rq"

    def __init__(self, redis_url: str, queue_name: str, eval_timeout_s: int, prefix: str = "autorl") -> None:
        from redis import Redis
        from rq import Queue

        self.redis = Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=30)
        self.queue = Queue(queue_name, connection=self.redis)
        self.job_timeout_s = eval_timeout_s + JOB_TIMEOUT_MARGIN_S
        self.prefix = prefix

    def enqueue(self, submission_id: int) -> None:
        from redis.exceptions import RedisError
        from rq import Retry

        try:
            self.queue.enqueue(
                EVALUATE_JOB,
                submission_id,
                job_id=job_id(self.prefix, submission_id),
                job_timeout=self.job_timeout_s,
                retry=Retry(max=JOB_RETRY_MAX, interval=JOB_RETRY_INTERVALS_S),
                result_ttl=86_400,
                failure_ttl=7 * 86_400,
                description=f"evaluate submission {submission_id}",
            )
        except RedisError as exc:
            raise ServiceUnavailableError(f"the queue (Redis) is unreachable: {exc}") from exc

    def is_queued(self, submission_id: int) -> bool:
        from redis.exceptions import RedisError
        from rq.exceptions import NoSuchJobError
        from rq.job import Job, JobStatus

        try:
            job = Job.fetch(job_id(self.prefix, submission_id), connection=self.redis)
            return job.get_status() in (
                JobStatus.QUEUED,
                JobStatus.STARTED,
                JobStatus.SCHEDULED,
                JobStatus.DEFERRED,
            )
        except NoSuchJobError:
            return False
        except RedisError as exc:
            raise ServiceUnavailableError(f"the queue (Redis) is unreachable: {exc}") from exc

    def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            self.redis.ping()
        except RedisError as exc:
            raise ServiceUnavailableError(
                f"the queue (Redis) is unreachable ({exc}); check AUTORL_REDIS_URL and that Redis is running"
            ) from exc


class LocalDispatcher:
    """The database is the queue; local workers poll it. Enqueueing is therefore a no-op."""

    kind = "local"

    def enqueue(self, submission_id: int) -> None:
        return None

    def is_queued(self, submission_id: int) -> bool:
        return True

    def ping(self) -> None:
        return None


def make_dispatcher(settings: Settings) -> Dispatcher:
    if settings.redis_url:
        return RQDispatcher(
            settings.redis_url, settings.queue_name, settings.eval_timeout_s, settings.redis_key_prefix
        )
    return LocalDispatcher()
