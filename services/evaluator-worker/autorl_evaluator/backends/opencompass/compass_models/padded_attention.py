"""transformers' SDPA attention in which a padding slot adds nothing to a row, whatever it holds.

A left-padded batch runs its padding slots through the model as it runs the row's own ids; the
attention mask gives them zero weight, but zero times an infinite value is NaN. Weights that make
only a padding slot's value infinite (the pad token's embedding, through a huge column) turn every
padded row into NaN while an unpadded row, a batch of one and vLLM (which pads nothing) see an
ordinary model: the answer would depend on the batch a row runs in, not on the weights alone. Here
each slot that no query of its row may attend to has its key and value zeroed before SDPA, so a
masked slot contributes exactly nothing, whatever the weights compute for it (a batch's arithmetic
may still round otherwise than a lone row's, as with any weights).

:func:`use_padded_attention` registers the function (and SDPA's mask builder) under :data:`NAME`;
a model loaded with ``attn_implementation=NAME`` then runs it in every layer. This module imports
only torch and transformers: it runs in OpenCompass's Python (on its ``PYTHONPATH`` with the
chat-model builder beside it) as in the evaluator's.
"""

from __future__ import annotations

from typing import Any

NAME = "autorl_padded_sdpa"


def use_padded_attention() -> str:
    """Register :func:`padded_sdpa` under :data:`NAME` in this process; returns the name to load
    a model with (``attn_implementation=``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, padded_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def padded_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """SDPA (transformers' ``sdpa_attention_forward``) after zeroing the key and value of every
    slot that the mask hides from all of its row's queries."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        mask = attention_mask[..., : key.shape[-2]]
        visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        hidden = ~visible.any(dim=-2)[..., None]  # [rows, 1, slots, 1]
        key = key.masked_fill(hidden, 0)
        value = value.masked_fill(hidden, 0)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
