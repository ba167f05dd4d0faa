"""Soak: ``autorl run`` on the embedded default (SQLite, local worker) with an agent that submits a
new checkpoint every few seconds, while /proc of every process of the run is sampled.

Writes ``bench/results/soak.json``: per long-lived process its resident memory (RSS) and open file
descriptors at the start and end of the agent's phase and the RSS trend, and whether every
submission was scored exactly once (one evaluation attempt, a score, each id once).

    nice -n 10 .venv/bin/python bench/soak.py --duration 1200      # the published figure
    .venv/bin/python bench/soak.py --duration 60 --out /tmp/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT = REPO_ROOT / "bench" / "soak_agent.py"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "soak.json"
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
#: The first part of the agent's phase is warm-up (imports, first evaluation, caches filling);
#: "start" figures are taken once it is over.
WARMUP_FRACTION = 0.2
EVAL_SETTINGS = {"AUTORL_EVAL_LIMIT": "8", "AUTORL_EVAL_MAX_NEW_TOKENS": "16"}


@dataclass
class ProcessTrace:
    """One process of the run (pid + start time, so a reused pid is another process)."""

    pid: int
    command: str
    #: (t, rss_kb, fds, database connections): the fds exclude the database's own files, which
    #: belong to the connection pool (bounded by its size, not a leak), counted apart.
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)


def _children(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.extend(kids)
        frontier.extend(kids)
    return tree


def _descriptors(pid: int, database: Path) -> tuple[int, int]:
    """(open fds other than the database's files, connections to the database) of a process.

    A pooled SQLite connection holds the database file and its write-ahead log open for as long
    as the pool keeps it: it is counted as a connection, once, by the database file itself."""
    other = connections = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed between the listing and the look
            continue
        if target == str(database):
            connections += 1
        elif not target.startswith(f"{database}-"):  # -wal, -shm, -journal
            other += 1
    return other, connections


def _sample(pid: int, database: Path) -> tuple[str, str, int, int, int] | None:
    """(identity, command, rss_kb, open fds, database connections) of a live process, or None
    when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        fds, connections = _descriptors(pid, database)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError, ValueError):
        return None
    start_ticks = stat.rpartition(")")[2].split()[19]
    command = " ".join(part.decode(errors="replace") for part in argv if part)[:160]
    return f"{pid}:{start_ticks}", command, rss_pages * PAGE_KB, fds, connections


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_soak(duration_s: float, interval_s: float, sample_s: float, workdir: Path) -> dict[str, Any]:
    home, workspace = workdir / "home", workdir / "workspace"
    # The soak measures the platform, not evaluation speed: a few short problems per evaluation.
    env = dict(os.environ, AUTORL_HOME=str(home), **EVAL_SETTINGS)
    if "AUTORL_CACHE_DIR" not in os.environ:
        env["AUTORL_CACHE_DIR"] = str(Path.home() / ".autorl" / "cache")  # the tiny model, built once
    autorl = Path(sys.executable).parent / "autorl"
    command = [
        str(autorl), "run", "-t", "arith", "-m", "builtin:tiny-qwen2", "-a", str(AGENT),
        "--timeout", str(int(duration_s)), "--port", str(_free_port()), "--workspace", str(workspace),
        "--max-submissions", "100000", "--env", f"SOAK_INTERVAL_S={interval_s:g}",
    ]  # fmt: skip
    log_path = workdir / "autorl-run.log"
    traces: dict[str, ProcessTrace] = {}
    agent_seen: list[float] = []
    started = time.monotonic()
    with log_path.open("wb") as log:
        run = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            _sample_until_exit(run, traces, agent_seen, started, sample_s, home / "autorl.db")
        finally:
            if run.poll() is None:  # interrupted: Ctrl-C stops everything the run started
                run.send_signal(signal.SIGINT)
                run.wait(timeout=120)
    wall_s = time.monotonic() - started
    if not agent_seen:
        raise RuntimeError(f"the agent never started; see {log_path}:\n{log_path.read_text()[-3000:]}")
    phase = (min(agent_seen), max(agent_seen))
    submissions = _submission_check(workspace, home / "autorl.db")
    submissions["every_one_scored_once"] = every_submission_scored_once(submissions)
    return {
        "exit_code": run.returncode,
        "wall_s": round(wall_s, 1),
        "agent_phase_s": round(phase[1] - phase[0], 1),
        "processes": _process_summaries(traces, phase),
        "submissions": submissions,
    }


def _sample_until_exit(
    run: subprocess.Popen[bytes],
    traces: dict[str, ProcessTrace],
    agent_seen: list[float],
    started: float,
    sample_s: float,
    database: Path,
) -> None:
    while run.poll() is None:
        now = time.monotonic() - started
        for pid in _children(run.pid):
            sample = _sample(pid, database)
            if sample is None:
                continue
            identity, cmd, rss_kb, fds, connections = sample
            trace = traces.setdefault(identity, ProcessTrace(pid, cmd))
            trace.samples.append((now, rss_kb, fds, connections))
            if _is_agent(cmd):
                agent_seen.append(now)
        time.sleep(sample_s)


def _is_agent(command: str) -> bool:
    """The agent's interpreter itself (not ``autorl run``, whose arguments name it too)."""
    argv = command.split()
    return len(argv) > 1 and Path(argv[0]).name.startswith("python") and argv[1].endswith(AGENT.name)


def _slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def _process_summaries(traces: dict[str, ProcessTrace], phase: tuple[float, float]) -> list[dict[str, Any]]:
    """Processes alive through the agent's phase (the run, grader, worker, agent), not the
    short-lived ones (an evaluation subprocess, a checkpoint copy)."""
    begin, end = phase
    steady_from = begin + WARMUP_FRACTION * (end - begin)
    summaries = []
    for trace in traces.values():
        inside = [s for s in trace.samples if steady_from <= s[0] <= end]
        if not inside or trace.samples[0][0] > steady_from or trace.samples[-1][0] < end - 1e-6:
            continue
        first, last = inside[0], inside[-1]
        summaries.append(
            {
                "pid": trace.pid,
                "command": trace.command,
                "samples": len(inside),
                "rss_mb_start": round(first[1] / 1024, 1),
                "rss_mb_end": round(last[1] / 1024, 1),
                "rss_mb_max": round(max(s[1] for s in inside) / 1024, 1),
                "rss_mb_per_hour": round(_slope_per_hour([(s[0], s[1] / 1024) for s in inside]), 2),
                "fds_start": first[2],
                "fds_end": last[2],
                "fds_max": max(s[2] for s in inside),
                # A leaked descriptor stays; one of a request in flight comes and goes.
                "fds_min_last_third": min(s[2] for s in inside[len(inside) * 2 // 3 :]),
                "database_connections_max": max(s[3] for s in trace.samples),
            }
        )
    return summaries


def _submission_check(workspace: Path, database: Path) -> dict[str, Any]:
    """What the agent was told against what the store holds: each id once, scored, one attempt.
    The agent is told its own numbers (``submissions.number``), by which the store is read.

    Every stored submission must be scored once, also one the agent never heard back about: the
    one it was waiting for when its budget ended (at most one, as it submits one at a time)."""
    answers_file = workspace / "output" / "soak_submissions.jsonl"
    lines = answers_file.read_text().splitlines() if answers_file.exists() else []
    answers = [json.loads(line) for line in lines]
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            "SELECT number, status, attempts, score, reused_from FROM submissions"
            " WHERE is_baseline = 0 AND final_of IS NULL"
        ).fetchall()
    stored = {row[0]: row for row in rows}
    ids = [answer["submission_id"] for answer in answers]
    scored = {i for i, row in stored.items() if row[1] == "scored" and row[2] == 1}
    return {
        "submitted": len(answers),
        "stored": len(rows),
        "distinct_ids": len(set(ids)),
        "scored_once": sum(1 for i in ids if i in scored),
        "unanswered": sorted(set(stored) - set(ids)),
        "stored_scored_once": len(scored),
        "reused": sum(1 for row in rows if row[4] is not None),
        "not_scored": sorted(i for i in stored.keys() | set(ids) if i not in scored),
        "answer_seconds_max": max((a["seconds"] for a in answers), default=None),
    }


def every_submission_scored_once(submissions: dict[str, Any]) -> bool:
    """The soak's verdict: each id the agent was told once, every stored submission scored once,
    and at most one stored that the agent did not hear back about before its budget ended."""
    return (
        submissions["scored_once"] == submissions["submitted"] == submissions["distinct_ids"]
        and submissions["stored_scored_once"] == submissions["stored"]
        and len(submissions["unanswered"]) <= 1
        and not submissions["not_scored"]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0, help="the agent's budget in seconds")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between the agent's submissions")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between /proc samples")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    # SIGTERM (a timeout) unwinds like Ctrl-C, so the run's processes are stopped too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="autorl-soak-") as tmp:
        result = run_soak(args.duration, args.interval, args.sample_every, Path(tmp))
    result = {
        "benchmark": "soak",
        "command": "nice -n 10 .venv/bin/python bench/soak.py --duration "
        f"{args.duration:g} --interval {args.interval:g}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "duration_s": args.duration,
        "interval_s": args.interval,
        "eval_settings": EVAL_SETTINGS,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
