"""How many GPUs one evaluation shards a model over."""

from __future__ import annotations


def tensor_parallel_size(gpu_count: int) -> int:
    """The largest power of two not above ``gpu_count``, at least 1.

    vLLM splits attention heads evenly across tensor-parallel ranks, and the head counts of the
    models evaluated here are powers of two times a small factor, so a power of two always
    divides them; a leftover GPU (the third of three) stays idle rather than failing the shard.
    """
    if gpu_count < 1:
        return 1
    return 1 << (gpu_count.bit_length() - 1)
