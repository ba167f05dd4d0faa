"""Load: N concurrent agents against a real grader process (Postgres and Redis of this run's own),
each figure beside a bare FastAPI route served the same way in the same run.

Scenarios, each for ``--duration`` seconds:

- ``bare_time``: every agent polls the bare route (``bench/bare_time_app.py``): the yardstick;
- ``time``: every agent polls ``GET /a/<token>/time`` (one authenticated read);
- ``mixed``: every agent polls ``/time`` and ``/submissions/{id}``, and one request in
  ``SUBMIT_EVERY`` is a ``POST /submit?wait=false``;
- ``waiters``: ``--waiters`` blocking ``POST /submit`` held open (no evaluator runs, so none ends)
  while the database's committed transactions per second are counted (``pg_stat_database``).

These scenarios measure the grader's throughput, so each experiment's fair share is lifted for them
(``UNLIMITED_SHARE``). ``tenants`` measures the fair share itself, at its defaults, on SQLite and on
Postgres: another tenant's ``GET /scores`` and the admin API's ``GET /v1/experiments/NAME``, each
asked one at a time, idle and then while one experiment floods its own large ``GET /scores``
(``--flood-connections`` keep-alive connections from another process), in the same run; the target
is a p99 under the flood of at most ``TARGET_P99_RATIO`` times the idle one. The machine's load
average is recorded beside it (other work on the machine shows in the figures).

Writes ``bench/results/grader_load.json``. ``--autorl`` picks the grader's install, e.g. another
checkout's ``.venv/bin/autorl`` to measure a version before a change.

    nice -n 10 .venv/bin/python bench/grader_load.py --agents 500 --duration 10
    .venv/bin/python bench/grader_load.py --scenarios tenants --duration 10 --label tenants
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
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
#: The fair share lifted, for the scenarios that measure throughput.
UNLIMITED_SHARE = {
    "AUTORL_AGENT_REQUESTS_PER_S": "1000000",
    "AUTORL_AGENT_REQUEST_BURST": "1000000",
    "AUTORL_AGENT_REQUESTS_IN_FLIGHT": "1000000",
}
#: The flooding tenant's submissions (copies of one checkpoint, each reused at once) and the length
#: of their folder names: a large ``GET /scores`` answer, as an agent can make it.
FLOOD_SUBMISSIONS = 90
FLOOD_NAME_CHARS = 200
TARGET_P99_RATIO = 3.0
#: Between two requests of the measured tenant and of the admin client: within a fair share.
POLL_PAUSE_S = 0.2

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


def latencies_summary(latencies: list[float], statuses: Counter[str]) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "latency_ms_p50": round(percentile(latencies, 0.5) * 1000, 1),
        "latency_ms_p99": round(percentile(latencies, 0.99) * 1000, 1),
        "latency_ms_max": round(max(latencies) * 1000, 1),
        "statuses": dict(sorted(statuses.items())),
    }


async def one_at_a_time(url: str, headers: dict[str, str], duration_s: float) -> dict[str, Any]:
    """One client asking ``url`` again as soon as it is answered (a tenant polling), on one keep-alive
    connection: its latencies."""
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + duration_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            async with session.get(url, headers=headers) as response:
                await response.read()
                statuses[str(response.status)] += 1
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(POLL_PAUSE_S)
    return latencies_summary(latencies, statuses)


async def observe(
    victim: str, admin: str, admin_headers: dict[str, str], duration_s: float
) -> dict[str, Any]:
    tenant, operator = await asyncio.gather(
        one_at_a_time(victim, {}, duration_s), one_at_a_time(admin, admin_headers, duration_s)
    )
    return {"other_tenant_scores": tenant, "admin_get": operator}


def flood(url: str, connections: int, duration_s: float, counts: Any) -> None:
    """In a process of its own: ``connections`` keep-alive connections asking ``url`` as fast as
    answers come, for ``duration_s``; the statuses counted into ``counts`` (a shared dict)."""

    async def main() -> Counter[str]:
        statuses: Counter[str] = Counter()
        deadline = time.monotonic() + duration_s
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        ) as session:

            async def one() -> None:
                while time.monotonic() < deadline:
                    try:
                        async with session.get(url) as response:
                            await response.read()
                            statuses[str(response.status)] += 1
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        statuses[type(exc).__name__] += 1

            await asyncio.gather(*(one() for _ in range(connections)))
        return statuses

    counts.update(asyncio.run(main()))


def large_scores(experiment_url: str, base: Path, output: Path) -> int:
    """FLOOD_SUBMISSIONS copies of the base model under long folder names, each submitted (waiting as
    the fair share says between them): the experiment's ``GET /scores`` answer grows with them.
    Returns the answer's size in bytes."""
    with httpx.Client(timeout=120) as client:
        for index in range(FLOOD_SUBMISSIONS):
            name = f"{index:03d}-" + "n" * (FLOOD_NAME_CHARS - 4)
            copy_model(base, output / name)
            while True:
                answer = client.post(
                    f"{experiment_url}/submit?wait=false", json={"model_path": f"output/{name}"}
                )
                if answer.status_code != 429:
                    break
                time.sleep(float(answer.headers["retry-after"]))
            answer.raise_for_status()
        while (scores := client.get(f"{experiment_url}/scores")).status_code == 429:
            time.sleep(float(scores.headers["retry-after"]))
        scores.raise_for_status()
        return len(scores.content)


def tenants(args: argparse.Namespace, base: Path, database: str) -> dict[str, Any]:
    """Another tenant's and the admin API's latencies idle and under one tenant's flood, on ``database``
    (``sqlite`` or ``postgres``), the fair share at its defaults."""
    run_id = new_run_id()
    admin_token = secrets.token_urlsafe(24)
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autorl-tenants-")))
        port = free_port()
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("AUTORL_AGENT_")
            and name not in ("AUTORL_DATABASE_URL", "AUTORL_REDIS_URL")
        }
        env.update(
            AUTORL_HOME=str(root / "home"),
            AUTORL_ADMIN_TOKEN=admin_token,
            AUTORL_PUBLIC_URL=f"http://127.0.0.1:{port}",
        )
        if database == "postgres":
            env["AUTORL_DATABASE_URL"] = stack.enter_context(postgres_database(run_id))
            env["AUTORL_REDIS_URL"] = stack.enter_context(private_redis(run_id, root / "redis"))
            env["AUTORL_REDIS_KEY_PREFIX"] = f"tenants-{run_id}"
        grader = [args.autorl, "grader", "--port", str(port), "--log-level", "warning"]
        url = f"http://127.0.0.1:{port}"
        stack.enter_context(served(grader, env, f"{url}/readyz", root / "grader.log"))
        flooder, other = register_experiments(url, admin_token, 2, base, root)
        answer_bytes = large_scores(flooder.url, base, root / "ws-0" / "output")
        admin_headers = {"Authorization": f"Bearer {admin_token}"}
        victim, admin = f"{other.url}/scores", f"{url}/v1/experiments/{other.name}"
        time.sleep(2.0)  # the flooder's budget refills; nothing else runs
        idle = asyncio.run(observe(victim, admin, admin_headers, args.duration))
        with multiprocessing.Manager() as manager:
            counts = manager.dict()
            flooding = multiprocessing.Process(
                target=flood,
                args=(f"{flooder.url}/scores", args.flood_connections, args.duration + 2, counts),
            )
            flooding.start()
            time.sleep(1.0)  # the flood's connections are open and its burst spent
            under_flood = asyncio.run(observe(victim, admin, admin_headers, args.duration))
            flooding.join()
            flood_statuses = dict(sorted(counts.items()))
    ratios = {
        name: round(under_flood[name]["latency_ms_p99"] / max(idle[name]["latency_ms_p99"], 0.1), 2)
        for name in idle
    }
    return {
        "database": database,
        "flood_connections": args.flood_connections,
        "flood_scores_answer_bytes": answer_bytes,
        "flood_statuses": flood_statuses,
        "idle": idle,
        "under_flood": under_flood,
        "p99_ratio": ratios,
        "target_p99_ratio": TARGET_P99_RATIO,
        "within_target": all(r <= TARGET_P99_RATIO for r in ratios.values()),
    }


def run_tenants(args: argparse.Namespace) -> dict[str, Any]:
    from autorl.models.sources import resolve_model
    from autorl.settings import HomeSettings

    base = resolve_model("builtin:tiny-qwen2", HomeSettings().models_dir)
    load_before = os.getloadavg()
    results = {database: tenants(args, base, database) for database in ("sqlite", "postgres")}
    return {
        "tenants": {
            "machine": {
                "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            },
            **results,
        }
    }


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
            **UNLIMITED_SHARE,
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
    parser.add_argument(
        "--scenarios",
        choices=("throughput", "tenants"),
        default="throughput",
        help="throughput: bare_time, time, mixed, waiters; tenants: the fair share under one tenant's flood",
    )
    parser.add_argument(
        "--flood-connections",
        type=int,
        default=60,
        help="tenants: the flooding tenant's keep-alive connections",
    )
    args = parser.parse_args()
    measured = run_tenants(args) if args.scenarios == "tenants" else run(args)
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = previous.get("runs", {})
    command = (
        f"--scenarios tenants --flood-connections {args.flood_connections}"
        if args.scenarios == "tenants"
        else f"--agents {args.agents} --waiters {args.waiters}"
    )
    runs[args.label] = {
        "command": f"nice -n 10 .venv/bin/python bench/grader_load.py {command} "
        f"--duration {args.duration:g} --label {args.label}",
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
