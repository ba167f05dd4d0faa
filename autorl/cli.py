"""The ``autorl`` command. The core defines it; each installed service adds its subcommands
through the entry-point group ``autorl.commands`` (a ``register(subparsers)`` function), so the
core never imports a service.

An error is printed through :func:`error_text`: it can quote an agent's strings (a path, a tensor
name of its checkpoint), which reach the terminal escaped and bounded.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from autorl.errors import AutoRLError, UsageError

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "UsageError", "check_seconds", "error_text", "main"]

#: Exit code for bad input (argparse uses it too).
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

Command = Callable[[argparse.Namespace], int | None]


def check_seconds(flag: str, value: float, *, example: int, zero: bool = False) -> None:
    """Refuse a duration flag that cannot work (negative, zero unless ``zero``, nan or infinite)
    with a message naming the flag and a value that would."""
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        kind = "a number of seconds, 0 or more," if zero else "a positive number of seconds,"
        raise UsageError(f"{flag} must be {kind} such as {example}, not {value:g}")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` that shows each option's default, where it has one its help does not already name."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == []
        if not action.option_strings or unset or action.default is argparse.SUPPRESS or "default" in text:
            return action.help
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autorl",
        description="AutoRL: post-train small language models with RL under a time budget.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from autorl.runs import commands

    commands.register_results(sub)
    for ep in sorted(entry_points(group="autorl.commands"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:  # a service whose optional dependencies are missing
            missing = sub.add_parser(ep.name, help=f"(unavailable: {exc})")
            missing.set_defaults(func=_unavailable(ep.name, exc))
            continue
        register(sub)
    for command in sub.choices.values():
        command.formatter_class = DefaultsHelpFormatter
    return parser


def error_text(error: object) -> str:
    """An error as a terminal shows it: at most ``MAX_MESSAGE_CHARS`` characters, each line escaped
    (a control, bidi or zero-width character written as its escape), and every line after the first
    indented, so that no line it quotes can pass for one of the command's own."""
    from autorl.provenance.unverified import MAX_MESSAGE_CHARS
    from autorl.untrusted_text import printable_once, shortened

    lines = shortened(str(error), MAX_MESSAGE_CHARS).replace("\r\n", "\n").split("\n")
    return shortened("\n    ".join(printable_once(line) for line in lines), MAX_MESSAGE_CHARS)


def _unavailable(name: str, exc: Exception) -> Command:
    def run(_: argparse.Namespace) -> int:
        print(
            f"autorl {name}: cannot start ({error_text(exc)}); install its service package", file=sys.stderr
        )
        return 1

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UsageError as exc:
        print(f"autorl {args.command}: error: {error_text(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except AutoRLError as exc:
        print(f"autorl {args.command}: error: {error_text(exc)}", file=sys.stderr)
        return 1
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
