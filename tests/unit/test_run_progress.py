"""What `autorl run` prints while the agent works, in a log (no live panel)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from rich.console import Console

from autorl_local import progress as progress_module
from autorl_local.progress import Progress
from tests.support.answers import experiment_answer, submission_answer


def _progress() -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, soft_wrap=True, width=200)
    return Progress("run", console=console), out


def test_status_line_shows_time_left_latest_and_best_score(monkeypatch: pytest.MonkeyPatch) -> None:
    progress, out = _progress()
    with progress:
        progress.phase("agent", "example_grpo")
        progress.set_deadline(time.time() + 125)
        progress.update(experiment_answer(baseline_score=0.0), [])
        assert progress.status_line().startswith("phase=agent time left 2:0")
        assert "no score yet, best -, baseline 0.00" in progress.status_line()
        submissions = [
            submission_answer(2, score=61.5, model_path="output/sft-epoch-2"),
            submission_answer(3, score=48.0, model_path="output/grpo-final"),
            submission_answer(4, model_path="output/x"),
        ]
        progress.update(experiment_answer(baseline_score=0.0, best_score=61.5), submissions)
        line = progress.status_line()
        # The latest scored submission, not the best and not the one still queued.
        assert "latest score 48.00 (output/grpo-final), best 61.50, baseline 0.00" in line

        # Printed to the log once per interval while the agent runs, not on every poll.
        progress.tick()
        assert "time left" not in out.getvalue()
        monkeypatch.setattr(progress_module, "STATUS_INTERVAL_S", 0.0)
        progress.tick()
        assert out.getvalue().count("latest score 48.00") == 1
        progress.set_deadline(None)
        progress.tick()
        assert out.getvalue().count("latest score 48.00") == 1


def test_a_sealed_run_shows_validation_scores_against_the_validation_baseline_and_the_final_apart() -> None:
    progress, out = _progress()
    with progress:
        sealed = experiment_answer(
            baseline_score=10.0, validation_baseline_score=12.0, best_score=20.0, feedback="sealed"
        )
        submissions = [
            submission_answer(3, score=20.0, split="validation", model_path="output/a"),
            submission_answer(4, score=18.5, split="test", model_path="output/a"),
        ]
        progress.update(sealed, submissions)
        line = progress.status_line()
        assert "latest score 20.00 (output/a), best 20.00, baseline 12.00" in line
        assert "final evaluation on test: submission 4 output/a status=scored score=18.50" in out.getvalue()


def test_a_submission_is_named_by_the_agents_own_number() -> None:
    """The admin API's ids are global; the progress names what the agent's log and scores.json
    show for the same submission (a final on test has no agent number: its global id)."""
    progress, out = _progress()
    with progress:
        submissions = [
            submission_answer(7, score=20.0, split="validation", model_path="output/a", number=1),
            submission_answer(9, score=18.5, split="test", model_path="output/a"),
        ]
        progress.update(experiment_answer(feedback="sealed"), submissions)
    printed = out.getvalue()
    assert "submission 1 output/a status=scored" in printed and "submission 7" not in printed
    assert "final evaluation on test: submission 9 output/a" in printed


HOSTILE_PATH = (
    "output/[/bold][link=https://evil.example]x[/link]"
    "\x1b]0;pwned\x07\x1b[2J\u202e\nsubmission 99 status=scored"
)


@pytest.mark.parametrize("terminal", [False, True], ids=["log", "live panel"])
def test_agent_strings_are_shown_as_inert_text(terminal: bool) -> None:
    out = io.StringIO()
    console = Console(
        file=out, force_terminal=terminal, color_system="truecolor" if terminal else None, width=400
    )
    progress = Progress("run", console=console)
    with progress:
        progress.set_deadline(time.time() + 60)
        submissions = [
            submission_answer(2, score=100.0, model_path=HOSTILE_PATH),
            submission_answer(3, status="failed", model_path="output/y", error="bad\r\x9b31mfile [bold"),
        ]
        progress.update(experiment_answer(baseline_score=0.0), submissions)
        progress.note(progress.status_line())
        if terminal:
            progress._live.refresh()  # type: ignore[union-attr]
    shown = out.getvalue()
    escaped = (
        "output/[/bold][link=https://evil.example]x[/link]\\x1b]0;pwned\\x07\\x1b[2J\\u202e\\nsubmission 99"
    )
    assert escaped in shown
    if not terminal:  # the log's line of a failed submission; the panel shows no errors
        assert "status=failed error=bad\\r\\x9b31mfile [bold" in shown
    assert (
        "\x1b]0;" not in shown and "\x1b[2J" not in shown and "\x1b]8;" not in shown and "\u202e" not in shown
    )
    lines = shown.splitlines()
    assert not any(line.lstrip().startswith("submission 99") for line in lines)  # no forged line
    assert sum(escaped in line for line in lines) >= 2  # its own line (or table row) and the status line


def test_a_run_whose_agent_never_submitted_ends_with_a_warning_saying_so(tmp_path: Path) -> None:
    """Its status stays `completed` (the run did end as planned); the summary says why no score."""
    from autorl_local.experiment import nothing_scored_warning

    finished = experiment_answer(status="completed", baseline_score=0.0)
    warning = nothing_scored_warning(finished, "completed", tmp_path)
    assert warning is not None and warning.startswith("the agent submitted nothing")
    assert str(tmp_path / "agent.log") in warning and "--timeout" in warning
    failed_all = experiment_answer(total_submissions=2, failed_submissions=2)
    warning = nothing_scored_warning(failed_all, "completed", tmp_path)
    assert warning is not None and "none of the agent's 2 submissions was scored" in warning
    refused = experiment_answer(refused_submissions=1)
    warning = nothing_scored_warning(refused, "completed", tmp_path)
    assert warning is not None and warning.startswith("every submit of the agent was refused")
    assert (
        nothing_scored_warning(experiment_answer(submissions=1, total_submissions=1), "completed", tmp_path)
        is None
    )
    assert nothing_scored_warning(finished, "failed", tmp_path) is None  # a failure has its own note


def test_a_loaded_machine_is_named_with_its_load_and_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from autorl_local import progress

    monkeypatch.setattr(progress.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(progress.os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    assert progress.load_note() is None
    monkeypatch.setattr(progress.os, "getloadavg", lambda: (4.25, 3.0, 2.0))
    note = progress.load_note()
    assert note is not None and "load average 4.2 on 2 cores" in note and "less CPU" in note
