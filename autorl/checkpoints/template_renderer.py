"""The chat template renderer's child process: standard library and jinja2 only.

:mod:`autorl.checkpoints.chat_template` runs this file by its path in an isolated interpreter
(``python -I``: no ``PYTHONPATH``, no user site, not even this file's folder on the path), so it runs
wherever jinja2 is installed beside that Python, whether or not this package is: nothing here
imports it. A JSON request on stdin (``template``, ``conversations``, ``variables``,
``add_generation_prompt``), a JSON answer on stdout (``{"rendered": [...]}`` or ``{"error": "..."}``);
``TIMEOUT_S`` as its one argument sets its CPU limit.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

#: A few-shot GSM8K prompt is about 3,000 characters.
MAX_PROMPT_CHARS = 256 * 1024
MAX_TOTAL_CHARS = 64 * 1024 * 1024
CHILD_ADDRESS_SPACE_BYTES = 512 * 1024 * 1024
#: The longest error text passed back from the child.
MAX_ERROR_CHARS = 500
#: Largest sequence a template's ``*`` may build, and largest integer exponent of ``**``.
MAX_REPEAT_ITEMS = 1024 * 1024
MAX_EXPONENT = 4096


def _environment() -> Any:
    """transformers' chat-template environment (transformers.utils.chat_template_utils), guarded."""
    from datetime import datetime

    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}…{% endgeneration %}`` marks assistant text; rendering keeps the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    class GuardedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
                raise jinja2.exceptions.SecurityError(f"exponent {right} is larger than {MAX_EXPONENT}")
            if operator == "*":
                for sequence, count in ((left, right), (right, left)):
                    if (
                        isinstance(sequence, str | list | tuple)
                        and isinstance(count, int)
                        and len(sequence) * count > MAX_REPEAT_ITEMS
                    ):
                        raise jinja2.exceptions.SecurityError(
                            f"repeating a sequence to more than {MAX_REPEAT_ITEMS} items"
                        )
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = GuardedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _render_all(request: dict[str, Any]) -> list[str]:
    template = _environment().from_string(request["template"])
    rendered: list[str] = []
    total = 0
    for conversation in request["conversations"]:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(
            messages=conversation,
            tools=None,
            documents=None,
            add_generation_prompt=request["add_generation_prompt"],
            **request["variables"],
        ):
            size += len(piece)
            if size > MAX_PROMPT_CHARS:
                raise ValueError(f"a rendered prompt is longer than {MAX_PROMPT_CHARS} characters")
            pieces.append(piece)
        total += size
        if total > MAX_TOTAL_CHARS:
            raise ValueError(f"the rendered prompts are longer than {MAX_TOTAL_CHARS} characters in all")
        rendered.append("".join(pieces))
    return rendered


def main(timeout_s: float) -> int:
    import resource

    cpu_s = math.ceil(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE_BYTES, CHILD_ADDRESS_SPACE_BYTES))
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:
        answer: dict[str, Any] = {"rendered": _render_all(request)}
    except MemoryError:
        answer = {"error": "it used more memory than the renderer allows"}
    except RecursionError:
        answer = {"error": "it recursed too deeply"}
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {str(exc)[:MAX_ERROR_CHARS]}"}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(float(sys.argv[1])))
