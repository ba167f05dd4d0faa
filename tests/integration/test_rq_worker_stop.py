"""`autorl worker` (RQ) stops within seconds of being asked, also when the reply to its unsubscribe
from its command channel reaches the listening thread before the stop does (autorl_evaluator.rq_worker,
``subscribe``): with RQ's own subscription that thread began another 60-second read, and stopping
waited it out (a worker's pod took a minute to end on a loaded machine)."""

from __future__ import annotations

import time

from redis import Redis

from autorl_evaluator.rq_worker import COMMAND_READ_S, EvaluationWorker, evaluation_queue


def test_the_worker_stops_listening_at_once_after_the_unsubscribe_reply_came_first(
    redis_url: str, fresh_queue_prefix: str
) -> None:
    redis = Redis.from_url(redis_url)
    worker = EvaluationWorker(
        [evaluation_queue(f"{fresh_queue_prefix}-eval", redis)],
        connection=redis,
        key_prefix=fresh_queue_prefix,
    )
    worker.subscribe()
    # The order a loaded machine can give, made certain: the listening thread gets the unsubscribe's
    # reply and starts its next read before the worker stops it.
    worker.pubsub.unsubscribe()
    time.sleep(0.5)
    started = time.monotonic()
    worker.unsubscribe()
    stopped_in = time.monotonic() - started
    assert not worker.pubsub_thread.is_alive()
    assert stopped_in < COMMAND_READ_S + 5, f"stopping took {stopped_in:.0f} s"
    redis.close()
