"""Grouped-query attention over a shared prefix and each row's own keys, never expanding heads.

Two things a decode step of a GSM8K evaluation would otherwise read many times over:

- **Key/value heads.** Qwen2.5-1.5B has 12 query heads and 2 key/value heads. transformers' SDPA
  path, given a padding mask on CUDA, copies each key/value head six times (``repeat_kv``) in
  every layer at every step. Here the query heads that share a key/value head are laid side by
  side as extra query rows (``[rows, kv_heads, groups × q, head_dim]``), so each cached key and
  value is read once.
- **The shared prefix.** All rows start with the same ~1,440 few-shot ids. Their keys and values
  are held once (``[kv_heads, prefix, head_dim]``) and all rows' queries meet them in one
  attention call per layer, as if they were one long sequence; a row's own cache holds only its
  own ids and generated tokens. The two parts are merged through their log-sum-exp of scores (one
  softmax over both), which is the same function as attending to the prefix followed by the row's
  keys.

Scores and the softmax are float32 (as in SDPA's kernels); the probabilities meet the values in the
model's dtype. The function is registered in transformers' ``AttentionInterface`` under
:data:`NAME` and takes its mask as an :class:`AttentionWindow` in the keyword argument
:data:`WINDOW_ARGUMENT`, which a model's forward pass hands through to every attention call
unchanged. The model's own ``attention_mask`` stays None: what a model does with a mask differs
between architectures (Llama's mask builder drops one it cannot build for this attention, Qwen2's
passes a mapping through), a keyword argument none of them reads reaches the attention as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

NAME = "autorl_grouped_prefix"
#: The forward keyword argument that carries the :class:`AttentionWindow`.
WINDOW_ARGUMENT = "autorl_window"


@dataclass(frozen=True)
class AttentionWindow:
    """What the rows' queries may attend to in one forward pass."""

    #: ``[rows, 1, q, slots]`` boolean, True where a query may attend to the row's own slot.
    mask: Any
    #: Per layer, the shared prefix's keys and values ``[kv_heads, prefix, head_dim]``; empty: none.
    prefix: tuple[tuple[Any, Any], ...] = ()


def grouped_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    *,
    autorl_window: AttentionWindow,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention-function signature: returns ``([rows, q, heads, head_dim], None)``.
    ``attention_mask`` (the model's own, None) is not read: ``autorl_window`` says what to attend to."""
    import torch

    window = autorl_window

    rows, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    packed_len = groups * q_len
    scale = head_dim**-0.5 if scaling is None else scaling
    # Query head h uses key/value head h // groups (transformers' repeat_kv order).
    packed = query.reshape(rows, kv_heads, packed_len, head_dim)
    mask = window.mask[:, :, None].expand(rows, 1, groups, q_len, key.shape[2])
    own = _scores(packed.flatten(0, 1), key.flatten(0, 1).transpose(1, 2)).view(
        rows, kv_heads, packed_len, -1
    )
    own = own.mul_(scale).masked_fill_(~mask.reshape(rows, 1, packed_len, -1), float("-inf"))
    peak = own.amax(-1, keepdim=True)
    if window.prefix:
        prefix_keys, prefix_values = window.prefix[module.layer_idx]
        by_head = packed.transpose(0, 1).reshape(kv_heads, rows * packed_len, head_dim)
        shared_out, shared_lse = _prefix_attention(by_head, prefix_keys, prefix_values, scale)
        shared_out = shared_out.view(kv_heads, rows, packed_len, head_dim).transpose(0, 1)
        shared_lse = shared_lse.view(kv_heads, rows, packed_len, 1).transpose(0, 1)
        peak = torch.maximum(peak, shared_lse)
    weights = own.sub_(peak).exp_()
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(value.dtype), value).float()
    if window.prefix:
        # The prefix part comes normalised: its weight is its share exp(lse) of the denominator.
        shared_weight = (shared_lse - peak).exp_()
        total += shared_weight
        out += shared_out.float() * shared_weight
    out = (out / total).to(query.dtype)
    return out.reshape(rows, heads, q_len, head_dim).transpose(1, 2), None


def _prefix_attention(queries: Any, keys: Any, values: Any, scale: float) -> tuple[Any, Any]:
    """Attention of ``queries`` ``[kv_heads, n, head_dim]`` to every key of the prefix
    (``[kv_heads, prefix, head_dim]``): the normalised output and each query's log-sum-exp of
    scores. On a GPU in half precision, the flash-attention kernel behind PyTorch's SDPA, which
    returns the log-sum-exp beside the output (the public SDPA function drops it)."""
    import torch

    if queries.is_cuda and queries.dtype in (torch.bfloat16, torch.float16) and queries.shape[-1] <= 256:
        result = torch.ops.aten._scaled_dot_product_flash_attention(
            queries[None], keys[None], values[None], 0.0, False, False, scale=scale
        )
        return result[0][0], result[1][0]
    scores = _scores(queries, keys.transpose(1, 2)).mul_(scale)
    lse = torch.logsumexp(scores, -1)
    weights = scores.sub_(lse[..., None]).exp_()
    return torch.matmul(weights.to(values.dtype), values), lse


def _scores(queries: Any, keys_t: Any) -> Any:
    """Batched ``queries @ keys_t`` in float32, without a float32 copy of the keys where the device
    can write float32 from bf16 operands."""
    import torch

    if queries.dtype == torch.float32:
        return torch.bmm(queries, keys_t)
    if queries.is_cuda:
        return torch.bmm(queries, keys_t, out_dtype=torch.float32)
    return torch.bmm(queries.float(), keys_t.float())


@contextmanager
def grouped_attention_for(model: Any) -> Iterator[None]:
    """Run ``model``'s attention layers through :func:`grouped_attention` inside the block."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, grouped_attention)
    previous = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
