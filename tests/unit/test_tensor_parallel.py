"""tensor_parallel_size: the largest size not above the GPUs that vLLM can shard the model over."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autorl.errors import EvaluationError
from autorl_evaluator.backends.opencompass.parallel import TensorParallelShape, tensor_parallel_size

#: Shapes of the models evaluated here, from their config.json.
QWEN25_05B = TensorParallelShape(attention_heads=14, kv_heads=2, intermediate_size=4864)
QWEN25_15B = TensorParallelShape(attention_heads=12, kv_heads=2, intermediate_size=8960)
QWEN25_7B = TensorParallelShape(attention_heads=28, kv_heads=4, intermediate_size=18944)


@pytest.mark.parametrize(
    ("shape", "gpus", "expected"),
    [
        (QWEN25_05B, 1, 1),
        (QWEN25_05B, 2, 2),
        (QWEN25_05B, 3, 2),
        (QWEN25_05B, 4, 2),  # a power of two would say 4: 14 heads do not split in 4
        (QWEN25_05B, 8, 2),  # ... nor in 8 (vLLM refuses both)
        (QWEN25_15B, 1, 1),
        (QWEN25_15B, 2, 2),
        (QWEN25_15B, 3, 2),  # 3 splits the heads, but 2 KV heads neither divide 3 nor are divided by it
        (QWEN25_15B, 4, 4),
        (QWEN25_15B, 8, 4),  # 12 heads do not split in 8
        (QWEN25_7B, 1, 1),
        (QWEN25_7B, 2, 2),
        (QWEN25_7B, 3, 2),
        (QWEN25_7B, 4, 4),
        (QWEN25_7B, 8, 4),  # 28 heads do not split in 8
    ],
)
def test_qwen25_shapes(shape: TensorParallelShape, gpus: int, expected: int) -> None:
    assert tensor_parallel_size(gpus, shape) == expected


@given(
    shape=st.sampled_from([QWEN25_05B, QWEN25_15B, QWEN25_7B])
    | st.builds(
        TensorParallelShape,
        attention_heads=st.integers(1, 128),
        kv_heads=st.integers(1, 128),
        intermediate_size=st.integers(1, 1 << 16),
    ),
    gpus=st.integers(1, 64),
)
def test_the_size_is_the_largest_vllm_accepts(shape: TensorParallelShape, gpus: int) -> None:
    size = tensor_parallel_size(gpus, shape)
    assert 1 <= size <= gpus
    assert shape.attention_heads % size == 0 and shape.intermediate_size % size == 0
    assert size % shape.kv_heads == 0 or shape.kv_heads % size == 0
    assert not any(shape.splits_over(larger) for larger in range(size + 1, gpus + 1))


def test_a_model_without_gpus_or_with_a_prime_head_count_gets_one() -> None:
    assert tensor_parallel_size(0, QWEN25_7B) == 1
    assert (
        tensor_parallel_size(8, TensorParallelShape(attention_heads=7, kv_heads=7, intermediate_size=7 * 64))
        == 7
    )
    assert (
        tensor_parallel_size(8, TensorParallelShape(attention_heads=13, kv_heads=1, intermediate_size=4096))
        == 1
    )


def test_the_shape_is_read_from_config_json() -> None:
    config = {"num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960}
    assert TensorParallelShape.from_config(config) == QWEN25_15B
    # Without num_key_value_heads every head has its own key and value (multi-head attention).
    assert TensorParallelShape.from_config({"num_attention_heads": 8, "intermediate_size": 64}).kv_heads == 8
    nested = {"text_config": config, "model_type": "qwen2_5_vl"}
    assert TensorParallelShape.from_config(nested) == QWEN25_15B


def test_a_config_without_the_sizes_is_refused_with_their_names() -> None:
    with pytest.raises(EvaluationError, match="num_attention_heads, intermediate_size"):
        TensorParallelShape.from_config({"num_key_value_heads": 2})
