"""A check that could not be made whole reads as unverified, never as clean (docs/PROTOCOL.md).

The checks after an agent has ended have three outcomes: complete (``test_overlap`` a count, the
twin split scored), incomplete (a budget reached, files unread: ``test_overlap`` is still a count
when it found a question, a lower bound, else null) and not made (failed, never ran, the wait ran
out: null). Anything but complete is said, with its reason, as a note in the experiment's
``message`` (``test questions unverified: ...``, ``twin split unverified: ...``), which every surface
that shows the checks prints; the record in evaluator storage keeps the detail.

A reason can quote an agent's strings (a tensor name of its index, a path) of any length and
characters: a note keeps at most :data:`MAX_REASON_CHARS` of it, escaped. A message the platform
sends the grader or writes to an Experiment's status is at most :data:`MAX_MESSAGE_CHARS` long
(:func:`bounded`), its beginning and its notes kept, so that no agent string can make it too large
for the grader's request limit or the API server.
"""

from __future__ import annotations

from collections.abc import Iterable

from autorl.untrusted_text import printable_once, printable_within, shortened

#: The notes' openings: what could not be verified.
TEST_UNVERIFIED = "test questions unverified"
TWIN_UNVERIFIED = "twin split unverified"
_SEPARATOR = "; "
#: Characters of its reason, escapes included, a note keeps.
MAX_REASON_CHARS = 300
#: Characters of a message sent to the grader (under its limit on a body, even all in JSON escapes)
#: or written to an Experiment's status (the API server's limit on an object is about 1.5 MB).
MAX_MESSAGE_CHARS = 8_000


def note(what: str, reason: str) -> str:
    """One note (``what`` is :data:`TEST_UNVERIFIED` or :data:`TWIN_UNVERIFIED`), on one line: the
    reason escaped, in at most :data:`MAX_REASON_CHARS` characters."""
    # Collapsed first: a separator made of ';' and any white space would come back as one after.
    collapsed = " ".join(reason.split()).replace(_SEPARATOR, ", ")
    return f"{what}: {printable_within(collapsed, MAX_REASON_CHARS)}"


def with_notes(message: str | None, notes: Iterable[str]) -> str | None:
    """``message`` with each of ``notes`` it does not hold yet appended, :func:`bounded`."""
    new = [n for n in notes if n not in notes_in(message)]
    if not new:
        return None if message is None else bounded(message)
    return bounded(_SEPARATOR.join([*([message] if message else []), *new]))


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` in at most ``limit`` characters: where it is longer, its beginning cut to leave
    room for its notes, which are kept whole where they fit in the limit."""
    if len(message) <= limit:
        return message
    notes = list(dict.fromkeys(notes_in(message)))
    rest = _SEPARATOR.join(part for part in message.split(_SEPARATOR) if part not in notes)
    kept = _SEPARATOR.join(notes)
    room = max(limit - len(kept) - len(_SEPARATOR), limit // 4) if kept else limit
    return shortened(_SEPARATOR.join([*([shortened(rest, room)] if rest else []), *notes]), limit)


def printable_message(message: str) -> str:
    """``message`` with each of its parts escaped once (:func:`printable_once`): its notes, escaped
    at their source, stay as they are beside a part that quotes an agent's string raw."""
    return _SEPARATOR.join(printable_once(part) for part in message.split(_SEPARATOR))


def notes_in(message: str | None) -> list[str]:
    """The unverified notes a message holds, in order."""
    return [
        part
        for part in (message or "").split(_SEPARATOR)
        if part.startswith((f"{TEST_UNVERIFIED}: ", f"{TWIN_UNVERIFIED}: "))
    ]


def check_made(test_overlap: int | None, message: str | None) -> bool:
    """Whether the check of the agent's files was made (complete or not)."""
    return test_overlap is not None or any(n.startswith(TEST_UNVERIFIED) for n in notes_in(message))
