"""How many rows one decoding batch may hold, from the GPU memory that is free and the row's length.

A row of the batch costs its key/value slots (prompt, shared prefix included, plus every token it
may generate) and a little decode workspace (its logits); the prefill of a chunk of rows needs a
fixed workspace on top. The batch is the largest row count whose cost fits a fraction of the
memory free after the weights are loaded, so a GSM8K split of 1,319 prompts runs as one batch on
an H200 and as several on a smaller card, with no per-card setting.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Share of the free memory a batch may plan for; the rest absorbs allocator fragmentation.
FREE_MEMORY_FRACTION = 0.9
#: Prompt positions one prefill forward pass processes at most (rows × padded prompt width).
PREFILL_TOKENS = 32768
#: Slots are allocated in multiples of this, so every row of a slice stays 16-byte aligned for
#: the attention kernels.
SLOT_ALIGNMENT = 16


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that memory planning needs (read from its config)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @property
    def slot_bytes(self) -> int:
        """Keys and values of one position of one row, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def prefill_workspace_bytes(self, keys: int) -> int:
        """Activations of one prefill pass of :data:`PREFILL_TOKENS` positions over ``keys`` keys
        (shared prefix and row): the MLP's three intermediate tensors, a few hidden-size tensors,
        and per packed query row the float32 scores, their exponentials, a model-dtype copy and
        the boolean mask."""
        per_token = (3 * self.intermediate + 8 * self.hidden) * self.dtype_bytes
        attention = self.heads * keys * (4 + 4 + self.dtype_bytes + 1)
        return PREFILL_TOKENS * (per_token + attention)

    def decode_row_bytes(self, keys: int) -> int:
        """One row's decode workspace: its logits and its attention scores (as in prefill, one
        query position)."""
        return 2 * self.vocab * self.dtype_bytes + self.heads * keys * (4 + 4 + self.dtype_bytes + 1)


def aligned_slots(positions: int, multiple: int = SLOT_ALIGNMENT) -> int:
    """``positions`` rounded up to a multiple of ``multiple`` (itself a multiple of the alignment)."""
    return -(-positions // multiple) * multiple


def rows_that_fit(free_bytes: int, shape: ModelShape, row_slots: int, prefix: int) -> int:
    """Rows of ``row_slots`` own positions after a shared ``prefix`` that fit ``free_bytes`` (at
    least one: a row that does not fit fails with the device's out-of-memory error, which the
    caller reports)."""
    keys = prefix + row_slots
    budget = int(free_bytes * FREE_MEMORY_FRACTION) - shape.prefill_workspace_bytes(keys)
    # Dropping finished rows copies one layer of the kept rows at a time: 1/layers of the cache more.
    cache = shape.slot_bytes * row_slots * (shape.layers + 1) // shape.layers
    return max(1, budget // (cache + shape.decode_row_bytes(keys)))
