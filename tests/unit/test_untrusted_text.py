"""The one renderer of agent-controlled strings: hostile strings come out as visible, inert text."""

from __future__ import annotations

import io
import logging
import re
import sys
import unicodedata

import pytest
from pydantic import TypeAdapter
from rich.console import Console
from rich.table import Table

from autorl.api.request_bodies import SubmitRequest
from autorl.errors import CheckpointError
from autorl.untrusted_text import (
    Printable,
    PrintableArgs,
    PrintableFormatter,
    printable,
    printable_once,
    printable_within,
    rich_text,
    unprintable_characters,
)

#: (what an agent writes, what an operator sees): each would drive a terminal or forge what it shows.
HOSTILE = [
    ("out\x1b[2J\x1b[H", "out\\x1b[2J\\x1b[H"),  # clear screen, cursor home
    ("\x1b]0;pwned\x07run", "\\x1b]0;pwned\\x07run"),  # window title (OSC 0)
    (
        "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",
        "\\x1b]8;;https://evil.example\\x1b\\\\click\\x1b]8;;\\x1b\\\\",
    ),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # colours
    ("\x1b[5A\x1b[2K", "\\x1b[5A\\x1b[2K"),  # cursor up, erase line
    ("ok\rsubmission 99 score=100.00", "ok\\rsubmission 99 score=100.00"),
    (
        "a\n[0:05] submission 99 output/x status=scored score=100.00",
        "a\\n[0:05] submission 99 output/x status=scored score=100.00",
    ),
    ("abc\b\b\bxyz", "abc\\x08\\x08\\x08xyz"),  # backspaces overwrite
    ("\x9b2J", "\\x9b2J"),  # C1 CSI
    ("\x7f\x00\x85", "\\x7f\\x00\\x85"),  # DEL, NUL, NEL
    ("output/\u202egnp.exe", "output/\\u202egnp.exe"),  # right-to-left override
    ("\u2066x\u2069\u200e\u061c", "\\u2066x\\u2069\\u200e\\u061c"),  # bidi isolates and marks
    ("a\u200bb\u200dc\ufeffd\u2060e", "a\\u200bb\\u200dc\\ufeffd\\u2060e"),  # zero-width characters
    ("line\u2028sep\u2029para", "line\\u2028sep\\u2029para"),  # line and paragraph separators
    ("tab\there\u00a0nbsp", "tab\\there\\xa0nbsp"),
    ("tag\U000e0041s", "tag\\U000e0041s"),  # an invisible tag character
    ("a\\x1b", "a\\\\x1b"),  # a written escape stays distinct from the character it names
    # Printable to Python, yet showing nothing of their own: fillers, selectors, overlays.
    ("output/v1\u034f", "output/v1\\u034f"),  # combining grapheme joiner
    ("v\u180b1\u3164\ufe0f", "v\\u180b1\\u3164\\ufe0f"),  # Mongolian selector, Hangul filler, VS16
    ("x\u17b4\u115f\u1160\uffa0\U000e0100\u2800", "x\\u17b4\\u115f\\u1160\\uffa0\\U000e0100\\u2800"),
    ("best" + "\u0336" * 3, "best\\u0336\\u0336\\u0336"),  # a strike-through drawn over the name
    ("[link=https://evil.example]x[/link]", "[link=https://evil.example]x[/link]"),
    ("[/bold]", "[/bold]"),
    ("[bold", "[bold"),
    (":smile: output/ünï 日本", ":smile: output/ünï 日本"),
]


@pytest.mark.parametrize(("hostile", "shown"), HOSTILE)
def test_every_hidden_character_is_shown_escaped(hostile: str, shown: str) -> None:
    assert printable(hostile) == shown
    assert shown.isprintable()


@pytest.mark.parametrize(("hostile", "shown"), HOSTILE)
def test_rich_shows_the_escaped_text_as_written(hostile: str, shown: str) -> None:
    # Escaped once: a text that holds no hidden character (one escaped already) shows as it is.
    shown = shown if unprintable_characters(hostile) else hostile
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=500)
    table = Table("checkpoint")
    table.add_row(rich_text(hostile))
    console.print(rich_text(hostile))  # an unbalanced tag would raise MarkupError as markup
    console.print(table)
    lines = out.getvalue().splitlines()
    # Markup is not interpreted, emoji codes are not replaced, and no hyperlink is made.
    assert shown in lines[0] and "\x1b]8;" not in out.getvalue()
    assert any(shown in line for line in lines[1:])


def test_multiline_keeps_lines_and_escapes_the_rest() -> None:
    log = "step 1\r\nstep 2\t\x1b[32mok\x1b[0m\n10%\r20%\u202e"
    assert printable(log, multiline=True) == "step 1\nstep 2\t\\x1b[32mok\\x1b[0m\n10%\\r20%\\u202e"


def test_unprintable_characters_names_each_once() -> None:
    assert unprintable_characters("a\x1b[1m\x1b\n\u202eb\\c") == ["\\x1b", "\\n", "\\u202e"]
    assert unprintable_characters("output/step-100 é") == []


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("bad\x1b[2Jname\nforged")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("autorl.test", logging.WARNING, __file__, 1, message, args, info)


def test_log_lines_stay_one_line_whatever_their_arguments_hold() -> None:
    formatter = PrintableFormatter("%(levelname)s %(message)s")
    line = formatter.format(_record("event=evaluation_failed error=%s", "x\n2026 INFO forged\x1b]0;t\x07"))
    assert line == "WARNING event=evaluation_failed error=x\\n2026 INFO forged\\x1b]0;t\\x07"
    with_trace = formatter.format(_record("event=crashed", exc=True)).splitlines()
    # A traceback keeps its lines (the exception's own too), with everything else escaped.
    assert with_trace[0] == "WARNING event=crashed" and with_trace[-2:] == [
        "ValueError: bad\\x1b[2Jname",
        "forged",
    ]

    record = _record("event=x path=%s n=%d", "a\r\x9bb", 3)
    assert PrintableArgs().filter(record) and record.getMessage() == "event=x path=a\\r\\x9bb n=3"


#: (a name, the name it is drawn as): Unicode's canonical equivalents, drawn alike by definition.
LOOKALIKES = [
    ("output/\u212aeep", "output/Keep"),  # KELVIN SIGN, a canonical singleton of K
    ("output/\u212bngstrom", "output/\u00c5ngstrom"),  # ANGSTROM SIGN, of Å
    ("output/step\u037e1", "output/step;1"),  # GREEK QUESTION MARK, of ';'
    ("output/a\u0387b", "output/a\u00b7b"),  # GREEK ANO TELEIA, of the middle dot
    ("output/\uf900", "output/\u8c48"),  # a CJK compatibility ideograph
    ("output/\uac00\u11a8", "output/\uac01"),  # 가 + a conjoining final consonant: 각
    ("output/\u1100\u1161\u11a8", "output/\uac01"),  # conjoining initial, vowel and final: 각
    ("output/\u0b47\u0b3e", "output/\u0b4b"),  # a spacing vowel sign that completes the one before
]


@pytest.mark.parametrize(("name", "drawn_as"), LOOKALIKES)
def test_a_lookalike_character_is_shown_escaped(name: str, drawn_as: str) -> None:
    assert unicodedata.normalize("NFC", name) == drawn_as != name
    shown = printable(name)
    assert shown != name and "\\u" in shown
    # What is shown is its own NFC form, and names what it was given: no reader takes it for another.
    assert unicodedata.normalize("NFC", shown) == shown and shown != printable(drawn_as)
    assert unprintable_characters(name) and printable_once(name) == shown
    assert rich_text(name).plain == shown
    assert TypeAdapter(Printable).validate_python(name) == shown
    assert printable(f"x\t{name}", multiline=True) == f"x\t{shown}"
    assert printable_within(name, 200) == shown and printable_within(name + "z" * 300, 60).startswith(shown)
    # The grader refuses such a model_path as it refuses one that does not print.
    with pytest.raises(CheckpointError, match=re.escape(unprintable_characters(name)[0])):
        SubmitRequest(model_path=name)
    # Escaped once: the shown text, given again, is kept as it is.
    assert unprintable_characters(shown) == [] and printable_once(shown) == shown


def test_two_folders_drawn_alike_are_shown_as_two_names() -> None:
    honest, lookalike = "output/Keep", "output/\u212aeep"
    assert printable(honest) == honest
    assert printable(lookalike) == "output/\\u212aeep" != printable(honest)
    assert rich_text(lookalike).plain != rich_text(honest).plain


@pytest.mark.parametrize(
    "name",
    [
        "output/caf\u00e9-\u00fcber",  # precomposed Latin letters
        "output/\uac01-\ud55c\uae00",  # precomposed Hangul syllables
        "output/\u65e5\u672c\u8a9e-\u6a21\u578b",  # CJK ideographs
        "output/\u0b4b\u0915\u093e",  # a precomposed vowel sign; a spacing one that composes with nothing
        "output/\u0391\u03b8\u03ae\u03bd\u03b1",  # Greek with a precomposed tonos
    ],
)
def test_a_name_drawn_as_itself_is_shown_unchanged(name: str) -> None:
    assert unicodedata.normalize("NFC", name) == name
    assert printable(name) == name and unprintable_characters(name) == []
    assert rich_text(name).plain == name and printable_within(name, 200) == name
    assert TypeAdapter(Printable).validate_python(name) == name


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("output/\u041aeep", "\\u041a"),  # CYRILLIC CAPITAL KA, drawn as K
        ("output/\uff2beep", "\\uff2b"),  # FULLWIDTH K
        ("output\u2215Keep", "\\u2215"),  # DIVISION SLASH, drawn as a folder's slash
        ("output/caf\u00e9", "\\u00e9"),  # even a letter drawn as itself: the rule is one
    ],
)
def test_a_model_path_outside_ascii_is_refused_naming_the_fix(name: str, named: str) -> None:
    """A checkpoint's name is what operators tell submissions apart by; outside ASCII a name can
    look like another whatever is escaped, so a submit names the characters, escaped, and the fix."""
    with pytest.raises(CheckpointError) as refused:
        SubmitRequest(model_path=name)
    message = str(refused.value)
    assert named in message and "ASCII" in message and "output/step-100" in message
    assert message.isascii()
    assert SubmitRequest(model_path="output/Keep-1.0_final").model_path == "output/Keep-1.0_final"
    # The platform's own folders, whatever their names, before an absolute path's output folder.
    home = "/home/jos\u00e9/.autorl/runs/r1/workspace/output"
    assert SubmitRequest(model_path=f"{home}/Keep").model_path == f"{home}/Keep"
    with pytest.raises(CheckpointError, match=re.escape(named)):
        SubmitRequest(model_path=f"{home}/{name.removeprefix('output/')}")


def test_nothing_shown_is_drawn_as_another_and_escaping_again_changes_nothing() -> None:
    """Every character kept, after any other: what is shown is its own NFC form, so that no reader
    can take it for another; and it holds nothing more to escape (no kept character composes with
    the last character of an escape before it)."""
    kept = [chr(code) for code in range(0x80, 0x30000) if not unprintable_characters(chr(code))]
    followers = [
        chr(code) for code in (*range(0x1100, 0x1200), *range(0xD7B0, 0xD800), *range(0x0900, 0x0E00))
    ]
    for before in ["a", "\\", "\x1b", "\u212a", "\u0301", "\uac00", "\u1100", "\u0b47", "\u0bc6", "\u0d46"]:
        text = before + "".join(f"{char}{before}" for char in followers)
        shown = printable(text)
        assert unicodedata.normalize("NFC", shown) == shown, before
        assert unprintable_characters(shown) == [] and printable_once(shown) == shown
    singles = "".join(f"{char}x" for char in kept)
    assert unicodedata.normalize("NFC", printable(singles)) == printable(singles)
