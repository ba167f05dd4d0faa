"""Load: N concurrent agents against a real grader process (Postgres and Redis of this run's own),
each figure beside a bare FastAPI route served the same way in the same run.

Scenarios, each for ``--duration`` seconds:

- ``bare_time``: every agent polls the bare route (``bench/bare_time_app.py``): the yardstick;
- ``time``: every agent polls ``GET /a/<token>/time`` (one authenticated read);
- ``mixed``: every agent polls ``/time`` and ``/submissions/{id}``, and one request in
  ``SUBMIT_EVERY`` is a ``POST /submit?wait=false``;
- ``waiters``: ``--waiters`` blocking ``POST /submit`` held open (no evaluator runs, so none ends)
  while the database's committed transactions per second are counted (``pg_stat_database``).

Writes ``bench/results/grader_load.json``. ``--autorl`` picks the grader's install, e.g. another
checkout's ``.venv/bin/autorl`` to measure a version before a change.

    nice -n 10 .venv/bin/python bench/grader_load.py --agents 500 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psycopg

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.grading import copy_model  # noqa: E402
from tests.support.infra import PG_ADMIN_DSN, free_port, new_run_id, postgres_database, private_redis  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "grader_load.json"
#: Agents per registered experiment (each experiment has its own token, workspace and submissions).
AGENTS_PER_EXPERIMENT = 50
#: In the mixed scenario, one request in this many is a submission.
SUBMIT_EVERY = 50
START_TIMEOUT_S = 60.0
#: Seconds to let earlier requests drain, then to measure the database's rate without waiters.
SETTLE_S = 5.0

Request = tuple[str, str, dict[str, Any] | None]  # method, URL, JSON body


@dataclass
class Experiment:
    name: str
    url: str  # the capability URL, http://HOST:PORT/a/<token>
    submission_id: int


@contextlib.contextmanager
def served(command: list[str], env: dict[str, str], ready_url: str, log: Path) -> Iterator[None]:
    """Start a server process, wait until ``ready_url`` answers 200, stop it afterwards."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not start; see {log}:\n{log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def drive(
    agents: int, duration_s: float, next_request: Callable[[int, int], Request]
) -> dict[str, Any]:
    """Each agent sends its next request as soon as the previous one is answered, until the time is up."""
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=60)

    async def agent(session: aiohttp.ClientSession, index: int) -> None:
        step = 0
        while time.monotonic() < deadline:
            method, url, body = next_request(index, step)
            step += 1
            started = time.perf_counter()
            try:
                async with session.request(method, url, json=body) as response:
                    await response.read()
                    outcomes[str(response.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcomes[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        await asyncio.gather(*(agent(session, i) for i in range(agents)))
        elapsed = time.monotonic() - started
    errors = {k: v for k, v in outcomes.items() if not k.startswith("2")}
    return {
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms_p50": round(percentile(latencies, 0.5) * 1000, 1),
        "latency_ms_p99": round(percentile(latencies, 0.99) * 1000, 1),
        "latency_ms_mean": round(statistics.fmean(latencies) * 1000, 1),
        "statuses": dict(sorted(outcomes.items())),
        "errors": sum(errors.values()),
    }


def transactions(database: str) -> int:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
        )
        value = row.fetchone()
    assert value is not None
    return int(value[0])


def submission_count(database_dsn: str) -> int:
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        value = conn.execute("SELECT count(*) FROM submissions WHERE NOT is_baseline").fetchone()
    assert value is not None
    return int(value[0])


async def hold_waiters(
    experiments: list[Experiment], waiters: int, window_s: float, database: str, database_dsn: str
) -> dict[str, Any]:
    """Open ``waiters`` blocking submits, wait until every one is accepted, then count the
    database's transactions per second while they all wait."""
    before = submission_count(database_dsn)
    # What the grader does alone (its reconciler, requests of earlier scenarios still draining).
    await asyncio.sleep(SETTLE_S)
    first, started = transactions(database), time.monotonic()
    await asyncio.sleep(SETTLE_S)
    idle_per_s = (transactions(database) - first) / (time.monotonic() - started)
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def waiter(index: int) -> int:
            url = experiments[index % len(experiments)].url + "/submit"
            async with session.post(url, json={"model_path": "output/ckpt"}) as response:
                await response.read()
                return response.status

        tasks = [asyncio.create_task(waiter(i)) for i in range(waiters)]
        deadline = time.monotonic() + 300
        while submission_count(database_dsn) - before < waiters:
            if time.monotonic() > deadline or any(task.done() for task in tasks):
                break
            await asyncio.sleep(0.5)
        accepted = submission_count(database_dsn) - before
        await asyncio.sleep(2.0)  # the last accepted ones reach their wait
        first, started = transactions(database), time.monotonic()
        await asyncio.sleep(window_s)
        last, elapsed = transactions(database), time.monotonic() - started
        held = sum(1 for task in tasks if not task.done())
        ended_early = Counter(str(task.result()) for task in tasks if task.done() and not task.exception())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "waiters": waiters,
        "accepted": accepted,
        "held": held,
        "ended_early": dict(ended_early),
        "window_s": round(elapsed, 1),
        "db_transactions_per_s": round((last - first) / elapsed, 1),
        "db_transactions_per_s_before_waiters": round(idle_per_s, 1),
    }


def register_experiments(
    grader_url: str, admin_token: str, count: int, base: Path, root: Path
) -> list[Experiment]:
    """Register and start ``count`` experiments, each with a checkpoint and one submission of it."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    experiments = []
    with httpx.Client(base_url=grader_url, headers=headers, timeout=120) as client:
        for index in range(count):
            workspace = root / f"ws-{index}"
            (workspace / "output").mkdir(parents=True)
            copy_model(base, workspace / "output" / "ckpt", unique=True)
            body = {
                "name": f"load-{index}",
                "task": "arith",
                "model": "builtin:tiny-qwen2",
                "timeout_s": 36000,
                "workspace": str(workspace),
                "base_model_dir": str(base),
                "max_submissions": 100000,
            }
            registered = client.post("/v1/experiments", json=body)
            registered.raise_for_status()
            client.post(f"/v1/experiments/load-{index}/start", json={}).raise_for_status()
            url = registered.json()["grading_server_url"]
            submitted = httpx.post(
                f"{url}/submit?wait=false", json={"model_path": "output/ckpt"}, timeout=120
            )
            submitted.raise_for_status()
            experiments.append(Experiment(f"load-{index}", url, submitted.json()["submission_id"]))
    return experiments


def run(args: argparse.Namespace) -> dict[str, Any]:
    from autorl.models.sources import resolve_model
    from autorl.settings import HomeSettings

    base = resolve_model("builtin:tiny-qwen2", HomeSettings().models_dir)
    run_id = new_run_id()
    admin_token = secrets.token_urlsafe(24)
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="autorl-load-") as tmp,
        postgres_database(run_id) as database_url,
        private_redis(run_id, Path(tmp) / "redis") as redis_url,
    ):
        root = Path(tmp)
        database = database_url.rsplit("/", 1)[1]
        database_dsn = f"host=127.0.0.1 port=5432 user=postgres dbname={database}"
        grader_port, bare_port = free_port(), free_port()
        env = dict(
            os.environ,
            AUTORL_HOME=str(root / "home"),
            AUTORL_DATABASE_URL=database_url,
            AUTORL_REDIS_URL=redis_url,
            AUTORL_REDIS_KEY_PREFIX=f"load-{run_id}",
            AUTORL_ADMIN_TOKEN=admin_token,
            AUTORL_PUBLIC_URL=f"http://127.0.0.1:{grader_port}",
        )
        grader = [args.autorl, "grader", "--port", str(grader_port), "--log-level", "warning"]
        bare = [sys.executable, "-m", "uvicorn", "bare_time_app:app", "--app-dir", "bench"]
        bare += ["--port", str(bare_port), "--log-level", "warning"]
        bare_url = f"http://127.0.0.1:{bare_port}/a/token/time"
        with served(bare, env, bare_url, root / "bare.log"):
            results["bare_time"] = asyncio.run(
                drive(args.agents, args.duration, lambda i, k: ("GET", bare_url, None))
            )
        ready = f"http://127.0.0.1:{grader_port}/readyz"
        with served(grader, env, ready, root / "grader.log"):
            count = max(1, -(-max(args.agents, args.waiters) // AGENTS_PER_EXPERIMENT))
            experiments = register_experiments(
                f"http://127.0.0.1:{grader_port}", admin_token, count, base, root
            )

            def time_request(index: int, step: int) -> Request:
                return ("GET", experiments[index % count].url + "/time", None)

            def mixed_request(index: int, step: int) -> Request:
                experiment = experiments[index % count]
                if (index + step) % SUBMIT_EVERY == 0:
                    return ("POST", experiment.url + "/submit?wait=false", {"model_path": "output/ckpt"})
                if step % 2:
                    return ("GET", f"{experiment.url}/submissions/{experiment.submission_id}", None)
                return ("GET", experiment.url + "/time", None)

            results["time"] = asyncio.run(drive(args.agents, args.duration, time_request))
            results["mixed"] = asyncio.run(drive(args.agents, args.duration, mixed_request))
            results["waiters"] = asyncio.run(
                hold_waiters(experiments, args.waiters, args.duration, database, database_dsn)
            )
    for name in ("time", "mixed"):
        results[name]["ratio_to_bare"] = round(
            results[name]["requests_per_s"] / results["bare_time"]["requests_per_s"], 3
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500, help="concurrent agents (connections)")
    parser.add_argument("--waiters", type=int, default=500, help="blocking /submit requests held at once")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument(
        "--autorl", default=str(Path(sys.executable).parent / "autorl"), help="the grader's install"
    )
    parser.add_argument("--label", default="after", help="name of this measurement in the results file")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    measured = run(args)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = previous.get("runs", {})
    runs[args.label] = {
        "command": f"nice -n 10 .venv/bin/python bench/grader_load.py --agents {args.agents} "
        f"--waiters {args.waiters} --duration {args.duration:g} --label {args.label}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "agents": args.agents,
        "duration_s": args.duration,
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "grader_load", "runs": runs}, indent=2) + "\n")
    print(json.dumps(runs[args.label], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
