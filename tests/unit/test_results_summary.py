"""`autorl results --summary`: the runs of results.csv grouped by task, agent, base model and
feedback mode, with their counts and best and mean scores, as a table, JSON or CSV; filters narrow
it first."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from autorl.cli import main
from autorl.runs.results import COLUMNS, append_row, results_path
from autorl.runs.summary import SUMMARY_COLUMNS, RunOutcome, summarize
from tests.support.result_rows import result_row as row
from tests.support.result_rows import unscored_row


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Three GRPO runs and two SFT runs of arith on the tiny model (one failed), one GRPO run of gsm8k."""
    append_row(row("g1", baseline=2.0, best_score=40.0, improvement=38.0, submissions=4), tmp_path)
    append_row(row("g2", baseline=2.0, best_score=30.0, improvement=28.0, submissions=2), tmp_path)
    append_row(row("g3", baseline=4.0, best_score=20.0, improvement=16.0, submissions=1), tmp_path)
    append_row(row("s1", agent="example_sft", best_score=50.0, improvement=50.0, submissions=5), tmp_path)
    append_row(unscored_row("s2", "failed", agent="example_sft"), tmp_path)
    append_row(
        row("q1", task="gsm8k", base_model="Qwen/Qwen2.5-1.5B", baseline=60.0, best_score=61.0), tmp_path
    )
    return tmp_path


def summary_json(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main(["results", "--summary", "--json", "--home", str(home), *args]) == 0
    data: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return data


def test_summary_groups_runs_with_counts_and_best_and_mean_scores(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = summary_json(home, capsys)
    assert [(g["task"], g["agent"], g["model"]) for g in data] == [
        ("arith", "example_sft", "builtin:tiny-qwen2"),  # best 50 before best 40
        ("arith", "example_grpo", "builtin:tiny-qwen2"),
        ("gsm8k", "example_grpo", "Qwen/Qwen2.5-1.5B"),
    ]
    sft, grpo, gsm8k = data
    assert grpo == {
        "task": "arith",
        "agent": "example_grpo",
        "model": "builtin:tiny-qwen2",
        "feedback": "test",
        "runs": 3,
        "succeeded": 3,
        "scored_runs": 3,
        "submissions": 7,
        "baseline": pytest.approx(8 / 3),
        "best_score": 40.0,
        "mean_best_score": 30.0,
        "best_improvement": 38.0,
        "mean_improvement": pytest.approx(82 / 3),
    }
    # A failed run counts as a run, not in the means.
    assert (sft["runs"], sft["succeeded"], sft["scored_runs"]) == (2, 1, 1)
    assert sft["mean_best_score"] == sft["best_score"] == 50.0 and sft["baseline"] == 0.0
    assert gsm8k["runs"] == 1 and gsm8k["best_score"] == 61.0
    # results.csv itself is unchanged: the summary is another view of its rows.
    assert results_path(home).read_text().splitlines()[0] == ",".join(COLUMNS)


def test_summary_follows_the_filters(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert [g["agent"] for g in summary_json(home, capsys, "--task", "arith", "--agent", "example_grpo")] == [
        "example_grpo"
    ]
    assert summary_json(home, capsys, "--task", "math") == []
    assert main(["results", "--summary", "--home", str(home), "--task", "math"]) == 0
    assert "no runs match --task math" in capsys.readouterr().err


def test_summary_as_csv_and_as_a_table(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", "--summary", "--csv", "--home", str(home)]) == 0
    records = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert tuple(records[0]) == SUMMARY_COLUMNS
    assert records[0]["agent"] == "example_sft" and records[0]["best_score"] == "50.0"
    assert records[1]["mean_best_score"] == "30.0" and records[1]["runs"] == "3"
    assert main(["results", "--summary", "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "AutoRL agent summary" in out
    grpo = next(line for line in out.splitlines() if "example_grpo" in line and "tiny" in line)
    assert [cell.strip() for cell in grpo.split("│")[4:13]] == [
        "test",
        "3",
        "3",
        "2.67",
        "40.00",
        "30.00",
        "+38.00",
        "+27.33",
        "7",
    ]


def test_summary_shows_agent_names_as_inert_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    append_row(
        row("r1", agent="[/bold]agent[link=https://evil.example]x\x1b]0;t\x07", base_model="m\u202e"),
        tmp_path,
    )
    assert main(["results", "--summary", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[/bold]agent[link=https://evil.example]x\\x1b]0;t\\x07" in out and "m\\u202e" in out
    assert "\x1b" not in out and "\u202e" not in out


def test_summary_and_compare_together_are_refused_with_the_fix(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", "--summary", "--compare", "g1", "g2", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert "give one of them" in err and "--task, --agent or --model" in err


def test_groups_without_a_score_come_last_in_their_task() -> None:
    def outcome(agent: str, best: float | None) -> RunOutcome:
        return RunOutcome(
            "t", agent, "m", "test", 1.0, best, None if best is None else best - 1.0, 1, best is not None
        )

    order = [s.agent for s in summarize([outcome("none", None), outcome("low", 3.0), outcome("high", 9.0)])]
    assert order == ["high", "low", "none"]
    assert summarize([]) == []


def test_sealed_runs_form_groups_of_their_own(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sealed run's best_score is its one final evaluation, a test run's a maximum over its test
    scores: the same agent's runs in the two modes are two groups, never one mean."""
    for run_id, final in (("v1", 24.0), ("v2", 18.0)):
        append_row(
            row(
                run_id,
                baseline=2.0,
                best_score=final,
                improvement=final - 2.0,
                submissions=6,
                feedback="sealed",
                final_score=final,
                final_low=final - 5.0,
                final_high=final + 5.0,
                final_p_value=0.01,
                selection="nominated",
                test_evaluations=1,
            ),
            home,
        )
    groups = {(g["agent"], g["feedback"]): g for g in summary_json(home, capsys, "--task", "arith")}
    assert set(groups) == {
        ("example_sft", "test"),
        ("example_grpo", "test"),
        ("example_grpo", "sealed"),
    }
    test, sealed = groups["example_grpo", "test"], groups["example_grpo", "sealed"]
    assert (test["runs"], test["best_score"], test["mean_best_score"]) == (3, 40.0, 30.0)
    assert (sealed["runs"], sealed["submissions"], sealed["baseline"]) == (2, 12, 2.0)
    assert (sealed["best_score"], sealed["mean_best_score"], sealed["mean_improvement"]) == (24.0, 21.0, 19.0)
    assert main(["results", "--summary", "--home", str(home), "--task", "arith"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "example_grpo" in line]
    assert sorted(line.split("│")[4].strip() for line in lines) == ["sealed", "test"]
