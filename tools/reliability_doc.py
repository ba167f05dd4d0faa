"""The tables of docs/RELIABILITY.md, rendered from the committed results under ``bench/results/``.

Each section is a block of the document (:mod:`docgen`) with a renderer here, reading files that
tests or benchmarks wrote. The faults table reads ``bench/results/faults/*.json``, one file per
fault, written by the fault tests when ``AUTORL_RECORD_RESULTS=1`` (``make reliability``). A new
section: a results file, a renderer in :data:`RENDERERS`, and its block in the document.

    python3 -m tools.reliability_doc   # rewrite the document's blocks
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tools.docgen import REPO_ROOT, RESULTS, Document, load_results, number
from tools.reliability_tables import RENDERERS as LOAD_RENDERERS

FAULTS = RESULTS / "faults"

#: What each run of ``tools/order_record.py`` checks, in the document's words.
ORDER_RUNS = {
    "pair": "the grader API and operator modules, which once shared rows, in the order named",
    "pair_reverse": "the same modules, every test in reverse order",
    "suite_reverse_parallel": "the whole suite, reversed, in two xdist processes",
}

#: mutmut's outcomes, in the order the table shows them.
MUTATION_OUTCOMES = ("killed", "survived", "no tests", "timeout")

#: ``make test``'s phases and passes (``tools/suite_time.py``), in the document's words.
PHASE_NAMES = {
    "setup": "set-up (`make setup`: the three Python environments, the browser)",
    "images": "the CPU images (`make images GPU=0`, podman)",
    "lint": "`make lint`",
    "suite": "the suite over two processes",
    "suite_reverse": "the reverse pass (what order can break)",
}

#: What ``tools/build_time.py`` builds one after another and side by side, in the document's words.
BUILD_PARTS = {
    "setup": "`make setup`'s three Python environments",
    "images": "`make images GPU=0` (every CPU image)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fault_records() -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(FAULTS.glob("*.json"))]


def faults_table() -> str:
    lines = [
        "| fault | cases | outcome | test |",
        "| --- | ---: | --- | --- |",
    ]
    for record in fault_records():
        verdict = "**passed**" if record["passed"] else "**FAILED**"
        lines.append(
            f"| {_cell(record['fault'])} | {record['cases']} | {verdict}: {_cell(record['outcome'])} | "
            f"`{record['test']}` |"
        )
    recorded = sorted({record["recorded"] for record in fault_records()})
    dates = ", ".join(recorded) if recorded else "never"
    return "\n".join(lines) + f"\n\nRecorded: {dates}.\n"


def test_order_table() -> str:
    data = load_results("test_order")
    lines = [
        "| run | command | passed | failed | skipped | wall s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, what in ORDER_RUNS.items():
        record = data["runs"].get(name)
        if record is None:
            continue
        failed = record["failures"] + record["errors"]
        lines.append(
            f"| {what} | `{record['command']}` | {record['passed']:,} | {failed} | {record['skipped']} | "
            f"{number(record['wall_s'], 0)} |"
        )
    dates = ", ".join(sorted({r["date"] for r in data["runs"].values()}))
    machine = data["machine"]
    return (
        "\n".join(lines) + f"\n\nMeasured {dates} on {machine['cpus']} CPU cores "
        f"(load average {machine['load_avg_1m']} at the end of the last run).\n"
    )


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _survival(survivor: dict[str, str]) -> str:
    if "untestable_here" in survivor:
        return "**not tested here**: " + _cell(survivor["untestable_here"])
    return "**a missing test**"


def mutation_table() -> str:
    """The outcomes by module; the survivors that are not equivalent, each with why (every
    equivalent one's reason is in the results file)."""
    data = load_results("mutation")
    outcomes = ", ".join(f"{status} {count}" for status, count in data["outcomes"].items())
    by_module = data["outcomes_by_module"]
    others = sorted({s for counts in by_module.values() for s in counts} - set(MUTATION_OUTCOMES))
    columns = [*MUTATION_OUTCOMES, *others]
    survivors = data["survivors"]
    open_ones = [s for s in survivors if "equivalent" not in s]
    lines = [
        f"Run {data['date'][:10]} with {data['tool']} (`make mutation`): {data['mutants']} mutants; "
        f"{outcomes}. Of the {len(survivors)} survivors, {len(survivors) - len(open_ones)} are equivalent "
        "(each one's reason is in `bench/results/mutation.json`)"
        + (", the others below." if open_ones else "; none is a missing test."),
        "",
        "| module | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---:" for _ in columns) + " |",
    ]
    for module, counts in by_module.items():
        lines.append(f"| {_code(module)} | " + " | ".join(str(counts.get(c, 0)) for c in columns) + " |")
    if open_ones:
        lines += ["", "| surviving mutant | the changed line | why it survives |", "| --- | --- | --- |"]
        lines += [f"| {_code(s['mutant'])} | {_code(s['change'])} | {_survival(s)} |" for s in open_ones]
    return "\n".join(lines) + "\n"


def suite_time_table() -> str:
    data = load_results("suite_time")
    lines = ["| phase | minutes |", "| --- | ---: |"]
    lines += [
        f"| {PHASE_NAMES.get(phase['name'], phase['name'])} | {number(phase['seconds'] / 60)} |"
        for phase in data["phases"]
    ]
    total = number(data["total_s"] / 60)
    lines.append(f"| **all of `make test`** (exit {data['exit_code']}) | **{total}** |")
    passes = data["passes"]
    lines += ["", "| pass | pytest's summary | slowest test | its seconds |", "| --- | --- | --- | ---: |"]
    for name in ("suite", "suite_reverse"):
        run = passes.get(name)
        if run is None:
            continue
        slowest = max(run["slowest"], key=lambda entry: entry["seconds"], default=None)
        test = _code(f"{slowest['test']} ({slowest['when']})") if slowest else "–"
        seconds = number(slowest["seconds"], 0) if slowest else "–"
        lines.append(f"| {PHASE_NAMES[name]} | {run['summary']} | {test} | {seconds} |")
    machine = data["machine"]
    text = (
        "\n".join(lines) + f"\n\nMeasured {data['date']} at commit `{data['commit'][:10]}` on "
        f"{machine['cpus']} CPU cores (load average {machine['load_avg_start']} at the start): "
        f"`{data['command']}`.\n"
    )
    return text + build_time_table()


def build_time_table() -> str:
    """One after another against side by side, from cold caches (``tools/build_time.py``)."""
    if not (RESULTS / "build_time.json").exists():
        return ""
    data = load_results("build_time")
    lines = [
        "",
        "Set-up and images, one after another and side by side, each from cold caches in one run "
        "(`python -m tools.build_time`):",
        "",
        "| part | one after another, s | side by side, s | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for part, name in BUILD_PARTS.items():
        runs = data.get(part)
        if not runs:
            continue
        sequential, parallel = runs["sequential"]["seconds"], runs["parallel"]["seconds"]
        ratio = number(sequential / parallel, 2)
        lines.append(f"| {name} | {number(sequential, 0)} | {number(parallel, 0)} | {ratio}× |")
    where = f"at commit `{data['commit'][:10]}` on {data['machine']['cpus']} CPU cores"
    return "\n".join(lines) + f"\n\nMeasured {data['date']} {where}.\n"


RENDERERS: dict[str, Callable[[], str]] = {
    "suite-time": suite_time_table,
    "faults": faults_table,
    "mutation": mutation_table,
    "test-order": test_order_table,
}

#: This module's tables and reliability_tables' (fuzzing, load, soak).
RELIABILITY = Document(REPO_ROOT / "docs" / "RELIABILITY.md", RENDERERS | LOAD_RENDERERS)


if __name__ == "__main__":
    RELIABILITY.main()
