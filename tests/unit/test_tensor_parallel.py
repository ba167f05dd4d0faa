"""tensor_parallel_size: the largest power of two not above the GPU count, at least 1."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autorl_evaluator.parallel import tensor_parallel_size


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (-1, 1),
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 2),
        (4, 4),
        (5, 4),
        (6, 4),
        (7, 4),
        (8, 8),
        (9, 8),
        (15, 8),
        (16, 16),
    ],
)
def test_known_counts(gpus: int, expected: int) -> None:
    assert tensor_parallel_size(gpus) == expected


@given(st.integers(min_value=1, max_value=1 << 20))
def test_largest_power_of_two_not_above_the_count(gpus: int) -> None:
    size = tensor_parallel_size(gpus)
    assert size & (size - 1) == 0, "a power of two"
    assert size <= gpus < 2 * size
