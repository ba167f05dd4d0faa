"""The Fuzzing, Load and Soak sections of docs/RELIABILITY.md, rendered from committed results.

Each renderer reads one file under ``bench/results/`` and returns the markdown of one generated
block (``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->``), table and reproducing command included:

- ``fuzzing`` ← ``grader_fuzz.json`` (tests/integration/test_grader_fuzz.py with AUTORL_FUZZ_REPORT);
- ``load`` ← ``grader_load.json`` (bench/grader_load.py, one entry per measured version);
- ``soak`` ← ``soak.json`` (bench/soak.py).

:data:`RENDERERS` maps block names to renderers, in the shape the document generator takes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.docgen import load_results


def fuzzing_table() -> str:
    fuzz = load_results("grader_fuzz")
    failed = fuzz["failed_operations"]
    verdict = "**passed**" if not failed and fuzz["server_errors"] == 0 else "**FAILED**"
    statuses = ", ".join(f"{code}: {count}" for code, count in fuzz["statuses"].items())
    return (
        "| bad-input class | cases | outcome |\n"
        "| --- | ---: | --- |\n"
        f"| requests generated from the grader's OpenAPI document ({fuzz['tool']}, "
        f"{fuzz['examples_per_operation']} examples per operation, deterministic), over "
        f"{fuzz['operations']} operations, with valid agent and admin credentials | {fuzz['cases']} | "
        f"{verdict}: {fuzz['server_errors']} server errors, {len(failed)} operations with an answer "
        f"outside the documented schema; statuses {statuses} |\n\n"
        f"Recorded: {fuzz['date']}. Reproduce: `{fuzz['command']}`.\n"
    )


def _load_rows(label: str, run: dict[str, Any]) -> list[str]:
    rows = []
    for scenario in ("bare_time", "time", "mixed"):
        figures = run[scenario]
        ratio = "1 (yardstick)" if scenario == "bare_time" else f"{figures['ratio_to_bare']:.2f}×"
        rows.append(
            f"| {label} | {scenario} | {run['agents']} | {figures['requests_per_s']:,.1f} requests/s | "
            f"{figures['latency_ms_p50']:,.0f} ms | {figures['latency_ms_p99']:,.0f} ms | "
            f"{figures['errors']} | {ratio} |"
        )
    return rows


def load_table() -> str:
    # The throughput runs; the fair share's run (``--scenarios tenants``) is PERFORMANCE.md's.
    runs: dict[str, Any] = {
        label: run for label, run in load_results("grader_load")["runs"].items() if "bare_time" in run
    }
    lines = [
        "| version | scenario | agents | throughput | p50 | p99 | errors | ratio to bare |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, run in runs.items():
        lines.extend(_load_rows(label, run))
    lines += [
        "",
        "| version | blocking `/submit` waiters held | database transactions/s before them "
        "| while they wait |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, run in runs.items():
        waiters = run["waiters"]
        held = f"{waiters['held']} of {waiters['waiters']}"
        idle = waiters.get("db_transactions_per_s_before_waiters")
        idle_cell = "not measured" if idle is None else f"{idle:,.1f}"
        lines.append(f"| {label} | {held} | {idle_cell} | {waiters['db_transactions_per_s']:,.1f} |")
    commands = "; ".join(f"{label}: `{run['command']}` ({run['date']})" for label, run in runs.items())
    return "\n".join(lines) + f"\n\nReproduce: {commands}.\n"


def _process_name(command: str) -> str:
    """``/x/.venv/bin/python /x/.venv/bin/autorl grader --port 1`` → ``autorl grader``."""
    words = [Path(word).name for word in command.split()]
    if words and words[0].startswith("python"):
        words = words[1:]
    name = []
    for word in words[:2]:
        if word.startswith("-"):
            break
        name.append(word)
    return " ".join(name)


def soak_table() -> str:
    soak = load_results("soak")
    lines = [
        "| process | RSS start → end (max) | RSS trend | open descriptors start → end (max) "
        "| database connections (max) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for process in soak["processes"]:
        name = _process_name(process["command"])
        lines.append(
            f"| `{name}` | {process['rss_mb_start']:,.1f} → {process['rss_mb_end']:,.1f} MB "
            f"({process['rss_mb_max']:,.1f}) | {process['rss_mb_per_hour']:+,.1f} MB/hour | "
            f"{process['fds_start']} → {process['fds_end']} ({process['fds_max']}) | "
            f"{process.get('database_connections_max', 'not recorded')} |"
        )
    submissions = soak["submissions"]
    once = submissions["every_one_scored_once"]
    verdict = "**passed**" if once and soak["exit_code"] == 0 else "**FAILED**"
    unanswered = len(submissions["unanswered"])
    lines += [
        "",
        f"{verdict}: the agent submitted {submissions['submitted']} distinct checkpoints in "
        f"{soak['agent_phase_s']:,.0f} s; {submissions['scored_once']} were scored exactly once (one "
        f"attempt, one score, each id once), {len(submissions['not_scored'])} stored were not; "
        f"{unanswered} more {'was' if unanswered == 1 else 'were'} stored while the "
        f"agent, its budget over, no longer waited for the answer. Recorded: {soak['date']}. "
        f"Reproduce: `{soak['command']}`.",
    ]
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "fuzzing": fuzzing_table,
    "load": load_table,
    "soak": soak_table,
}
