"""results.csv: exact columns, typed round trip, one row per run, and `autorl results` output."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path

import pytest

from autorl.cli import main
from autorl.results import COLUMNS, ResultRow, ResultsError, append_row, new_run_id, read_rows, results_path


def row(run_id: str, **overrides: object) -> ResultRow:
    values: dict[str, object] = {
        "run_id": run_id,
        "timestamp": "2026-11-29T23:00:00+00:00",
        "task": "arith",
        "agent": "example_grpo",
        "driver_model": None,
        "base_model": "builtin:tiny-qwen2",
        "baseline": 0.0,
        "best_score": 12.5,
        "improvement": 12.5,
        "submissions": 3,
        "duration_s": 301.5,
        "success": True,
        "status": "completed",
        "workspace": "/tmp/ws",
    }
    values.update(overrides)
    return ResultRow(**values)  # type: ignore[arg-type]


def test_columns_are_the_contract() -> None:
    assert COLUMNS == (
        "run_id",
        "timestamp",
        "task",
        "agent",
        "driver_model",
        "base_model",
        "baseline",
        "best_score",
        "improvement",
        "submissions",
        "duration_s",
        "success",
        "status",
        "workspace",
    )


def test_rows_round_trip_with_types_and_header_once(tmp_path: Path) -> None:
    append_row(row("a"), tmp_path)
    append_row(
        row(
            "b",
            baseline=None,
            best_score=None,
            improvement=None,
            submissions=0,
            success=False,
            status="interrupted",
        ),
        tmp_path,
    )
    lines = results_path(tmp_path).read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS)
    assert len(lines) == 3
    first, second = read_rows(tmp_path)
    assert first == row("a")
    assert second.baseline is None and second.best_score is None and second.status == "interrupted"


def test_duplicate_run_id_refused(tmp_path: Path) -> None:
    append_row(row("same"), tmp_path)
    with pytest.raises(ResultsError, match="already recorded"):
        append_row(row("same"), tmp_path)
    assert len(read_rows(tmp_path)) == 1


def test_concurrent_appends_keep_every_row_whole(tmp_path: Path) -> None:
    threads = [threading.Thread(target=append_row, args=(row(f"r{i}"), tmp_path)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with results_path(tmp_path).open(newline="") as handle:
        records = list(csv.DictReader(handle))
    assert sorted(r["run_id"] for r in records) == sorted(f"r{i}" for i in range(12))


def test_unknown_status_refused() -> None:
    with pytest.raises(ValueError, match="status"):
        row("x", status="timed_out")


def test_run_ids_are_unique_and_dns_safe() -> None:
    ids = {new_run_id("arith") for _ in range(200)}
    assert len(ids) == 200
    assert all(i == i.lower() and i.replace("-", "").isalnum() for i in ids)


def test_results_json_prints_only_a_typed_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_row(row("old"), tmp_path)
    append_row(
        row("new", baseline=None, best_score=None, improvement=None, submissions=0, success=False), tmp_path
    )
    assert main(["results", "--json", "--home", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in data] == ["old", "new"]
    assert data[0]["baseline"] == 0.0 and data[0]["best_score"] == 12.5
    assert isinstance(data[0]["submissions"], int) and isinstance(data[0]["duration_s"], float)
    assert data[0]["success"] is True
    assert data[1]["baseline"] is None and data[1]["improvement"] is None
    assert data[0]["driver_model"] is None


def test_results_csv_prints_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_row(row("a"), tmp_path)
    assert main(["results", "--csv", "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out == results_path(tmp_path).read_text()


def test_results_with_no_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", "--json", "--home", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_foreign_header_refused_with_the_fix(tmp_path: Path) -> None:
    results_path(tmp_path).write_text("run_id,score\nx,1\n")
    with pytest.raises(ResultsError, match="move the old file aside"):
        append_row(row("a"), tmp_path)
