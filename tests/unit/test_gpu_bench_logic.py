"""The pure parts of the GPU benchmarks bench/grpo_trl_vllm_gpu.py and bench/vllm_warm_reload_gpu.py:
variant names, step summaries, ratios within a call, joining calls' files, the padded tokenizer and
answer comparison (the measurements themselves run only on a GPU machine)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import grpo_trl_vllm_gpu
        import vllm_warm_reload_gpu

        yield grpo_trl_vllm_gpu, vllm_warm_reload_gpu
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


def test_variant_names_parse_and_give_trl_one_update_per_generation_batch(bench: Any) -> None:
    grpo, _ = bench
    variant = grpo.parse_variant("trl_vllm_64x8")
    assert (variant.engine, variant.prompts, variant.generations, variant.name) == (
        "trl_vllm",
        64,
        8,
        "trl_vllm_64x8",
    )
    assert variant.trl_batches() == (32, 16)
    assert grpo.parse_variant("fast_2x4").trl_batches() == (8, 1)
    assert grpo.parse_variant("trl_16x8").engine == "trl"
    for bad in ("vllm_2x4", "fast_2by4", "fast_0x4", "fast_2x1", "fast_40x2", "fast"):
        with pytest.raises(ValueError, match="variant"):
            grpo.parse_variant(bad)


def test_summary_leaves_out_the_warmup_step_and_keeps_every_reward(bench: Any) -> None:
    grpo, _ = bench
    steps = [
        {"seconds": 9.0, "completion_tokens": 100, "reward": -1.0},
        {"seconds": 2.0, "completion_tokens": 80, "reward": -0.5},
        {"seconds": 2.0, "completion_tokens": 120, "reward": 0.25},
    ]
    summary = grpo.summarise(steps, completions=4)
    assert summary["steps_timed"] == 2
    assert summary["completion_tokens_per_s"] == 50.0
    assert summary["step_s"] == 2.0
    assert summary["mean_completion_tokens"] == 25.0
    assert summary["reward_per_step"] == [-1.0, -0.5, 0.25]
    assert summary["warmup_step_s"] == 9.0
    with pytest.raises(ValueError, match="at least 2"):
        grpo.summarise(steps[:1], completions=4)


def test_ratios_pair_variants_of_one_size_and_merge_joins_calls(bench: Any) -> None:
    grpo, _ = bench
    first = {
        "date": "d1",
        "command": "c1",
        "environment": {"gpu": "g"},
        "variants": {
            "trl_vllm_2x4": {"completion_tokens_per_s": 100.0},
            "fast_2x4": {"completion_tokens_per_s": 50.0},
            "fast_16x8": {"completion_tokens_per_s": 900.0},
        },
    }
    second = {
        "date": "d2",
        "command": "c2",
        "variants": {
            "trl_vllm_16x8": {"completion_tokens_per_s": 300.0},
            "fast_64x8": {"status": "error"},
        },
    }
    assert grpo.ratios(first["variants"]) == {"fast_2x4_over_trl_vllm_2x4": 0.5}
    merged = grpo.merge([first, second])
    assert merged["calls"] == [{"date": "d1", "command": "c1"}, {"date": "d2", "command": "c2"}]
    assert merged["variants"]["trl_vllm_16x8"]["call"] == 1
    assert merged["environment"] == {"gpu": "g"}
    # Only ratios within one call: fast_16x8 (call 0) is not set against trl_vllm_16x8 (call 1).
    assert merged["ratios"] == {"fast_2x4_over_trl_vllm_2x4": 0.5}
    with pytest.raises(ValueError, match="two calls"):
        grpo.merge([first, first])


def test_padded_tokenizer_decodes_every_id_and_encodes_as_before(bench: Any, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    grpo, _ = bench
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: index for index, token in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    before = tokenizer.encode("12 + 30 = 42").ids
    size = len(vocab) + 1 + 40
    assert grpo.pad_vocabulary(tmp_path, size) == 40
    padded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert padded.get_vocab_size() == size
    assert padded.encode("12 + 30 = 42").ids == before
    added = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert sorted(added.values()) == [*range(len(vocab)), *range(len(vocab) + 1, size)]
    assert all(token.startswith("ĠQ") and token[2:].isalpha() for token in list(added)[len(vocab) :])
    # The library's BPE model decodes ids below its entry count (transformers, which vLLM and both
    # GRPO paths load it through, renumbers the special tokens past the padding, to the top ids).
    tokens = [padded.id_to_token(token_id) for token_id in range(len(vocab) + 1, size - 1)]
    assert all(token.startswith("ĠQ") and token[2:].isalpha() for token in tokens)
    assert padded.decode([len(vocab) + 1, len(vocab) + 2]) == " Qjx Qjy"
    assert len(json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))) == size - 1


def test_answer_comparison_counts_identical_rows_and_shared_leading_ids(bench: Any) -> None:
    _, reload = bench
    result = reload.compare([[1, 2, 3], [1, 2, 3], [4]], [[1, 2, 3], [1, 9, 3], [5, 6]])
    assert result == {"rows": 3, "identical": 1, "mean_identical_leading_ids": 1.3}
    with pytest.raises(ValueError, match="rows"):
        reload.compare([[1]], [])


def test_recorded_command_names_the_environment_and_puts_the_output_under_out(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    grpo, _ = bench
    monkeypatch.setenv("PYTHONPATH", "/root/site:.:bench")
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    monkeypatch.setattr(
        sys, "argv", ["bench/grpo_trl_vllm_gpu.py", "--output", "/tmp/x/r.json", "--steps", "2"]
    )
    assert grpo.command_line(Path("/tmp/x/r.json")) == (
        "PYTHONPATH=/root/site:.:bench python3 bench/grpo_trl_vllm_gpu.py --output $OUT/r.json --steps 2"
    )
