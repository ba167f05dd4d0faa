"""`autorl worker`: evaluate submissions (an RQ worker with AUTORL_REDIS_URL, else a local worker)."""

from __future__ import annotations

import argparse
import logging


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("worker", help="evaluate queued submissions (settings from AUTORL_* variables)")
    parser.add_argument("--burst", action="store_true", help="exit once nothing is left to evaluate")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autorl.settings import load_settings
    from autorl.store import Database, migrate

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = load_settings()
    settings.require_store_credentials()
    assert settings.database_url is not None
    db = Database(settings.database_url)
    db.wait_until_ready()
    migrate(db)
    if not settings.redis_url:
        from autorl_evaluator.local_worker import LocalWorker

        return LocalWorker(settings).run(burst=args.burst)

    from redis import Redis

    from autorl.queue import make_dispatcher
    from autorl_evaluator.rq_worker import EvaluationWorker, evaluation_queue

    redis = Redis.from_url(settings.redis_url)
    dispatcher = make_dispatcher(settings)
    worker = EvaluationWorker(
        [evaluation_queue(settings.queue_name, redis)],
        connection=redis,
        key_prefix=settings.redis_key_prefix,
        dispatcher=dispatcher,
        db=db,
    )
    worker.feed()  # what waited in the database while no worker ran
    # RQ shuts down in two stages on its own: the first SIGTERM finishes the job, a second kills it.
    worker.work(burst=args.burst, with_scheduler=True)
    return 0
