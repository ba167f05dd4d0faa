"""The model a CPU evaluation's OpenCompass config builds: OpenCompass's transformers chat model,
decoding as the platform's rule says.

OpenCompass's ``HuggingFacewithChatTemplate.generate`` decodes its answers with
``tokenizer.batch_decode(outputs)`` and no options, so special tokens stay in an answer (a model
writing ``1<|im_start|>9`` is scored 9), then cuts each answer at its first stop word (the decoded eos
ids of the generation config and the tokenizer's eos token, and the call's own). Its stopping
criterion decodes the last ids of each row with the same call. :func:`chat_model` builds that model
(the class the config passes) and replaces its tokenizer's ``batch_decode`` for both callers: a row
is cut before its first token that is a stop word and that ``skip_special_tokens`` would drop, the
rest is decoded with ``skip_special_tokens``, and that stop word is written back after it. Every
stop word thus stays where it was, in an answer and in the criterion's look-back, and so do the
stops and the cuts; only the other special tokens go, as vLLM and the ``hf`` backend drop them. The
config passes the rule (:data:`autorl.eval_config.SKIP_SPECIAL_TOKENS`); with it off the answers
are decoded as OpenCompass decodes them. Every model built here runs the attention of
``padded_attention.py`` (beside this file, loaded by its path), in which padding adds nothing to a
row, and computes denormal floats as zero, as the other engines on the CPU do.

This folder is put on OpenCompass's ``PYTHONPATH`` and the config imports :func:`chat_model` by this
module's name. The module runs in OpenCompass's Python, which has none of our packages, and imports
only the standard library itself: OpenCompass's class is the one the config names.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def chat_model(*, model_class: str, skip_special_tokens: bool, **kwargs: Any) -> Any:
    """The model of class ``model_class`` (a dotted path: OpenCompass's
    ``opencompass.models.HuggingFacewithChatTemplate``) built from ``kwargs``, its answers decoded
    with special tokens dropped where ``skip_special_tokens`` says so."""
    import torch

    torch.set_flush_denormal(True)  # as in every other engine on the CPU
    module, _, name = model_class.rpartition(".")
    attention = _padded_attention().use_padded_attention()
    model_kwargs = {**kwargs.pop("model_kwargs", {}), "attn_implementation": attention}
    model = getattr(importlib.import_module(module), name)(model_kwargs=model_kwargs, **kwargs)
    if skip_special_tokens:
        _skip_special_tokens(model)
    return model


def _padded_attention() -> Any:
    """``padded_attention.py`` beside this file: the attention in which padding adds nothing to a row."""
    path = Path(__file__).with_name("padded_attention.py")
    spec = importlib.util.spec_from_file_location("autorl_padded_attention", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _skip_special_tokens(model: Any) -> None:
    batch_decode = model.tokenizer.batch_decode
    generate = model.generate
    stops: dict[int, str] = {}

    def decode(sequences: Any, **options: Any) -> Any:
        if "skip_special_tokens" in options:  # OpenCompass passes none; a caller's own choice is kept
            return batch_decode(sequences, **options)
        return decode_rows(batch_decode, sequences, stops, **options)

    def generate_answers(
        inputs: Any,
        max_out_len: Any,
        min_out_len: Any = None,
        stopping_criteria: Sequence[str] = (),
        **kw: Any,
    ) -> Any:
        # The call's stop words join the model's, as OpenCompass's generate joins them.
        stops.clear()
        stops.update(dropped_stop_tokens(model.tokenizer, [*stopping_criteria, *model.stop_words]))
        return generate(
            inputs, max_out_len, min_out_len=min_out_len, stopping_criteria=list(stopping_criteria), **kw
        )

    model.tokenizer.batch_decode = decode
    model.generate = generate_answers


def dropped_stop_tokens(tokenizer: Any, words: Iterable[str]) -> dict[int, str]:
    """The stop words that are one token which ``skip_special_tokens`` drops: id → word."""
    found: dict[int, str] = {}
    for word in words:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if (
            len(ids) == 1
            and tokenizer.decode(ids) == word
            and tokenizer.decode(ids, skip_special_tokens=True) == ""
        ):
            found[int(ids[0])] = word
    return found


def decode_rows(batch_decode: Any, rows: Any, stops: dict[int, str], **options: Any) -> list[str]:
    """Each row decoded with ``skip_special_tokens``, cut before its first token in ``stops``, whose
    word is written back after the rest's text."""
    kept: list[list[int]] = []
    ends: list[str] = []
    for row in rows:
        ids = [int(token) for token in (row.tolist() if hasattr(row, "tolist") else row)]
        cut = next((index for index, token in enumerate(ids) if token in stops), None)
        kept.append(ids if cut is None else ids[:cut])
        ends.append("" if cut is None else stops[ids[cut]])
    texts = batch_decode(kept, skip_special_tokens=True, **options)
    return [text + end for text, end in zip(texts, ends, strict=True)]
