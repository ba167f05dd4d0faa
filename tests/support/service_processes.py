"""Platform services as real processes (`autorl worker`, `autorl grader`), configured only through
the environment as in a deployment; each in a session of its own, so a test can kill it whole."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from autorl.process_group import descendants
from tests.support.infra import free_port, healthy
from tests.support.settings import DeploymentSettings
from tests.support.waiting import wait_for

AUTORL = str(Path(sys.executable).parent / "autorl")


def service_env(settings: DeploymentSettings) -> dict[str, str]:
    env = {
        **os.environ,
        "AUTORL_DATABASE_URL": settings.database_url,
        "AUTORL_REDIS_URL": settings.redis_url or "",
        "AUTORL_REDIS_KEY_PREFIX": settings.redis_key_prefix,
        "AUTORL_HOME": str(settings.home),
        "AUTORL_DATA_SOURCE_DIR": str(settings.data_source_dir),
        "AUTORL_EVAL_DEVICE": "cpu",
        "AUTORL_EVAL_LEASE_S": str(settings.eval_lease_s),
        "AUTORL_RECONCILE_INTERVAL_S": str(settings.reconcile_interval_s),
        "AUTORL_SUBMIT_WAIT_S": str(settings.submit_wait_s),
        "AUTORL_ADMIN_TOKEN": settings.admin_token_value,
        "AUTORL_EVAL_BACKEND": settings.eval_backend,
        "AUTORL_EVALUATOR_HEARTBEAT_S": str(settings.evaluator_heartbeat_s),
        "AUTORL_BASELINE_UNAVAILABLE_S": str(settings.baseline_unavailable_s),
        "AUTORL_EVAL_WARM_WORKER": str(settings.eval_warm_worker).lower(),
    }
    optional = {
        "AUTORL_EVAL_DIR": settings.eval_dir,
        "AUTORL_SNAPSHOT_DIR": settings.snapshot_dir,
        "AUTORL_EVAL_LIMIT": settings.eval_limit,
        "AUTORL_EVAL_MAX_NEW_TOKENS": settings.eval_max_new_tokens,
    }
    env.update({name: str(value) for name, value in optional.items() if value is not None})
    return env


def start(args: list[str], settings: DeploymentSettings, log: Path) -> subprocess.Popen[bytes]:
    """``autorl ARGS`` in a new session, its output appended to ``log``."""
    settings.home.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [AUTORL, *args],
            env=service_env(settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and everything it started, sessions of their own included (RQ's work
    horse is one): as a machine or pod dies."""
    for pid in [process.pid, *descendants(process.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def stop(process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM, then SIGKILL whatever is left."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
    kill_tree(process)


@contextlib.contextmanager
def running(args: list[str], settings: DeploymentSettings, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start(args, settings, log)
    try:
        yield process
    finally:
        stop(process)


@contextlib.contextmanager
def serving_grader(
    settings: DeploymentSettings, log: Path, *, timeout_s: float = 60
) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """`autorl grader` on a free port, once it serves, and a client for it."""
    port = free_port()
    with (
        running(["grader", "--port", str(port)], settings, log) as process,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as client,
    ):
        wait_until_serving(str(client.base_url), process, log)
        yield process, client


def wait_until_serving(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    wait_for(
        lambda: healthy(url),
        "the grader to serve",
        timeout_s,
        0.1,
        log=log,
        alive=lambda: process.poll() is None,
    )
