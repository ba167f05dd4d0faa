"""What `autorl results` prints: a table that fits 100 columns with every run id whole and long
agents and models folded, and `--wide` with every column, each value on one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.cells import cell_len

from autorl.cli import main
from autorl.runs.results import append_row
from tests.unit.test_results import row

#: Run ids as `autorl run` names them, and an experiment's name as a cluster's operator writes one.
LONG_IDS = (
    "20261205-231500-gsm8k-4f1c2a",
    "20261205-234512-gsm8k-9e0b7d",
    "grpo-qwen2-5-1-5b-instruct-3",
)
AGENT_PATH = "/home/researcher/projects/agents/grpo_with_curriculum/agent.py"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    append_row(
        row(LONG_IDS[0], task="gsm8k", base_model=MODEL, baseline=62.5, best_score=68.4, improvement=5.9),
        tmp_path,
    )
    append_row(
        row(LONG_IDS[1], task="gsm8k", agent=AGENT_PATH, base_model=MODEL, status="failed"),
        tmp_path,
    )
    append_row(
        # Nothing scored: no numbers to show.
        row(
            LONG_IDS[2],
            agent="claude-code",
            baseline=None,
            best_score=None,
            improvement=None,
            status="interrupted",
        ),
        tmp_path,
    )
    return tmp_path


def table(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["results", "--home", str(home), *args]) == 0
    return [line.rstrip() for line in capsys.readouterr().out.splitlines()]


def column(lines: list[str], name: str, run_id: str) -> str:
    """``name``'s cell in ``run_id``'s row, its folded lines joined: cut at the header's columns."""
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    names = lines[header].split()
    starts = [lines[header].index(n) for n in names]
    first = next(i for i, line in enumerate(lines) if line.startswith(run_id + " "))
    at = names.index(name)
    end = starts[at + 1] if at + 1 < len(starts) else None
    parts = []
    for line in lines[first:]:
        if line.strip() and line[: starts[1]].strip() not in ("", run_id):
            break  # the next row
        if not line.strip() or line.startswith("scores on"):
            break
        parts.append(line[starts[at] : end].strip())
    return "".join(parts)


def test_the_table_fits_100_columns_with_each_run_id_whole(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = table(home, capsys)
    assert max(cell_len(line) for line in lines) <= 100
    assert lines[1].split() == ["run", "task", "agent", "model", "baseline", "→", "best", "impr", "status"]
    for run_id in LONG_IDS:
        assert any(line.startswith(run_id + " ") for line in lines), run_id
    # Long agents, tasks and models are folded onto more lines, never cut.
    assert column(lines, "agent", LONG_IDS[1]) == AGENT_PATH
    assert column(lines, "task", LONG_IDS[1]) == "gsm8k"
    assert column(lines, "model", LONG_IDS[0]) == MODEL
    first = next(line for line in lines if line.startswith(LONG_IDS[0]))
    assert "62.50 → 68.40" in first and "+5.90" in first and first.rstrip().endswith("completed")
    unscored = next(line for line in lines if line.startswith(LONG_IDS[2]))
    assert "- → -" in unscored and unscored.rstrip().endswith("interrupted")
    assert lines[-1].startswith("scores on the test split") and lines[-1].endswith("every column: --wide")


def test_wide_shows_every_column_with_whole_values(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = table(home, capsys, "--wide")
    header = [cell.strip() for cell in lines[2].split("┃")[1:-1]]
    assert header == [
        "run_id",
        "task",
        "agent",
        "base_model",
        "baseline",
        "best_score",
        "improvement",
        "best 95 %",
        "feedback",
        "final",
        "final 95 %",
        "final p",
        "selection",
        "test evals",
        "submissions",
        "duration_s",
        "status",
        "note",
    ]
    assert any(AGENT_PATH in line and LONG_IDS[1] in line for line in lines)
    # --json and --csv are the contract, whatever the table shows.
    assert main(["results", "--home", str(home), "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == list(LONG_IDS)


def test_with_a_cluster_name_task_agent_and_model_go_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cluster's experiment is named NAMESPACE.NAME.UID: too long to leave task, agent and
    model room beside it, so they go under it, folded in the run's column."""
    names = (
        "autorl.gsm8k-grpo.1f0c3e2a-7b5d-4c1e-9a8b-3d2e1f0a9b8c",
        "autorl.gsm8k-sft.2a9d0c11-0e4f-4b8a-8f21-77c1d3e4a5b6",
    )
    append_row(row(names[0], task="gsm8k", base_model=MODEL), tmp_path)
    append_row(row(names[1], task="gsm8k", agent=AGENT_PATH, base_model=MODEL, status="failed"), tmp_path)
    lines = table(tmp_path, capsys)
    assert max(cell_len(line) for line in lines) <= 100
    assert lines[1] == "run" and lines[2].startswith("task · agent · model ")
    assert lines[2].split()[-4:] == ["→", "best", "impr", "status"]
    first = lines.index(next(line for line in lines if line.startswith(names[0] + " ")))
    assert "0.00 → 12.50  +12.50  completed" in lines[first]
    assert lines[first + 1] == f"gsm8k · example_grpo · {MODEL}"
    second = lines.index(next(line for line in lines if line.startswith(names[1] + " ")))
    assert lines[first + 2] == "" and second == first + 3  # a blank line between rows
    caption = next(i for i, line in enumerate(lines) if line.startswith("scores on"))
    under = lines[second + 1 : caption]  # wrapped at its spaces
    assert " ".join(under) == f"gsm8k · {AGENT_PATH} · {MODEL}"
    # A name longer than the width is still printed whole, on a wider table.
    longest = "autorl." + "-".join(["grpo-curriculum-qwen2-5"] * 4)
    append_row(row(longest), tmp_path)
    assert any(line.startswith(longest + " ") for line in table(tmp_path, capsys))
