"""Strings an agent controls (checkpoint paths, error messages, file names, its log), made safe to show.

Every operator surface (``autorl run``'s progress and summary, ``autorl results``, logs, the
dashboard, Kubernetes Events and status messages) shows such a string only through
:func:`printable`: a character that is not plainly visible (C0 and C1 controls, DEL, bidi
overrides, zero-width and other format characters, line and paragraph separators, unusual spaces,
unassigned code points, default-ignorable fillers and selectors, combining marks, and a character
drawn as another: one that Unicode's canonical composition (NFC) changes alone, such as the Kelvin
sign drawn as K, or composes with the one before it, such as a conjoining Hangul jamo) is written as
its escape (``\\x1b``, ``\\n``, ``\\u202e``), and a backslash
as ``\\\\``, so that what the operator sees spells the string exactly and can neither drive the
terminal (titles, colours, cursor moves, hyperlinks) nor forge a line. Rich output takes the result
as a :class:`rich.text.Text`, never as markup, so brackets in a name stay brackets.
"""

from __future__ import annotations

import functools
import logging
import sys
import unicodedata
from collections.abc import Callable, Iterator
from typing import Annotated

from pydantic import AfterValidator
from rich.text import Text

#: Short escapes, as Python writes them; every other hidden character gets its code point.
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


#: Characters that are printable to Python yet show nothing, or nothing of their own: Unicode's
#: default-ignorable code points outside the "Other" category (Hangul fillers, variation
#: selectors, the combining grapheme joiner, Khmer inherent vowels, Mongolian selectors) and the
#: blank braille pattern. Each could make one name look like another.
_BLANK_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
#: Categories of characters that show nothing of their own: format characters (zero-width spaces
#: and joiners, bidi controls, the byte-order mark, soft hyphens) and combining marks, drawn over
#: the character before them (strike-throughs, overlays, stacks).
_NOTHING_CATEGORIES = frozenset({"Cf", "Mn", "Me"})


def shows_nothing(char: str) -> bool:
    """Whether ``char`` shows nothing, or nothing of its own: a format character, a combining mark
    or one of :data:`_BLANK_RANGES`. Every operator surface escapes it (:func:`printable`); the
    overlap scan removes it from the words it compares (:func:`autorl.provenance.overlap.normalize`)."""
    code = ord(char)
    return unicodedata.category(char) in _NOTHING_CATEGORIES or any(
        low <= code <= high for low, high in _BLANK_RANGES
    )


@functools.cache
def code_points_showing_nothing() -> frozenset[int]:
    """Every code point that :func:`shows_nothing` holds (computed once)."""
    categories = _NOTHING_CATEGORIES
    by_category = (c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in categories)
    return frozenset((*by_category, *(c for low, high in _BLANK_RANGES for c in range(low, high + 1))))


def _drawn_as_another(char: str, before: str) -> bool:
    """Whether ``char``, after ``before`` (the character before it, if any), is drawn as something
    else: Unicode's canonical composition (NFC) changes it alone (a canonical singleton: the Kelvin
    sign drawn as K, the Angstrom sign as Å, the Greek question mark as ';', a CJK compatibility
    ideograph) or composes it with ``before`` (a conjoining Hangul jamo after a syllable, 가 + ᆨ
    drawn as 각; a vowel sign that completes another). A name holding one looks like its NFC form,
    another name; a precomposed letter (é, 각, ü) is its own NFC form and is drawn as itself."""
    if not unicodedata.is_normalized("NFC", char):
        return True
    composes = not unicodedata.is_normalized("NFC", before + char)
    return composes and unicodedata.is_normalized("NFC", before)


def _unprintable(char: str, before: str) -> bool:
    # str.isprintable is false exactly for Unicode's "Other" (Cc, Cf, Cs, Co, Cn) and "Separator"
    # (Zl, Zp, Zs) categories, the ASCII space excepted; the rest are printable characters that
    # still show nothing of their own, or are drawn as another (no ASCII character is either, nor
    # composes with one before it).
    if not char.isprintable():
        return True
    return not char.isascii() and (shows_nothing(char) or _drawn_as_another(char, before))


def _characters(text: str) -> Iterator[tuple[str, bool]]:
    """Each character of ``text`` and whether it does not show as itself where it stands (the one
    definition every function here shows and checks by)."""
    before = ""
    for char in text:
        yield char, _unprintable(char, before)
        before = char


def _printable_line(line: str) -> str:
    if line.isascii() and line.isprintable() and "\\" not in line:
        return line  # the common case, without a per-character pass
    return "".join(_escape(char) if hidden or char == "\\" else char for char, hidden in _characters(line))


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` with every character that does not show as itself escaped.

    ``multiline`` (a log shown as a block) keeps line feeds and tabs as they are, and a CR LF pair
    as a line feed; a lone carriage return is still escaped, since it would overwrite what a
    terminal shows. Otherwise the result is always one line.
    """
    if not multiline:
        return _printable_line(text)
    lines = text.replace("\r\n", "\n").split("\n")
    return "\n".join("\t".join(_printable_line(part) for part in line.split("\t")) for line in lines)


#: Ends a text that was cut.
CUT = "…"


def shortened(text: str, most: int, escape: Callable[[str], str] = str) -> str:
    """``text`` as ``escape`` writes it (character by character, each as it is written after the
    one before it), in at most ``most`` characters: a longer one is cut between two characters,
    never inside an escape, and ends with :data:`CUT`. Reads at most ``most + 1`` characters of
    ``text``, however long it is."""
    room = most - len(CUT)
    cut = None
    length = 0
    before = ""
    for index, char in enumerate(text):
        length += len(escape(before + char)) - len(escape(before))
        before = char
        if cut is None and length > room:
            cut = index
        if length > most:
            return escape(text[:cut]) + CUT
    return escape(text)


def printable_once(text: str) -> str:
    """``text`` as :func:`printable` shows it where it holds a character that does not show as
    itself, else as it is: a text escaped at its source (a note, a name quoted in an error) is not
    escaped a second time, and escaping it again changes nothing."""
    return printable(text) if unprintable_characters(text) else text


#: A string field that can hold an agent's string (a path, a file name, an error quoting one), as
#: every answer carries it: escaped once (:func:`printable_once`), whatever the row it came from.
Printable = Annotated[str, AfterValidator(printable_once)]


def printable_within(text: str, most: int) -> str:
    """``text`` escaped once (:func:`printable_once`) in at most ``most`` characters
    (:func:`shortened`); given its own result, it answers it unchanged."""
    return shortened(text, most, printable if unprintable_characters(text) else str)


def unprintable_characters(text: str) -> list[str]:
    """The escapes of the characters in ``text`` that do not show as themselves, each once, in order
    (a backslash shows as itself and is not one of them)."""
    found = dict.fromkeys(_escape(char) for char, hidden in _characters(text) if hidden)
    return list(found)


def rich_text(text: str, style: str = "", *, multiline: bool = False) -> Text:
    """``text`` escaped once (:func:`printable_once`; a block of lines: :func:`printable`), as a
    rich ``Text``: shown as written, never parsed as markup or emoji codes. Escaped once, because
    what it is given often is already: an answer's fields, a note."""
    return Text(printable(text, multiline=True) if multiline else printable_once(text), style=style)


class PrintableFormatter(logging.Formatter):
    """A log formatter that keeps a record on one line whatever its arguments hold.

    A log line's message often carries an agent's string (a path, an error); escaped, it cannot
    forge another line or drive the terminal of whoever tails the log. A traceback keeps its lines,
    with everything else in it escaped.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return printable(super().formatException(ei), multiline=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), multiline=True)


class PrintableArgs(logging.Filter):
    """Escapes a record's string arguments (where a log line carries an agent's strings), for a
    logger whose handlers format with a formatter of their own (uvicorn's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(printable(a) if isinstance(a, str) else a for a in record.args)
        return True


#: The services' log line: time, level, logger, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def log_printable_lines(level: int, fmt: str = LOG_FORMAT) -> None:
    """Log to stderr (as :func:`logging.basicConfig`) through :class:`PrintableFormatter`."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
