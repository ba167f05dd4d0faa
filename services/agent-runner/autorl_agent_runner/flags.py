"""Checks of command-line values that ``autorl agent-runner`` and ``autorl run`` share: each refuses,
before anything starts, a value that would fail later, naming the flag and what to pass instead."""

from __future__ import annotations

import argparse
from pathlib import Path

from autorl.cli import UsageError
from autorl_agent_runner.sandbox.environment import NUL


def check_at_most(flag: str, value: int, most: int, what: str) -> None:
    """An integer flag from 1 to ``most``; ``what`` says what it counts."""
    if not 1 <= value <= most:
        raise UsageError(f"{flag} must be from 1 to {most} ({what}), not {value}")


def path_flag(text: str) -> Path:
    """argparse ``type`` of a path flag: an empty value is refused as empty, not read as ``.``."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; pass a path")
    if NUL in text:
        raise argparse.ArgumentTypeError("holds a NUL byte (\\x00), which no path can; remove it")
    return Path(text)


def check_not_empty(**flags: str | None) -> None:
    """Refuse a string flag given as empty (``-m ""``), naming it: ``check_not_empty(model="")``."""
    for name, value in flags.items():
        if value is not None and not value.strip():
            raise UsageError(f"--{name.replace('_', '-')} is empty; pass a value")
        if value is not None and NUL in value:
            raise UsageError(f"--{name.replace('_', '-')} holds a NUL byte (\\x00); remove it")
