"""The ``autorl`` command. The core defines it; each installed service adds its subcommands
through the entry-point group ``autorl.commands`` (a ``register(subparsers)`` function), so the
core never imports a service.

An error is printed through :func:`error_text`: it can quote an agent's strings (a path, a tensor
name of its checkpoint), which reach the terminal escaped and bounded. No traceback reaches the
user: a setting refused by its validation, a failed file or network operation and any other
failure are each printed as lines naming what failed (``AUTORL_TRACEBACK=1`` re-raises the last two).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from autorl.errors import AutoRLError, UsageError

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INTERRUPTED",
    "UsageError",
    "check_port",
    "check_seconds",
    "error_text",
    "main",
]

#: Exit code for bad input (argparse uses it too).
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
#: Set (to anything but empty or 0) to see the traceback of a failure `autorl` prints as one line.
TRACEBACK_VARIABLE = "AUTORL_TRACEBACK"
#: The failures of a file or network operation that are about the path or address it was given.
INPUT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.EACCES,
        errno.EPERM,
        errno.ENAMETOOLONG,
        errno.EADDRINUSE,
        errno.EADDRNOTAVAIL,
    }
)
#: A setting whose value is never shown (besides those typed as secrets).
SECRET_FIELD = re.compile(r"(^|_)(token|password|secret|key)$")
#: A URL's password (``scheme://user:PASSWORD@host``), hidden where a setting's value is shown.
URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/@]*@")

Command = Callable[[argparse.Namespace], int | None]


def check_seconds(flag: str, value: float, *, example: int, zero: bool = False) -> None:
    """Refuse a duration flag that cannot work (negative, zero unless ``zero``, nan, infinite, or
    past ``MAX_BUDGET_S``: a longer wait is a typo, and a budget the grader could not store) with a
    message naming the flag and a value that would."""
    from autorl.experiment import MAX_BUDGET_S

    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        kind = "a number of seconds, 0 or more," if zero else "a positive number of seconds,"
        raise UsageError(f"{flag} must be {kind} such as {example}, not {value:g}")
    if value > MAX_BUDGET_S:
        raise UsageError(
            f"{flag} must be at most {MAX_BUDGET_S} seconds (30 days), not {value:g}; pass a number of "
            f"seconds such as {example}"
        )


def check_port(flag: str, port: int) -> None:
    """Refuse a port number no socket can have, naming the flag."""
    if not 0 < port < 65536:
        raise UsageError(f"{flag} must be between 1 and 65535, not {port}")


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


def setting_errors(exc: ValidationError) -> list[str] | None:
    """One line for each setting that ``exc`` refused: the setting as the user sets it (the
    variable ``AUTORL_<FIELD>``, or the field where a command gave the value), the value given
    (a secret's hidden) and what is expected; None when ``exc`` is not about a settings class."""
    from autorl.settings import NEEDS_VALID, AutoRLSettings, secrets_dir

    settings_class = _settings_class(AutoRLSettings, exc.title)
    if settings_class is None:
        return None
    errors = exc.errors()
    # A setting refused only because the one it derives from was (the home's folders) adds nothing.
    causes = [e for e in errors if not str(e.get("msg", "")).startswith(f"Value error, {NEEDS_VALID}")]
    lines = []
    for error in causes or errors:
        field = str(error["loc"][0]) if error.get("loc") else ""
        info = settings_class.model_fields.get(field)
        alias = info and (info.validation_alias or info.alias)
        variable = (
            alias if isinstance(alias, str) else f"{settings_class.model_config.get('env_prefix', '')}{field}"
        ).upper()
        secrets = secrets_dir()
        from_user = variable in os.environ or (secrets is not None and (secrets / variable).is_file())
        name = variable if from_user or not field else field
        value = error.get("input")
        if value is None or not field:
            shown = " (not set)" if field else ""
        elif "Secret" in repr(info and info.annotation) or SECRET_FIELD.search(field):
            shown = " (value hidden)"
        else:
            shown = "=" + URL_PASSWORD.sub(r"\1***@", repr(value) if isinstance(value, str) else str(value))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        message = re.sub(r"^Input should be ", "expected ", message)
        lines.append(f"{name}{shown}: {message}")
    return lines


def _settings_class(root: type[Any], name: str) -> type[Any] | None:
    """The settings class (``root`` or one of its subclasses, services' included) called ``name``."""
    if root.__name__ == name:
        return root
    for subclass in root.__subclasses__():
        if (found := _settings_class(subclass, name)) is not None:
            return found
    return None


def os_error_line(exc: OSError) -> str:
    """A failed file or network operation as one line: what failed, the path or address, why."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve a host name: {exc.strerror or exc}; check the host or address given"
    why = exc.strerror or str(exc) or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = " -> ".join(paths)
    code = errno.errorcode.get(exc.errno or 0)
    what = f"{type(exc).__name__}{f' ({code})' if code else ''}"
    return f"{what}: {why}{f': {where}' if where else ''}"


def _traceback_wanted() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "").strip() not in ("", "0")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prefix = f"autorl {args.command}"
    try:
        code = args.func(args)
    except UsageError as exc:
        print(f"{prefix}: error: {error_text(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except AutoRLError as exc:
        print(f"{prefix}: error: {error_text(exc)}", file=sys.stderr)
        return 1
    except OSError as exc:
        if _traceback_wanted():
            raise
        print(f"{prefix}: error: {error_text(os_error_line(exc))}", file=sys.stderr)
        bad_input = isinstance(exc, socket.gaierror) or exc.errno in INPUT_ERRNOS
        return EXIT_BAD_INPUT if bad_input else 1
    except Exception as exc:
        from pydantic import ValidationError

        lines = setting_errors(exc) if isinstance(exc, ValidationError) else None
        if lines is not None:
            for line in lines:
                print(f"{prefix}: error: {error_text(line)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if _traceback_wanted():
            raise
        print(
            f"{prefix}: internal error: {error_text(f'{type(exc).__name__}: {exc}')} "
            f"(set {TRACEBACK_VARIABLE}=1 to see its traceback)",
            file=sys.stderr,
        )
        return 1
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
