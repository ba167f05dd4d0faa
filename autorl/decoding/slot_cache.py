"""A preallocated key/value cache for batched greedy decoding, addressed by row and slot.

transformers' ``DynamicCache`` concatenates every layer's keys and values at every step, copying
the whole cache each time, and its shapes change every step, so a step cannot be replayed as a
CUDA graph. Here each layer owns two zero-filled tensors ``[rows, kv_heads, slots, head_dim]``
allocated once. The decoding loop points the cache at a window before each forward pass, and the
model's attention layers write there through ``update``, which transformers calls with each
layer's new keys and values:

- a prefill window: rows ``start..end``, positions written from a slot onwards, the keys returned
  up to the last one written;
- a decode window: rows ``0..n``, one position written at the slot held by a device tensor (so
  that a captured step writes the next slot when the tensor is advanced), and a fixed span of
  slots returned: the step's shapes stay the same over many steps, and the attention mask hides
  the slots not written yet.

Rows that finish are dropped by :meth:`SlotCache.keep`, which moves the survivors to the front in
place, so later steps read only live rows and no second cache is ever allocated.
"""

from __future__ import annotations

from typing import Any


class SlotCache:
    """Keys and values of ``layers`` attention layers for ``rows`` sequences of ``slots`` positions."""

    def __init__(
        self, *, layers: int, rows: int, slots: int, kv_heads: int, head_dim: int, dtype: Any, device: Any
    ) -> None:
        import torch

        # Zeros, not garbage: masked slots get zero weight, and zero times a NaN bit pattern is NaN.
        shape = (rows, kv_heads, slots, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots = slots
        self._rows = slice(0, rows)
        self._slot = 0
        self._slot_index: Any = None
        self._span = slots
        self._padding: Any = None

    def prefill_window(self, row_start: int, row_end: int, slot: int, written: Any = None) -> None:
        """The next forward pass writes rows ``row_start..row_end`` from ``slot`` on; ``written``
        (``[rows, positions]`` boolean, None: all) says which positions hold a row's own ids: the
        others (padding) are stored as zeros, whatever the model computed for them, so that a masked
        slot adds nothing to a row (zero weight times an infinite value would be NaN)."""
        self._rows, self._slot, self._slot_index = slice(row_start, row_end), slot, None
        self._padding = None if written is None else ~written[:, None, :, None]

    def decode_window(self, rows: int, slot_index: Any, span: int) -> None:
        """The next forward passes write one position of rows ``0..rows`` at ``slot_index`` (a
        one-element device tensor the caller advances, below ``span``) and return slots ``0..span``."""
        self._rows, self._slot_index, self._span = slice(0, rows), slot_index, span

    def update(
        self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Store one layer's new keys and values (``[rows, kv_heads, q, head_dim]``) in the window and
        return what the window's rows may attend to. transformers passes cache keyword arguments
        that differ between versions; a slot cache needs none of them."""
        keys, values = self.keys[layer_idx][self._rows], self.values[layer_idx][self._rows]
        if self._slot_index is not None:
            keys.index_copy_(2, self._slot_index, key_states)
            values.index_copy_(2, self._slot_index, value_states)
            return keys[:, :, : self._span], values[:, :, : self._span]
        end = self._slot + key_states.shape[2]
        if self._padding is not None:
            key_states = key_states.masked_fill(self._padding, 0)
            value_states = value_states.masked_fill(self._padding, 0)
        keys[:, :, self._slot : end] = key_states
        values[:, :, self._slot : end] = value_states
        return keys[:, :, :end], values[:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions written before a prefill window (what transformers asks when it derives
        positions; the decoding loop always passes them)."""
        return self._slot

    def prefix(self, length: int) -> tuple[tuple[Any, Any], ...]:
        """Per layer, row 0's keys and values over slots ``0..length`` (``[kv_heads, length, head_dim]``)."""
        return tuple(
            (k[0, :, :length], v[0, :, :length]) for k, v in zip(self.keys, self.values, strict=True)
        )

    def keep(self, index: Any) -> None:
        """Keep only the rows at ``index`` (a 1-D device tensor of row numbers), moved to rows
        ``0..len(index)``."""
        kept = int(index.shape[0])
        for tensor in self.keys + self.values:
            tensor[:kept] = tensor.index_select(0, index)
