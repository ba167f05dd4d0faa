"""One row per run in ``$AUTORL_HOME/results.csv``, and the ``autorl results`` command.

The columns, their order and the JSON types are a contract (DESIGN.md, "Results"): other tools
read this file, so a row is only ever appended, under a file lock, with the header written once.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import secrets
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from filelock import FileLock

from autorl.errors import AutoRLError

RESULTS_FILE = "results.csv"
#: How long an append waits for another writer before giving up, in seconds.
LOCK_TIMEOUT_S = 60.0

RunStatus = Literal["completed", "interrupted", "failed"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)


class ResultsError(AutoRLError):
    """``results.csv`` cannot be read or appended to."""


@dataclass(frozen=True)
class ResultRow:
    """One finished run. ``None`` marks a score that does not exist (nothing was scored)."""

    run_id: str
    timestamp: str  # ISO 8601, UTC
    task: str
    agent: str
    driver_model: str | None  # the LLM that drove an LLM agent; None for scripted agents
    base_model: str
    baseline: float | None
    best_score: float | None
    improvement: float | None
    submissions: int  # scored submissions
    duration_s: float  # the whole run, preparation included
    success: bool  # completed with at least one scored submission
    status: RunStatus
    workspace: str

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, not {self.status!r}")
        if not self.run_id:
            raise ValueError("run_id must not be empty")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ResultRow))
_FLOAT_COLUMNS = frozenset({"baseline", "best_score", "improvement", "duration_s"})
_OPTIONAL_TEXT_COLUMNS = frozenset({"driver_model"})


def results_path(home: Path) -> Path:
    return home.expanduser() / RESULTS_FILE


def new_run_id(task: str, now: datetime | None = None) -> str:
    """A sortable, unique id: UTC time, task, random suffix (``20261129-231500-arith-4f1c2a``).

    Lowercase letters, digits and ``-`` only: it also names the experiment (a DNS-1123 name).
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    safe_task = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-") or "task"
    return f"{moment:%Y%m%d-%H%M%S}-{safe_task}-{secrets.token_hex(3)}"


def utc_timestamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds")


def _format_cell(name: str, value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if name in _FLOAT_COLUMNS:
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number):
            return ""
        return repr(round(number, 4))
    return str(value)


def _parse_row(record: dict[str, str], where: str) -> ResultRow:
    values: dict[str, Any] = {}
    try:
        for name in COLUMNS:
            raw = (record.get(name) or "").strip()
            if name in _FLOAT_COLUMNS:
                values[name] = float(raw) if raw else None
            elif name == "submissions":
                values[name] = int(raw or 0)
            elif name == "success":
                values[name] = raw.lower() in {"true", "1", "yes"}
            elif name in _OPTIONAL_TEXT_COLUMNS:
                values[name] = raw or None
            else:
                values[name] = raw
        if values["duration_s"] is None:
            values["duration_s"] = 0.0
        return ResultRow(**values)
    except (TypeError, ValueError) as exc:
        raise ResultsError(f"{where}: malformed row ({exc}); fix or remove that line") from exc


def read_rows(home: Path) -> list[ResultRow]:
    """All rows, oldest first (the file's order). A missing file is an empty history."""
    path = results_path(home)
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        _check_header(reader.fieldnames, path)
        return [_parse_row(record, f"{path}:{reader.line_num}") for record in reader]


def _check_header(header: Sequence[str] | None, path: Path) -> None:
    if header is not None and tuple(header) != COLUMNS:
        raise ResultsError(
            f"{path} has columns {','.join(header)}, expected {','.join(COLUMNS)}; "
            "move the old file aside and run again"
        )


def append_row(row: ResultRow, home: Path) -> Path:
    """Append ``row`` under a file lock; the header is written when the file is new or empty.

    Refuses a ``run_id`` that is already recorded, so a retried finalization cannot count a run twice.
    """
    path = results_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        existing = read_rows(home)
        if any(old.run_id == row.run_id for old in existing):
            raise ResultsError(f"run {row.run_id} is already recorded in {path}")
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if not path.exists() or path.stat().st_size == 0:
            writer.writerow(COLUMNS)
        writer.writerow([_format_cell(name, getattr(row, name)) for name in COLUMNS])
        # One write call per row: a reader without the lock sees whole lines.
        with path.open("a", newline="", encoding="utf-8") as handle:
            handle.write(buffer.getvalue())
    return path


def _print_table(rows: list[ResultRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=240)  # piped or redirected: whole values, not ellipses at 80 columns
    table = Table(title="AutoRL runs", title_justify="left")
    shown = ("run_id", "task", "agent", "base_model", "baseline", "best_score", "improvement")
    for name in (*shown, "submissions", "duration_s", "status"):
        table.add_column(name, justify="right" if name in _FLOAT_COLUMNS or name == "submissions" else "left")
    for row in rows:
        cells = [_format_cell(name, getattr(row, name)) or "-" for name in shown]
        table.add_row(*cells, str(row.submissions), f"{row.duration_s:.0f}", row.status)
    console.print(table)


def _run(args: argparse.Namespace) -> int:
    from autorl.settings import load_settings

    home: Path = args.home or load_settings().home
    rows = read_rows(home)
    if args.json:
        # Only the JSON document on stdout, so that `autorl results --json | jq` works.
        print(json.dumps([row.to_json() for row in rows], indent=2))
    elif args.csv:
        path = results_path(home)
        sys.stdout.write(path.read_text(encoding="utf-8") if path.exists() else ",".join(COLUMNS) + "\n")
    elif rows:
        _print_table(rows)
    else:
        print(f"no runs recorded yet in {results_path(home)}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "results",
        help="show the results of past runs ($AUTORL_HOME/results.csv)",
        description="One row per run: baseline, best score, improvement, submissions, status.",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--csv", action="store_true", help="print the raw CSV file")
    output.add_argument("--json", action="store_true", help="print a JSON list of rows, oldest first")
    parser.add_argument("--home", type=Path, default=None, help="platform home (default: $AUTORL_HOME)")
    parser.set_defaults(func=_run)
