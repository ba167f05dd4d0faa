"""How many GPUs one evaluation shards a model over (vLLM's tensor-parallel size).

vLLM splits the attention heads, the key/value heads and the MLP's intermediate size across the
tensor-parallel ranks, and refuses a size that does not split them: the query heads must divide
evenly, the key/value heads must either divide evenly or be replicated (the size a multiple of
them), and so must the intermediate size. The size used is the largest ``t`` not above the visible
GPUs that satisfies all three, read from the checkpoint's ``config.json``.

This corrects the reference's rule (the largest power of two not above the GPUs), which vLLM refuses
for common shapes: Qwen2.5-0.5B (14 heads, 2 KV heads) on 4 or 8 GPUs, Qwen2.5-1.5B (12/2) on 8,
Qwen2.5-7B (28/4) on 8. GPUs left over stay idle rather than failing the shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autorl.errors import EvaluationError


@dataclass(frozen=True)
class TensorParallelShape:
    """The sizes of a model that tensor parallelism splits."""

    attention_heads: int
    kv_heads: int
    intermediate_size: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TensorParallelShape:
        """From a parsed ``config.json`` (``num_key_value_heads`` defaults to the attention heads)."""
        text_config = config.get("text_config")
        source = text_config if isinstance(text_config, Mapping) else config
        heads = source.get("num_attention_heads")
        kv_heads = source.get("num_key_value_heads", heads)
        intermediate = source.get("intermediate_size")
        values = {
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "intermediate_size": intermediate,
        }
        bad = [name for name, value in values.items() if not isinstance(value, int) or value < 1]
        if bad:
            raise EvaluationError(
                f"the checkpoint's config.json lacks a positive integer {', '.join(bad)}; the evaluator "
                "needs them to split the model across GPUs"
            )
        return cls(attention_heads=heads, kv_heads=kv_heads, intermediate_size=intermediate)  # type: ignore[arg-type]

    def splits_over(self, size: int) -> bool:
        """Whether vLLM can shard this model over ``size`` tensor-parallel ranks."""
        return (
            self.attention_heads % size == 0
            and (size % self.kv_heads == 0 or self.kv_heads % size == 0)
            and self.intermediate_size % size == 0
        )


def tensor_parallel_size(gpu_count: int, shape: TensorParallelShape) -> int:
    """The largest size not above ``gpu_count`` that ``shape`` splits over; at least 1."""
    return max((size for size in range(1, gpu_count + 1) if shape.splits_over(size)), default=1)


#: A model fits one GPU when its weights, as vLLM loads them, take at most this share of the memory
#: vLLM may use on one GPU (``gpu_memory_utilization`` of it): the rest holds the KV cache of a whole
#: test split. Such a model runs as one replica per GPU (data parallel) instead of one sharded engine:
#: tensor parallelism only adds communication to a model that fits.
FITS_ONE_GPU_SHARE = 0.5


def fits_one_gpu(weight_bytes: int, gpu_bytes: int | None, gpu_memory_utilization: float) -> bool:
    """Whether a model of ``weight_bytes`` fits the smallest visible GPU (``gpu_bytes``; None when
    unknown, which never counts as fitting)."""
    if gpu_bytes is None or gpu_bytes <= 0:
        return False
    return weight_bytes <= FITS_ONE_GPU_SHARE * gpu_memory_utilization * gpu_bytes
