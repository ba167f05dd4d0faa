"""OpenCompass's chat handling, reproduced so that the in-process backend feeds a model the same ids.

What ``HuggingFacewithChatTemplate`` (and ``VLLMwithChatTemplate``) of OpenCompass 0.5 do to a
few-shot GSM8K prompt, step by step:

1. The dataset's rounds pass through the default API meta template, whose round is
   ``HUMAN, SYSTEM→HUMAN, BOT``. The SYSTEM slot is empty in every round, yet it becomes a HUMAN
   turn with an empty prompt that is merged into the HUMAN turn before it with ``"\\n"``: every
   user turn ends with a newline that the dataset config does not write.
2. Consecutive turns of one role are merged with ``"\\n"``, empty turns are dropped.
3. The model's chat template renders the turns with the generation prompt; the text is encoded
   with ``add_special_tokens=False``: a BOS appears only where the template writes one.
4. Stop words are the decoded ``eos_token_id`` (one or a list) of ``generation_config.json`` plus
   the tokenizer's ``eos_token``; a completion is cut at the first occurrence of each stop word.
   It is decoded with special tokens dropped, as vLLM decodes (the platform's rule,
   :data:`autorl.eval_config.SKIP_SPECIAL_TOKENS`); ``HuggingFacewithChatTemplate`` alone keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from autorl.tasks.base import evaluation_messages as opencompass_messages


def render(tokenizer: Any, messages: Sequence[dict[str, str]], **template_kwargs: Any) -> str:
    """The prompt text: the chat template over OpenCompass's turns (step 1 and 2 live in the core,
    :func:`autorl.tasks.base.evaluation_messages`, so that agents train on the same text)."""
    text = tokenizer.apply_chat_template(
        opencompass_messages(messages), add_generation_prompt=True, tokenize=False, **template_kwargs
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def encode(tokenizer: Any, prompt: str) -> list[int]:
    """Prompt ids as OpenCompass encodes a rendered chat: no special tokens added."""
    ids: list[int] = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids


def stop_words(tokenizer: Any, eos_token_id: int | Iterable[int] | None) -> list[str]:
    """The decoded generation-config eos ids and the tokenizer's eos token, empty ones dropped, sorted."""
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    words = {tokenizer.decode(token_id) for token_id in ids}
    if tokenizer.eos_token is not None:
        words.add(tokenizer.eos_token)
    return sorted(word for word in words if word)


def cut_at_stop_words(text: str, words: Iterable[str]) -> str:
    """``text`` up to the first occurrence of any stop word."""
    for word in words:
        text = text.split(word)[0]
    return text
