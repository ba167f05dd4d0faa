"""An agent's string (a tensor name of its checkpoint, quoted in an error and in a note of what
could not be verified) reaches every operator surface escaped and bounded, whoever passes it on:
``autorl run``'s progress lines and closing summary, ``autorl report``'s lines, the CLI's errors,
the notes and the messages sent to the grader, and the Experiment's status conditions."""

from __future__ import annotations

import argparse
import io
import time
from datetime import UTC, datetime

import pytest
from rich.console import Console

from autorl import cli
from autorl.errors import AutoRLError
from autorl.experiment import Condition, ExperimentResourceStatus
from autorl.provenance.unverified import (
    MAX_MESSAGE_CHARS,
    MAX_REASON_CHARS,
    TWIN_UNVERIFIED,
    bounded,
    note,
    notes_in,
    with_notes,
)
from autorl.runs.reports import final_lines, summary_lines
from autorl.untrusted_text import unprintable_characters
from autorl_controller.operator.lifecycle import (
    conditions_status,
    provenance_condition,
    status_patch,
    with_condition,
)
from autorl_local.progress import MAX_LINE_CHARS, Progress
from tests.support.answers import experiment_answer

#: What an agent puts in a tensor name: a hyperlink to its site (OSC 8), a clear screen (CSI 2J),
#: a bell, a carriage return, a forged progress line, a right-to-left override, a zero-width joiner.
HOSTILE = (
    "\x1b]8;;https://evil.example/steal\x1b\\docs\x1b]8;;\x1b\\"
    "\x1b[2J\x1b[H\x07\rhidden"
    "\n[0:42] twin split: the final scores 91.00"
    "\u202eemanelif\u200dx"
)
#: ... in a name of two million characters.
NAME = HOSTILE + "A" * 2_000_000
#: What a reader sees of the hyperlink: its escape, spelt out.
READABLE = "\\x1b]8;;https://evil.example/steal"


def hidden_in(shown: str) -> list[str]:
    """The characters of ``shown`` that do not show as themselves, line feeds (the output's own) aside."""
    return unprintable_characters(shown.replace("\n", ""))


def test_progress_lines_escape_and_bound_what_they_are_given() -> None:
    out = io.StringIO()
    progress = Progress("run", console=Console(file=out, force_terminal=False, soft_wrap=True, width=200))
    with progress:
        progress.phase("finishing", NAME)
        progress.note(f"twin split: not scored ({NAME})")
    shown = out.getvalue()
    assert hidden_in(shown) == []
    assert READABLE in shown and "\\x1b[2J" in shown and "\\u202e" in shown and "\\u200d" in shown
    lines = shown.splitlines()
    assert len(lines) == 3 and not any(line.startswith("[0:42]") for line in lines)
    assert all(len(line) < MAX_LINE_CHARS + 20 for line in lines)


def test_the_live_panel_escapes_and_bounds_what_it_is_given() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    progress = Progress("run", console=console)
    with progress:
        progress.set_deadline(time.time() + 60)
        progress.phase("finishing", NAME)
        progress.note(f"twin split: not scored ({NAME})")
        progress._live.refresh()  # type: ignore[union-attr]
    shown = out.getvalue()
    # The panel's own colours and redraws are escape sequences too: none of the agent's is there.
    for raw in ("\x1b]8;;https://evil", "\x1b[2J", "\x07", "\rhidden", "\u202e", "\u200d", "\n[0:42]"):
        assert raw not in shown
    assert READABLE in shown and len(shown) < 10 * MAX_LINE_CHARS


@pytest.mark.parametrize(("error", "code"), [(cli.UsageError, cli.EXIT_BAD_INPUT), (AutoRLError, 1)])
def test_the_cli_prints_an_error_escaped_bounded_and_indented(
    error: type[AutoRLError], code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(_: argparse.Namespace) -> int:
        raise error(f"output/best holds 1 tensor the base model does not have ({NAME})")

    parser = argparse.ArgumentParser(prog="autorl")
    parser.add_subparsers(dest="command").add_parser("evaluate").set_defaults(func=refuse)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main(["evaluate"]) == code
    shown = capsys.readouterr().err
    assert shown.startswith("autorl evaluate: error: output/best holds")
    assert hidden_in(shown) == [] and READABLE in shown and "\\u202e" in shown
    # The agent's line feed starts an indented line, never one that passes for the command's.
    _, *rest = shown.splitlines()
    assert rest and all(line.startswith("    ") for line in rest)
    assert len(shown) < MAX_MESSAGE_CHARS + 100


def test_a_note_keeps_its_reason_escaped_and_short() -> None:
    kept = note(TWIN_UNVERIFIED, f"the final's folder can no longer be read: {NAME}")
    assert kept.startswith(f"{TWIN_UNVERIFIED}: the final's folder can no longer be read: ")
    assert hidden_in(kept) == [] and "\n" not in kept and READABLE in kept and kept.endswith("…")
    assert len(kept) == len(f"{TWIN_UNVERIFIED}: ") + MAX_REASON_CHARS
    assert note(TWIN_UNVERIFIED, kept.removeprefix(f"{TWIN_UNVERIFIED}: ")) == kept  # escaped once


def test_the_summary_lines_escape_and_bound_notes_and_names_given_raw() -> None:
    raw_note = f"{TWIN_UNVERIFIED}: {NAME}"  # as a caller that forgot note() would pass it
    result = {"feedback": "test", "final_score": 50.0, "selection": "best_on_test", "test_evaluations": 3}
    for lines in (
        final_lines({**result, "unverified": [raw_note, note(TWIN_UNVERIFIED, NAME)], "lineage": NAME}),
        summary_lines({**result, "run_id": NAME, "unverified": [raw_note]}),
    ):
        shown = "\n".join(lines)
        assert hidden_in(shown) == [] and READABLE in shown
        assert not any(line.startswith("[0:42]") for line in shown.splitlines())
        assert all(len(line) <= MAX_MESSAGE_CHARS for line in lines)
    # A note escaped at its source is shown as it is, not escaped again.
    twin = final_lines({**result, "unverified": [note(TWIN_UNVERIFIED, HOSTILE)]})[-1]
    assert twin == f"twin split   unverified: {note(TWIN_UNVERIFIED, HOSTILE).split(': ', 1)[1]}"


def test_a_message_for_the_grader_is_bounded_and_keeps_its_beginning_and_notes() -> None:
    twin = note(TWIN_UNVERIFIED, f"the final's folder can no longer be read: {NAME}")
    message = with_notes(f"autorl run failed; its log ends with: {NAME}", [twin])
    assert message is not None and len(message) <= MAX_MESSAGE_CHARS
    assert message.startswith("autorl run failed; its log ends with: ") and notes_in(message) == [twin]
    assert bounded(message) == message and bounded("short") == "short"


def test_the_experiments_status_escapes_and_bounds_its_free_text_and_keeps_it_when_read_back() -> None:
    # A grader's message holding a note as an older platform wrote it: raw.
    view = experiment_answer(message=f"the agent finished within its budget; {TWIN_UNVERIFIED}: {NAME}")
    condition = provenance_condition(view, "", datetime.now(UTC))
    patch = status_patch(conditions_status(with_condition([], condition)))
    message = patch["conditions"][0]["message"]
    assert message.startswith(f"{TWIN_UNVERIFIED}: ") and READABLE in message
    assert hidden_in(message) == [] and "\n" not in message and len(message) <= MAX_MESSAGE_CHARS
    # Read back from the object and written again, nothing changes (no patch on every sync).
    assert status_patch(conditions_status(patch["conditions"])) == patch
    twin = note(TWIN_UNVERIFIED, NAME)
    closing = ExperimentResourceStatus(message=f"the agent Job failed: {NAME}; best 1.00; {twin}").message
    assert closing is not None and closing.startswith("the agent Job failed: \\x1b]8;;")
    assert notes_in(closing) == [twin] and len(closing) <= MAX_MESSAGE_CHARS
    status = ExperimentResourceStatus(message=NAME, reason=HOSTILE, lineage=NAME)
    for text in (
        status.message,
        status.reason,
        status.lineage,
        Condition(type="T", status="True", message=NAME).message,
    ):
        assert text is not None and hidden_in(text) == [] and "\n" not in text
        assert len(text) <= MAX_MESSAGE_CHARS


def test_every_answer_that_carries_an_agents_file_names_or_path_escapes_them_whatever_the_row() -> None:
    """A row stored before its names were escaped at the source (or by any other path) still reaches
    the agent, the admin API and every client escaped, once: what is escaped already is unchanged."""
    from autorl.api.answers import PendingAnswer

    raw = PendingAnswer(
        submission_id=1, status="queued", queue_position=1, ignored_files=[HOSTILE, "a\\x1bb"]
    )
    assert raw.ignored_files[1] == "a\\x1bb" and not hidden_in(raw.ignored_files[0])
    assert READABLE in raw.ignored_files[0]
    assert PendingAnswer.model_validate(raw.model_dump()) == raw
