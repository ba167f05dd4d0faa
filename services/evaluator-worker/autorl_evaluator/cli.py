"""`autorl worker`: evaluate submissions (an RQ worker with AUTORL_REDIS_URL, else a local worker)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("worker", help="evaluate queued submissions (settings from AUTORL_* variables)")
    parser.add_argument("--burst", action="store_true", help="exit once nothing is left to evaluate")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve this worker's Prometheus metrics on this port (env AUTORL_WORKER_METRICS_PORT; "
        "default: not served)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get("AUTORL_WORKER_METRICS_HOST", "127.0.0.1"),
        help="address the metrics port listens on (env AUTORL_WORKER_METRICS_HOST; default 127.0.0.1)",
    )
    parser.set_defaults(func=run)


def metrics_port(flag: int | None) -> int | None:
    """The metrics port from --metrics-port, else AUTORL_WORKER_METRICS_PORT; None: not served."""
    from autorl.cli import UsageError

    if flag is not None:
        if not 0 < flag < 65536:
            raise UsageError(f"--metrics-port {flag} is not a port number (1-65535)")
        return flag
    value = os.environ.get("AUTORL_WORKER_METRICS_PORT", "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise UsageError(
            f"AUTORL_WORKER_METRICS_PORT={value!r} is not a port number (1-65535); "
            "unset it to serve no metrics"
        )
    return int(value)


def metrics_bind_failure(host: str, port: int, exc: OSError) -> str:
    """Why the metrics port could not be served, naming the flag that is wrong and its fix: a host
    that is no address of this machine (or no address at all), else a port in use or forbidden."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"--metrics-host {host!r} is not an address of this machine ({exc.strerror or exc}); "
            "pick a valid --metrics-host, such as 127.0.0.1 (this machine only) or 0.0.0.0 (all)"
        )
    return f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); pick a free --metrics-port"


def run(args: argparse.Namespace) -> int:
    from autorl.cli import UsageError
    from autorl.store import Database, migrate
    from autorl.untrusted_text import log_printable_lines
    from autorl_evaluator.eval_device import check_device
    from autorl_evaluator.metrics import WorkerMetrics
    from autorl_evaluator.settings import WorkerSettings

    port = metrics_port(args.metrics_port)
    log_printable_lines(logging.INFO)
    settings = WorkerSettings()
    settings.require_store_credentials()
    # Its form only: the worker imports no torch; each evaluation counts the GPUs where it runs.
    check_device(settings.eval_device, count_gpus=False)
    db = Database(settings.database_url)
    db.wait_until_ready()
    migrate(db)
    metrics = WorkerMetrics()
    if port is not None:
        try:
            metrics.serve(args.metrics_host, port)
        except OSError as exc:
            raise UsageError(metrics_bind_failure(args.metrics_host, port, exc)) from exc
    from autorl_evaluator.presence import Presence

    if not settings.redis_url:
        from autorl_evaluator.local_worker import LocalWorker

        with Presence(db, settings):
            return LocalWorker(settings, metrics=metrics).run(burst=args.burst)

    from redis import Redis

    from autorl.queue import make_dispatcher
    from autorl_evaluator.rq_worker import EvaluationWorker, WarmEvaluationWorker, evaluation_queue

    redis = Redis.from_url(settings.redis_url)
    dispatcher = make_dispatcher(settings)
    dispatcher.ping()  # an unreachable Redis is named, with the fix, before RQ's worker connects to it
    queues = [evaluation_queue(settings.queue_name, redis)]
    worker: EvaluationWorker | WarmEvaluationWorker
    if settings.eval_warm_worker:
        worker = WarmEvaluationWorker(
            queues,
            connection=redis,
            key_prefix=settings.redis_key_prefix,
            db=db,
            own_timeout_s=settings.eval_timeout_s,
            dispatcher=dispatcher,
            metrics=metrics,
        )
    else:
        worker = EvaluationWorker(
            queues,
            connection=redis,
            key_prefix=settings.redis_key_prefix,
            dispatcher=dispatcher,
            db=db,
            metrics=metrics,
        )
    worker.feed()  # what waited in the database while no worker ran
    # RQ shuts down in two stages on its own: the first SIGTERM finishes the job, a second kills it
    # (the warm worker's child goes with the worker either way).
    with Presence(db, settings):
        worker.work(burst=args.burst, with_scheduler=True)
    return 0
