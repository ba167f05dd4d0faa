"""One row per run in ``$AUTORL_HOME/results.csv``: the store (``autorl results`` is in commands.py).

The columns, their order and the JSON types are a contract (docs/LOCAL.md, "Results"): other tools
read this file, so a row is only ever appended, under a file lock, with the header written once.
A file written before the feedback or the provenance columns is read as it is (its rows are
test-mode runs, nothing read for provenance) and, at the next append, rewritten whole with the new
header, every row kept.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from filelock import FileLock, Timeout

from autorl.errors import AutoRLError, UsageError

RESULTS_FILE = "results.csv"
T = TypeVar("T")
#: How long an append waits for another writer before giving up, in seconds.
LOCK_TIMEOUT_S = 60.0

RunStatus = Literal["completed", "interrupted", "failed"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
#: An experiment's status as a run's row records it: a run whose budget ran out completed (as
#: `autorl run` records it); an experiment that has not finished has no row yet.
ROW_STATUS: dict[str, RunStatus] = {
    "completed": "completed",
    "timed_out": "completed",
    "interrupted": "interrupted",
    "failed": "failed",
}


def succeeded(status: RunStatus, scored: int) -> bool:
    """A run's ``success``: it completed with at least one submission of its agent scored."""
    return status == "completed" and scored > 0


class ResultsError(AutoRLError):
    """``results.csv`` cannot be read or appended to."""


class ResultsFileError(ResultsError, UsageError):
    """``results.csv`` (or its lock) is not a file that can be read as results: a folder, not UTF-8,
    a line that is not a row. The person who keeps the home fixes it; commands exit 2."""


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
    #: test or sealed (docs/PROTOCOL.md); rows written before this column were test-mode runs.
    feedback: str = "test"
    #: The run's one result on the test split: sealed, the final evaluation; test, the best.
    final_score: float | None = None
    final_low: float | None = None  # its 95 % Wilson interval, in points
    final_high: float | None = None
    final_p_value: float | None = None  # exact McNemar against the baseline on the same problems
    selection: str | None = None  # best_on_test, best_on_validation or nominated
    test_evaluations: int | None = None  # agent checkpoints evaluated on test (None: not recorded)
    #: What the agent may have brought in (docs/PROTOCOL.md): test problems found in its files
    #: (None: not read), the final on the twin split and the paired test of its gap against the
    #: base model's, the registered public checkpoint a submission is nearer than the base.
    test_overlap: int | None = None
    twin_score: float | None = None
    twin_p_value: float | None = None
    lineage: str | None = None

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, not {self.status!r}")
        if not self.run_id:
            raise ValueError("run_id must not be empty")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ResultRow))
#: The columns of older files (before feedback modes; before the provenance columns): still read,
#: rewritten whole with today's header at the next append.
LEGACY_COLUMNS: tuple[tuple[str, ...], ...] = (
    COLUMNS[: COLUMNS.index("workspace") + 1],
    COLUMNS[: COLUMNS.index("test_evaluations") + 1],
)
FLOAT_COLUMNS = frozenset(
    {
        "baseline",
        "best_score",
        "improvement",
        "duration_s",
        "final_score",
        "final_low",
        "final_high",
        "twin_score",
    }
)
#: Printed with four significant digits: a p-value of 1e-9 must not round to 0.
P_VALUE_COLUMNS = frozenset({"final_p_value", "twin_p_value"})
_OPTIONAL_INT_COLUMNS = frozenset({"test_evaluations", "test_overlap"})
_OPTIONAL_TEXT_COLUMNS = frozenset({"driver_model", "selection", "lineage"})


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


def format_cell(name: str, value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if name in FLOAT_COLUMNS:
        number = float(value)  # type: ignore[arg-type]
        if not math.isfinite(number):
            return ""
        return repr(round(number, 4))
    if name in P_VALUE_COLUMNS:
        number = float(value)  # type: ignore[arg-type]
        return repr(float(f"{number:.4g}")) if math.isfinite(number) else ""
    return str(value)


def _parse_row(record: dict[str, str], where: str) -> ResultRow:
    values: dict[str, Any] = {}
    try:
        for name in COLUMNS:
            raw = (record.get(name) or "").strip()
            if name in FLOAT_COLUMNS or name in P_VALUE_COLUMNS:
                values[name] = float(raw) if raw else None
            elif name == "submissions":
                values[name] = int(raw or 0)
            elif name in _OPTIONAL_INT_COLUMNS:
                values[name] = int(raw) if raw else None
            elif name == "feedback":
                values[name] = raw or "test"
            elif name == "success":
                values[name] = raw.lower() in {"true", "1", "yes"}
            elif name in _OPTIONAL_TEXT_COLUMNS:
                values[name] = raw or None
            else:
                values[name] = raw
        if values["duration_s"] is None:
            values["duration_s"] = 0.0
        _check_numbers(values)
        return ResultRow(**values)
    except (TypeError, ValueError) as exc:
        raise ResultsFileError(f"{where}: malformed row ({exc}); fix or remove that line") from exc


def _check_numbers(values: dict[str, Any]) -> None:
    """A count is never negative, a number never infinite or NaN (autorl writes neither)."""
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, not {value}")
        if name in {"submissions", "duration_s", *_OPTIONAL_INT_COLUMNS} and value is not None and value < 0:
            raise ValueError(f"{name} must not be negative, not {value}")


def read_rows(home: Path) -> list[ResultRow]:
    """All rows, oldest first (the file's order). A missing file is an empty history; a file that
    cannot be read as rows (a folder, not UTF-8, a line that is not a row) is a ResultsFileError
    naming the file, the line where there is one, and the fix."""
    path = results_path(home)
    text = _text(path)
    if text is None:
        return []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        _check_header(reader.fieldnames, path)
        return [_parse_row(record, f"{path}:{reader.line_num}") for record in reader]
    except csv.Error as exc:
        line = reader.reader.line_num  # the line being read (the DictReader's counts whole rows)
        raise ResultsFileError(f"{path}:{line}: not a CSV row ({exc}); fix or remove that line") from exc


def _text(path: Path) -> str | None:
    """The whole of ``path`` as text (None: there is no such file); every reason it cannot be read
    is a ResultsFileError."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError as exc:
        raise ResultsFileError(
            f"{path} is a folder, not the results file; move it aside (autorl writes its results there)"
        ) from exc
    except OSError as exc:
        raise ResultsFileError(
            f"cannot read {path} ({exc.strerror or exc}); make it a file you can read, or move it aside"
        ) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ResultsFileError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); fix or remove that line"
        ) from exc


def _check_header(header: Sequence[str] | None, path: Path) -> None:
    if header is not None and tuple(header) not in (COLUMNS, *LEGACY_COLUMNS):
        raise ResultsFileError(
            f"{path} has columns {','.join(header)}, expected {','.join(COLUMNS)}; "
            "move the old file aside and run again"
        )


def csv_text(rows: Sequence[ResultRow], *, header: bool) -> str:
    """Rows as ``results.csv`` holds them."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([format_cell(name, getattr(row, name)) for name in COLUMNS])
    return buffer.getvalue()


def append_row(row: ResultRow, home: Path) -> Path:
    """Append ``row`` under a file lock; the header is written when the file is new or empty.

    Refuses a ``run_id`` that is already recorded, so a retried finalization cannot count a run twice.
    """
    path = results_path(home)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsFileError(
            f"cannot make the folder {path.parent} for the results ({exc.strerror or exc}); give a home "
            "that is a folder you can write"
        ) from exc
    with _locked(path):
        existing = read_rows(home)
        if any(old.run_id == row.run_id for old in existing):
            raise ResultsError(f"run {row.run_id} is already recorded in {path}")
        try:
            if existing and _header(path) != COLUMNS:
                _rewrite(path, existing)
            text = csv_text([row], header=not path.exists() or path.stat().st_size == 0)
            # One write call per row: a reader without the lock sees whole lines.
            with path.open("a", newline="", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise ResultsFileError(
                f"cannot write {path} ({exc.strerror or exc}); make it a file you can write"
            ) from exc
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """``path``'s file lock, held for the block; a lock that cannot be taken is a ResultsFileError."""
    lock = FileLock(f"{path}.lock")
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout as exc:
        raise ResultsFileError(
            f"another process has held {lock.lock_file} for {LOCK_TIMEOUT_S:g} s; wait for it to finish, "
            "or remove that file if no autorl command runs"
        ) from exc
    except OSError as exc:
        raise ResultsFileError(
            f"cannot lock {path} through {lock.lock_file} ({exc.strerror or exc}); make it a file you can "
            "write, or move it aside"
        ) from exc
    try:
        yield
    finally:
        lock.release()


def _header(path: Path) -> tuple[str, ...]:
    with path.open(newline="", encoding="utf-8") as handle:
        return tuple(next(csv.reader(handle), []))


def _rewrite(path: Path, rows: Sequence[ResultRow]) -> None:
    """Write ``rows`` with the current header in place of an older file, atomically: a reader
    sees the old file or the whole new one (call under the file lock)."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        partial.write_text(csv_text(rows, header=True), encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
