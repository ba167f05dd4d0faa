"""results.csv: exact columns, typed round trip, one row per run, and `autorl results` output."""

from __future__ import annotations

import csv
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from autorl.cli import main
from autorl.runs.results import (
    COLUMNS,
    ResultsError,
    append_row,
    csv_text,
    new_run_id,
    read_rows,
    results_path,
)
from tests.support.result_rows import result_row as row
from tests.support.result_rows import unscored_row


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
        "feedback",
        "final_score",
        "final_low",
        "final_high",
        "final_p_value",
        "selection",
        "test_evaluations",
        "test_overlap",
        "twin_score",
        "twin_p_value",
        "lineage",
    )


def test_a_file_written_before_the_provenance_columns_is_read_and_rewritten_with_every_row(
    tmp_path: Path,
) -> None:
    path = results_path(tmp_path)
    before = COLUMNS[: COLUMNS.index("test_evaluations") + 1]
    path.write_text(
        ",".join(before) + "\n"
        "old,2026-12-05T10:00:00+00:00,arith,example_grpo,,builtin:tiny-qwen2,0.0,12.5,12.5,3,301.5,true,"
        "completed,/tmp/ws,sealed,31.25,20.1,44.9,3.2e-09,nominated,1\n"
    )
    (old,) = read_rows(tmp_path)
    assert (old.final_score, old.test_overlap, old.twin_score, old.lineage) == (31.25, None, None, None)
    append_row(
        row("new", test_overlap=7, twin_score=40.0, twin_p_value=2.5e-7, lineage="models/instruct, v2"),
        tmp_path,
    )
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 3
    assert read_rows(tmp_path) == [old, read_rows(tmp_path)[1]]
    new = read_rows(tmp_path)[1]
    assert (new.test_overlap, new.twin_score, new.twin_p_value) == (7, 40.0, 2.5e-7)
    assert new.lineage == "models/instruct, v2"  # a comma in a path stays one cell


LEGACY_HEADER = (
    "run_id,timestamp,task,agent,driver_model,base_model,baseline,best_score,improvement,"
    "submissions,duration_s,success,status,workspace"
)


def test_a_file_written_before_the_feedback_columns_is_read_and_rewritten_with_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results_path(tmp_path)
    path.write_text(
        LEGACY_HEADER + "\n"
        "old1,2026-11-30T10:00:00+00:00,arith,example_grpo,,builtin:tiny-qwen2,0.0,12.5,12.5,3,301.5,true,"
        "completed,/tmp/ws\n"
        "old2,2026-11-30T11:00:00+00:00,gsm8k,claude,opus,Qwen/Qwen2.5-1.5B,60.0,,,0,20.0,false,failed,/tmp/w2\n"
    )
    old = read_rows(tmp_path)
    assert [(r.run_id, r.feedback, r.final_score, r.test_evaluations) for r in old] == [
        ("old1", "test", None, None),
        ("old2", "test", None, None),
    ]
    assert main(["results", "--json", "--home", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["best_score"] == 12.5 and listed[0]["feedback"] == "test"
    assert listed[0]["final_score"] is None and listed[0]["test_evaluations"] is None

    append_row(
        row(
            "new",
            feedback="sealed",
            final_score=31.25,
            final_low=20.1,
            final_high=44.9,
            final_p_value=3.2e-9,
            selection="nominated",
            test_evaluations=1,
        ),
        tmp_path,
    )
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 4  # every old row kept, one header
    rows = read_rows(tmp_path)
    assert [r.run_id for r in rows] == ["old1", "old2", "new"]
    assert rows[:2] == old
    assert rows[2].final_p_value == 3.2e-9  # small p-values keep their digits
    assert (rows[2].selection, rows[2].test_evaluations, rows[2].feedback) == ("nominated", 1, "sealed")
    assert main(["results", "--home", str(tmp_path), "--wide"]) == 0
    table = capsys.readouterr().out
    assert "nominated" in table and "[20.10, 44.90]" in table and "sealed" in table


def test_rows_round_trip_with_types_and_header_once(tmp_path: Path) -> None:
    append_row(row("a"), tmp_path)
    append_row(unscored_row("b", "interrupted"), tmp_path)
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


def filtered_ids(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["results", "--json", "--home", str(home), *args]) == 0
    return [r["run_id"] for r in json.loads(capsys.readouterr().out)]


def _written_row(**cells: str) -> str:
    """A results.csv file's text: the header and row "a" as autorl writes it, cells replaced."""
    record = dict(zip(COLUMNS, next(csv.reader([csv_text([row("a")], header=False)])), strict=True))
    return csv_text([], header=True) + ",".join({**record, **cells}.values()) + "\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            lambda: _written_row(submissions="-3").encode(),
            ":2: malformed row (submissions must not be negative",
        ),
        (lambda: _written_row(duration_s="inf").encode(), ":2: malformed row (duration_s must be a finite"),
        (lambda: _written_row(best_score="nan").encode(), ":2: malformed row (best_score must be a finite"),
        (lambda: _written_row(test_overlap="-1").encode(), ":2: malformed row (test_overlap must not be neg"),
        (lambda: _written_row(task="caf\xe9").encode("latin-1"), ":2: not UTF-8 text (byte 0xe9)"),
        (lambda: _written_row(workspace="w" * 200_000).encode(), ":2: not a CSV row (field larger than"),
    ],
)
def test_a_results_file_that_cannot_be_read_names_the_line_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Callable[[], bytes], message: str
) -> None:
    path = results_path(tmp_path)
    path.write_bytes(content())
    assert main(["results", "--home", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"{path}{message}" in error and error.rstrip().endswith("; fix or remove that line")
    assert "Traceback" not in error
    with pytest.raises(ResultsError, match="fix or remove that line"):  # and nothing is appended
        append_row(row("b"), tmp_path)
    assert path.read_bytes() == content()


def test_a_results_file_that_is_a_folder_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = results_path(tmp_path)
    path.mkdir()
    assert main(["results", "--home", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"error: {path} is a folder, not the results file; move it aside" in error
    assert "Traceback" not in error
    with pytest.raises(ResultsError, match="is a folder, not the results file; move it aside"):
        append_row(row("a"), tmp_path)  # `autorl run` reads the file so before it starts
    assert list(path.iterdir()) == []


def test_a_home_that_is_missing_is_named_and_one_that_is_a_file_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main(["results", "--home", str(missing)]) == 0
    assert f"no runs recorded yet: the home {missing} does not exist (check --home" in capsys.readouterr().err
    assert not missing.exists()
    a_file = tmp_path / "a-file"
    a_file.write_text("not a home\n")
    for command in (["results"], ["report", "20261130-101500-arith-aaaaaa"]):
        assert main([*command, "--home", str(a_file)]) == 2
        error = capsys.readouterr().err
        assert (
            f"error: --home names {a_file}, which is a file, not a folder; give --home the platform's"
            in error
        )


def test_results_filter_by_task_agent_and_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_row(row("a1"), tmp_path)
    append_row(row("g1", task="gsm8k", base_model="Qwen/Qwen2.5-1.5B"), tmp_path)
    append_row(row("g2", task="gsm8k", agent="claude", base_model="Qwen/Qwen2.5-1.5B"), tmp_path)
    append_row(row("g3", task="gsm8k", agent="claude", base_model="Qwen/Qwen2.5-0.5B"), tmp_path)
    assert filtered_ids(tmp_path, capsys, "--task", "gsm8k") == ["g1", "g2", "g3"]
    assert filtered_ids(tmp_path, capsys, "--agent", "claude") == ["g2", "g3"]
    assert filtered_ids(tmp_path, capsys, "--model", "Qwen/Qwen2.5-1.5B", "--agent", "claude") == ["g2"]
    assert filtered_ids(tmp_path, capsys, "--task", "math") == []
    assert main(["results", "--home", str(tmp_path), "--task", "math"]) == 0
    assert "no runs match --task math" in capsys.readouterr().err
    assert main(["results", "--csv", "--home", str(tmp_path), "--agent", "claude"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ",".join(COLUMNS) and [line.split(",")[0] for line in lines[1:]] == ["g2", "g3"]


def test_results_compare_shows_runs_side_by_side_with_their_report_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append_row(row("20261130-101500-arith-aaaaaa", best_score=40.0, improvement=40.0), tmp_path)
    append_row(row("20261130-111500-arith-bbbbbb", agent="sft_only", best_score=22.5), tmp_path)
    append_row(row("20261130-121500-arith-cccccc"), tmp_path)
    report = tmp_path / "runs" / "20261130-101500-arith-aaaaaa" / "reports" / "metrics.json"
    report.parent.mkdir(parents=True)
    report.write_text(
        json.dumps(
            {
                "time_to_best": 123.4,
                "monotonic_ratio": 0.75,
                "best_interval": [37.318, 42.771],
                "best_difference_interval": [1.254, 6.5],
                "best_p_value": 0.0012,
                "best_distinguishable": True,
            }
        )
    )
    args = ["results", "--home", str(tmp_path), "--compare", "20261130-1115", "20261130-101500-arith-aaaaaa"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[37.32, 42.77]" in out and "[1.25, 6.50]" in out and "0.0012" in out
    assert "20261130-101500-arith-aaaaaa" in out and "20261130-111500-arith-bbbbbb" in out
    assert "20261130-121500-arith-cccccc" not in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.count("│") >= 3}
    assert [c.strip() for c in lines["best_score"].split("│")[2:4]] == ["40.0", "22.5"]  # oldest on the left
    assert "sft_only" in lines["agent"]
    assert "123.4" in lines["time_to_best"] and "0.75" in lines["monotonic_ratio"]
    # With --compare, --json holds the rows (as --json prints them) under "runs", beside the
    # repeats' aggregate (tests/unit/test_repeats.py).
    assert (
        main(["results", "--json", "--home", str(tmp_path), "--compare", "20261130-1215", "20261130-1015"])
        == 0
    )
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [
        "20261130-101500-arith-aaaaaa",
        "20261130-121500-arith-cccccc",
    ]


def test_results_compare_refuses_unknown_and_ambiguous_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append_row(row("20261130-101500-arith-aaaaaa"), tmp_path)
    append_row(row("20261130-111500-arith-bbbbbb"), tmp_path)
    assert main(["results", "--home", str(tmp_path), "--compare", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["results", "--home", str(tmp_path), "--compare", "20261130"]) == 2
    assert "matches 2 runs" in capsys.readouterr().err


def test_an_ambiguous_prefix_names_the_runs_it_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run the refusal counts is named, or counted as "and N more": never "6 runs" and 5 names."""
    ids = [f"20261130-1{hour}{minute}500-arith-aaaaa{minute}" for hour in (0, 1) for minute in range(5)][:7]
    for run_id in ids:
        append_row(row(run_id), tmp_path)
    assert main(["results", "--home", str(tmp_path), "--compare", "20261130-10"]) == 2
    assert "matches 5 runs (" + ", ".join(ids[:5]) + "); give more" in capsys.readouterr().err
    assert main(["results", "--home", str(tmp_path), "--compare", "20261130"]) == 2
    assert "matches 7 runs (" + ", ".join(ids[:5]) + " and 2 more); give more" in capsys.readouterr().err


def test_report_in_a_home_where_nothing_ran_says_so_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "fresh"
    assert main(["report", "20261130-101500-arith-aaaaaa", "--home", str(home)]) == 2
    error = capsys.readouterr().err
    assert f"no runs recorded yet in {home}" in error and "unreachable" not in error
    assert not home.exists()  # no empty autorl.db left behind


def test_results_compare_refuses_runs_of_different_feedback_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append_row(row("20261130-101500-arith-aaaaaa"), tmp_path)
    append_row(row("20261130-111500-arith-bbbbbb", feedback="sealed", selection="nominated"), tmp_path)
    append_row(row("20261130-121500-arith-cccccc", feedback="sealed"), tmp_path)
    assert main(["results", "--home", str(tmp_path), "--compare", "20261130-10", "20261130-11"]) == 2
    error = capsys.readouterr().err
    assert "feedback test" in error and "feedback sealed" in error and "one feedback mode" in error
    assert main(["results", "--home", str(tmp_path), "--compare", "20261130-11", "20261130-12"]) == 0


def test_results_table_shows_cells_as_inert_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # An agent named after its folder: brackets and control characters are data, not markup or escapes.
    append_row(
        row("r1", agent="[/bold]agent[link=https://evil.example]x\x1b]0;t\x07", base_model="m\u202e"),
        tmp_path,
    )
    append_row(row("r2", agent="[bold"), tmp_path)
    for args in (["--wide"], ["--compare", "r1", "r2"]):
        assert main(["results", "--home", str(tmp_path), *args]) == 0
        out = capsys.readouterr().out
        assert "[/bold]agent[link=https://evil.example]x\\x1b]0;t\\x07" in out and "m\\u202e" in out
        assert "[bold" in out and "\x1b" not in out and "\u202e" not in out
    # The narrow table folds the long agent onto more lines: escaped there too.
    assert main(["results", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "m\\u202e" in out and "[bold" in out and "\x1b" not in out and "\u202e" not in out


def test_results_table_shows_a_runs_notes_escaped_once(capsys: pytest.CaptureFixture[str]) -> None:
    """A note is escaped where it is made; the message beside it may quote an agent's string raw."""
    from autorl.provenance.unverified import TEST_UNVERIFIED, note
    from autorl.runs.results_table import print_results

    message = "raw \x1b[2J part; " + note(TEST_UNVERIFIED, "the read of a\x1bb failed")
    for wide in (False, True):
        print_results([row("r1")], {"r1": message}, lambda run_id: {}, title="t", wide=wide)
        out = " ".join(capsys.readouterr().out.split())
        assert "raw \\x1b[2J part" in out and "the read of a\\x1bb failed" in out, out
        assert "\\\\x1b" not in out and "\x1b" not in out


def test_results_table_shows_the_best_scores_interval_from_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    append_row(row("20261130-101500-arith-aaaaaa", best_score=40.0, improvement=40.0), tmp_path)
    append_row(row("20261130-111500-arith-bbbbbb"), tmp_path)
    report = tmp_path / "runs" / "20261130-101500-arith-aaaaaa" / "reports" / "metrics.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"best_interval": [37.318, 42.771]}))
    assert main(["results", "--home", str(tmp_path), "--wide"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "arith-" in line]
    assert "[37.32, 42.77]" in lines[0] and "[" not in lines[1]  # a run without a report shows "-"
