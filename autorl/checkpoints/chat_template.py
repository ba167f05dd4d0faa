"""Chat templates rendered as transformers renders them, but with limits, in a child process.

A chat template is code from the submission. transformers already renders it in Jinja's
immutable sandbox; that stops attribute tricks but not a template that loops for hours, builds a
gigabyte string, or raises an exception quoting the conversation. Here the same environment
(trim_blocks, lstrip_blocks, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``,
the ``{% generation %}`` block) runs in a child Python process with a wall-clock timeout, a CPU
and an address-space limit, a cap on each rendered prompt and on the whole output, and guarded
``*`` and ``**`` operators. The grader dry-renders a train question at submit; the evaluator
renders every test prompt through it, so what was checked is what is used.

Run as ``python -m autorl.checkpoints.chat_template TIMEOUT_S``: a JSON request on stdin, a JSON answer
on stdout (``{"rendered": [...]}`` or ``{"error": "..."}``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autorl.errors import CheckpointError

#: Every render gets this long, plus RENDER_PER_PROMPT_S for each prompt (a real template renders
#: a few-shot prompt in well under a millisecond; the child's start-up costs about 0.2 s).
RENDER_BASE_TIMEOUT_S = 5.0
RENDER_PER_PROMPT_S = 0.01
#: A few-shot GSM8K prompt is about 3,000 characters.
MAX_PROMPT_CHARS = 256 * 1024
MAX_TOTAL_CHARS = 64 * 1024 * 1024
CHILD_ADDRESS_SPACE_BYTES = 512 * 1024 * 1024
#: The longest error text passed back from the child.
MAX_ERROR_CHARS = 500
#: Largest sequence a template's ``*`` may build, and largest integer exponent of ``**``.
MAX_REPEAT_ITEMS = 1024 * 1024
MAX_EXPONENT = 4096
_FIX = (
    "use a chat template that renders each conversation in well under a second and only "
    "from the messages it is given (save it with tokenizer.save_pretrained(path))"
)


class ChatTemplateError(CheckpointError):
    """The chat template failed, ran past its limits, or is missing."""


@dataclass(frozen=True)
class ChatTemplate:
    """A template and the variables transformers passes beside the messages (the tokenizer's
    special tokens: ``bos_token``, ``eos_token``, ...). Quacks like a tokenizer's
    ``apply_chat_template`` for text output, so tasks render prompts with it."""

    source: str
    variables: Mapping[str, Any] = field(default_factory=dict)

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        if tokenize:
            raise TypeError("ChatTemplate renders text only; tokenize the result with the tokenizer")
        return self.render_batch([conversation], add_generation_prompt=add_generation_prompt, **kwargs)[0]

    def render_batch(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        *,
        add_generation_prompt: bool,
        **kwargs: Any,
    ) -> list[str]:
        """Each conversation rendered, in order; :class:`ChatTemplateError` when any fails."""
        timeout_s = RENDER_BASE_TIMEOUT_S + RENDER_PER_PROMPT_S * len(conversations)
        request = {
            "template": self.source,
            "conversations": [list(map(dict, conversation)) for conversation in conversations],
            "variables": {**self.variables, **kwargs},
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            child = subprocess.run(
                [sys.executable, "-I", "-m", __name__, str(timeout_s)],
                input=json.dumps(request).encode("utf-8"),
                capture_output=True,
                timeout=timeout_s,
                check=False,
                env={},
            )
        except subprocess.TimeoutExpired as exc:
            raise ChatTemplateError(
                f"the chat template did not finish rendering {len(conversations)} prompt(s) within "
                f"{timeout_s:.1f} s; {_FIX}"
            ) from exc
        try:
            answer = json.loads(child.stdout.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            # Killed by its CPU or memory limit, or its interpreter could not start.
            raise ChatTemplateError(
                f"the chat template's renderer stopped (exit code {child.returncode}): the template "
                f"used too much memory or CPU time; {_FIX}"
            ) from exc
        if "error" in answer:
            raise ChatTemplateError(f"the chat template failed: {answer['error']}; {_FIX}")
        rendered: list[str] = answer["rendered"]
        return rendered


# --- the child --------------------------------------------------------------------------------


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


def _child(timeout_s: float) -> int:
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
    raise SystemExit(_child(float(sys.argv[1])))
