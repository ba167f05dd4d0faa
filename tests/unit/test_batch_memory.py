"""Batch sizing from free GPU memory and the shared-prefix rule of the greedy engine."""

from __future__ import annotations

import pytest

from autorl.decoding.batch_memory import ModelShape, aligned_slots, rows_that_fit
from autorl.decoding.greedy_engine import shared_prefix_length

GiB = 2**30
#: Qwen2.5-1.5B in bf16.
QWEN25_1_5B = ModelShape(
    layers=28, heads=12, kv_heads=2, head_dim=128, hidden=1536, intermediate=8960, vocab=151936, dtype_bytes=2
)
#: A GSM8K evaluation row: up to 202 own prompt ids after the 1,441 shared, then 512 new tokens.
ROW_SLOTS = aligned_slots(202 + 511, 128)
SHARED = 1441


@pytest.mark.parametrize("free_gib", [136, 76])
def test_the_whole_gsm8k_split_is_one_batch_on_an_h200_and_an_80_gb_card(free_gib: int) -> None:
    assert rows_that_fit(free_gib * GiB, QWEN25_1_5B, ROW_SLOTS, SHARED) >= 1319


def test_a_24_gb_card_gets_a_smaller_batch_that_fits_it() -> None:
    l4 = rows_that_fit(18 * GiB, QWEN25_1_5B, ROW_SLOTS, SHARED)
    assert 1319 > l4 > 64
    # What the batch plans for stays inside the free memory.
    per_row = QWEN25_1_5B.slot_bytes * ROW_SLOTS + QWEN25_1_5B.decode_row_bytes(SHARED + ROW_SLOTS)
    assert l4 * per_row + QWEN25_1_5B.prefill_workspace_bytes(SHARED + ROW_SLOTS) < 18 * GiB


def test_longer_rows_mean_fewer_rows() -> None:
    assert rows_that_fit(76 * GiB, QWEN25_1_5B, 4 * ROW_SLOTS, SHARED) < rows_that_fit(
        76 * GiB, QWEN25_1_5B, ROW_SLOTS, SHARED
    )


def test_no_room_still_tries_one_row() -> None:
    assert rows_that_fit(GiB // 4, QWEN25_1_5B, ROW_SLOTS, SHARED) == 1


@pytest.mark.parametrize(
    ("prompts", "shared"),
    [
        ([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], 2),
        ([[7, 1], [8, 1]], 0),
        # The last id of the shortest prompt is never shared: its logits start that row.
        ([[1, 2, 3], [1, 2, 3, 4]], 2),
        ([[5, 6, 7]], 2),
        ([[4], [4, 5]], 0),
    ],
)
def test_shared_prefix_length(prompts: list[list[int]], shared: int) -> None:
    assert shared_prefix_length(prompts) == shared
