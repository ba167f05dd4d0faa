"""Chat templates rendered as transformers renders them, but with limits, in a child process.

The template evaluated is the base model's (a submission's own is never read:
:mod:`autorl.checkpoints.snapshot`), so a failure here is the platform's, never the agent's. It is
still code from a model folder the platform did not write, and transformers renders it in Jinja's
immutable sandbox, which stops attribute tricks but not a template that loops for hours, builds a
gigabyte string, or raises an exception quoting the conversation. Here the same environment
(trim_blocks, lstrip_blocks, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``,
the ``{% generation %}`` block) runs in a child Python process (:mod:`.template_renderer`, run by
its path in an isolated interpreter) with a wall-clock timeout, a CPU and an address-space limit,
a cap on each rendered prompt and on the whole output, and guarded ``*`` and ``**`` operators. The
evaluator renders every test prompt through it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autorl.checkpoints import template_renderer
from autorl.errors import AutoRLError

#: Every render gets this long, plus RENDER_PER_PROMPT_S for each prompt (a real template renders
#: a few-shot prompt in well under a millisecond; the child's start-up costs about 0.2 s).
RENDER_BASE_TIMEOUT_S = 5.0
RENDER_PER_PROMPT_S = 0.01
#: The most of the renderer's own error output an error carries.
STDERR_CHARS = 2000
_FIX = (
    "the base model's chat template must render each conversation in well under a second and only "
    "from the messages it is given; register the experiment with a base model whose template does"
)


class ChatTemplateError(AutoRLError):
    """The base model's chat template failed, ran past its limits or is missing, or the renderer
    could not run: the platform's failure, not the submission's. Its text may quote a prompt (a
    template's exception), so it is for evaluator storage, not for the agent."""


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
                [sys.executable, "-I", template_renderer.__file__, str(timeout_s)],
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
        except OSError as exc:
            raise ChatTemplateError(f"the chat template's renderer could not be started: {exc}") from exc
        if child.returncode < 0:
            # Killed: its CPU limit (SIGXCPU), or the system ran out of memory for it.
            raise ChatTemplateError(
                f"the chat template's renderer was stopped by {signal_name(-child.returncode)}: the "
                f"template used too much CPU time or memory; {_FIX}"
            )
        try:
            answer = json.loads(child.stdout.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            # It ran but did not answer: its interpreter or jinja2 is broken, not the template.
            raise ChatTemplateError(
                f"the chat template's renderer could not run (exit code {child.returncode}; "
                f"{sys.executable} with jinja2 is needed): "
                + child.stderr.decode("utf-8", errors="replace")[-STDERR_CHARS:]
            ) from exc
        if "error" in answer:
            raise ChatTemplateError(f"the chat template failed: {answer['error']}; {_FIX}")
        rendered: list[str] = answer["rendered"]
        return rendered


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
