"""A check that could not be made whole reads as unverified, never as clean (docs/PROTOCOL.md).

The checks after an agent has ended have three outcomes: complete (``test_overlap`` a count, the
twin split scored), incomplete (a budget reached, files unread: ``test_overlap`` is still a count
when it found a question, a lower bound, else null) and not made (failed, never ran, the wait ran
out: null). Anything but complete is said, with its reason, as a note in the experiment's
``message`` (``test questions unverified: ...``, ``twin split unverified: ...``), which every surface
that shows the checks prints; the record in evaluator storage keeps the detail.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The notes' openings: what could not be verified.
TEST_UNVERIFIED = "test questions unverified"
TWIN_UNVERIFIED = "twin split unverified"
_SEPARATOR = "; "


def note(what: str, reason: str) -> str:
    """One note (``what`` is :data:`TEST_UNVERIFIED` or :data:`TWIN_UNVERIFIED`), on one line."""
    return f"{what}: {' '.join(reason.replace(_SEPARATOR, ', ').split())}"


def with_notes(message: str | None, notes: Iterable[str]) -> str | None:
    """``message`` with each of ``notes`` it does not hold yet appended."""
    new = [n for n in notes if n not in notes_in(message)]
    if not new:
        return message
    return _SEPARATOR.join([*([message] if message else []), *new])


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
