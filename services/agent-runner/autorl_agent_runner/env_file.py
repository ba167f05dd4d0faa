"""``--env-file``: variables for the agent from a ``.env`` file (LLM API keys), and nothing else.

The format is the one ``python-dotenv`` and ``docker --env-file`` users write: ``NAME=VALUE`` a
line, an optional ``export`` in front, ``#`` comments, values in single quotes (literal) or double
quotes (``\\n``, ``\\"`` and ``\\\\`` escapes). Only the file's variables reach the agent: the
environment ``autorl`` itself runs in (database URLs, tokens, other keys) is never copied.
"""

from __future__ import annotations

import re
from pathlib import Path

from autorl_agent_runner.sandbox.environment import PLATFORM_VARIABLES, AgentEnvError, check_no_nul

_LINE = re.compile(r"(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.*)")
_DOUBLE_QUOTE_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unquote(raw: str, where: str) -> str:
    if raw[:1] in {"'", '"'}:
        quote = raw[0]
        end = raw.find(quote, 1) if quote == "'" else _closing_double_quote(raw)
        if end < 0:
            raise AgentEnvError(f"{where}: the value opens a {quote} quote it never closes; close it")
        rest = raw[end + 1 :].strip()
        if rest and not rest.startswith("#"):
            raise AgentEnvError(f"{where}: text after the closing quote; quote the whole value")
        inner = raw[1:end]
        if quote == "'":
            return inner
        return re.sub(r"\\(.)", lambda m: _DOUBLE_QUOTE_ESCAPES.get(m[1], m[0]), inner)
    # Unquoted: a comment starts at " #", as in a shell; surrounding blanks are not the value's.
    return re.split(r"\s+#", raw, maxsplit=1)[0].strip()


def _closing_double_quote(raw: str) -> int:
    index = 1
    while index < len(raw):
        if raw[index] == "\\":
            index += 2
            continue
        if raw[index] == '"':
            return index
        index += 1
    return -1


def parse_env_file(path: Path) -> dict[str, str]:
    """The file's variables, in order; a bad line or a platform variable is an error naming its line."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AgentEnvError(f"--env-file {path}: no such file; pass the path of your .env") from None
    except IsADirectoryError:
        raise AgentEnvError(
            f"--env-file {path} is a folder; pass the path of the .env file itself, such as {path / '.env'}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentEnvError(f"--env-file {path}: cannot be read as UTF-8 text ({exc})") from exc
    variables: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"--env-file {path}, line {number}"
        check_no_nul(line, where)
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.fullmatch(stripped)
        if match is None:
            raise AgentEnvError(f"{where}: expected NAME=VALUE (or export NAME=VALUE), not {stripped[:40]!r}")
        name = match["name"]
        if name in PLATFORM_VARIABLES:
            raise AgentEnvError(f"{where}: the platform sets {name} itself; remove it from the file")
        variables[name] = _unquote(match["value"], where)
    return variables


def env_file_items(path: Path) -> list[str]:
    """The file's variables as ``NAME=VALUE`` items, to go before the ``--env`` items (which win)."""
    return [f"{name}={value}" for name, value in parse_env_file(path).items()]
