"""The hf backend's greedy engine gives the ids plain ``generate`` gives, on the CPU in float32.

The reference is transformers ``generate`` called one prompt at a time (no padding, no shared
prefix, its own cache and attention) on ``builtin:tiny-qwen2`` with random weights that make long,
varied completions. The engine runs its own paths on the same prompts: the GSM8K
few-shot prefix computed once, rows sorted and split into several batches, left padding, rows
stopping at their own limit or their first eos and then dropped from the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autorl.decoding import greedy_engine
from autorl.decoding.greedy_engine import generate_greedy
from autorl.tasks import get_task
from autorl_evaluator.backends.opencompass.compass_models.padded_attention import use_padded_attention
from tests.support.models import greedy_ids, poison_padding

pytestmark = pytest.mark.slow

NEW_TOKENS = 20
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def model_and_prompts(
    tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any, list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_model, dtype=torch.float32).eval()
    _widen_weights(model, torch.Generator().manual_seed(0))
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path_factory.mktemp("data"), source_dir=DATA)[:6]
    prompts = [
        tokenizer(task.render_prompt(tokenizer, problem.question), add_special_tokens=False)["input_ids"]
        for problem in problems
    ]
    return model, tokenizer, prompts


def _widen_weights(model: Any, generator: Any) -> None:
    """Redraw every weight but the norms with a wide spread. Small initial weights answer every
    prompt with the same id; wide ones write long, varied completions, so that any wrong id would
    show."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.3, generator=generator)


@pytest.fixture(scope="module")
def reference(model_and_prompts: tuple[Any, Any, list[list[int]]]) -> list[list[int]]:
    model, tokenizer, prompts = model_and_prompts
    return greedy_ids(model, prompts, NEW_TOKENS, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)


def test_same_ids_as_generate_with_the_shared_prefix_and_several_batches(
    model_and_prompts: tuple[Any, Any, list[list[int]]], reference: list[list[int]]
) -> None:
    model, tokenizer, prompts = model_and_prompts
    output = generate_greedy(
        model, prompts, max_new_tokens=NEW_TOKENS, eos_ids=[], pad_id=tokenizer.pad_token_id, max_batch_size=4
    )
    assert output.engine == "greedy"
    assert output.batch_sizes == [4, 2]
    # The four exemplars: most of every prompt.
    assert output.shared_prefix > 0.8 * min(len(p) for p in prompts)
    assert output.tokens == reference
    assert len({tuple(ids) for ids in reference}) > 1, "the reference must not be one repeated answer"


def test_same_ids_as_generate_for_prompts_that_share_nothing(
    model_and_prompts: tuple[Any, Any, list[list[int]]],
) -> None:
    model, tokenizer, prompts = model_and_prompts
    # Different lengths and no common first id: left padding in the batch, no shared prefix.
    unrelated = [prompts[0][-40:], prompts[1][-9:], prompts[2][-23:]]
    expected = greedy_ids(
        model, unrelated, NEW_TOKENS, eos_token_id=None, pad_token_id=tokenizer.pad_token_id
    )
    output = generate_greedy(
        model, unrelated, max_new_tokens=NEW_TOKENS, eos_ids=[], pad_id=tokenizer.pad_token_id
    )
    assert output.shared_prefix == 0
    assert output.tokens == expected


def test_a_padding_slot_adds_nothing_to_a_row_whatever_the_weights_compute_for_it(
    tiny_base_model: Path, model_and_prompts: tuple[Any, Any, list[list[int]]]
) -> None:
    """Weights whose pad token alone computes an infinite value: each row answers in a batch
    (left-padded) as it answers alone, through the engine and through ``generate`` with the
    platform's attention (architectures the engine does not know)."""
    import torch
    from transformers import AutoModelForCausalLM

    _, tokenizer, prompts = model_and_prompts
    rows = [prompts[0][-40:], prompts[1][-9:], prompts[2][-23:]]
    model = AutoModelForCausalLM.from_pretrained(
        tiny_base_model, dtype=torch.float32, attn_implementation=use_padded_attention()
    ).eval()
    with torch.no_grad():
        _widen_weights(model, torch.Generator().manual_seed(0))
        poison_padding(model.state_dict(), tokenizer.pad_token_id)
    alone = greedy_ids(model, rows, NEW_TOKENS, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    engine = generate_greedy(
        model, rows, max_new_tokens=NEW_TOKENS, eos_ids=[], pad_id=tokenizer.pad_token_id
    )
    with torch.inference_mode():
        padded = greedy_engine._generate_batch(model, rows, [NEW_TOKENS] * 3, [], tokenizer.pad_token_id, {})
    assert engine.tokens == padded == alone
    assert len({tuple(ids) for ids in alone}) == 3


def test_rows_stop_at_their_limit_or_first_eos_and_finished_rows_leave_the_batch(
    model_and_prompts: tuple[Any, Any, list[list[int]]],
    reference: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, tokenizer, prompts = model_and_prompts
    # An id that the reference writes in the middle of a row (not at its start), as the eos.
    eos = next(ids[10] for ids in reference if ids[10] not in ids[:10])
    limits = [3, 20, 9, 12, 20, 5]
    expected = []
    for ids, limit in zip(reference, limits, strict=True):
        ids = ids[:limit]
        expected.append(ids[: ids.index(eos) + 1] if eos in ids else ids)
    kept: list[int] = []
    real_keep = greedy_engine.SlotCache.keep

    def counting_keep(cache: Any, index: Any) -> None:
        kept.append(int(index.shape[0]))
        real_keep(cache, index)

    monkeypatch.setattr(greedy_engine.SlotCache, "keep", counting_keep)
    output = generate_greedy(
        model, prompts, max_new_tokens=limits, eos_ids=[eos], pad_id=tokenizer.pad_token_id
    )
    assert output.tokens == expected
    assert any(ids[-1] == eos for ids in output.tokens), "some row must stop at the eos"
    assert kept and kept[0] < len(prompts), "finished rows must be dropped from the batch"


@pytest.mark.parametrize("model_type", sorted(greedy_engine.SUPPORTED_MODEL_TYPES))
def test_every_supported_architecture_decodes_as_generate_does(model_type: str) -> None:
    """A tiny random model of each architecture the engine claims, built here from its config class:
    the engine runs (not the ``generate`` fallback), through the shared prefix, left padding and two
    batches, and writes the ids ``generate`` writes one prompt at a time."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    _widen_weights(model, generator)
    shared = torch.randint(1, 96, (12,), generator=generator).tolist()
    prompts = [shared + torch.randint(1, 96, (n,), generator=generator).tolist() for n in (3, 7, 5)]
    expected = greedy_ids(model, prompts, 8, eos_token_id=None, pad_token_id=0)
    output = generate_greedy(model, prompts, max_new_tokens=8, eos_ids=[], pad_id=0, max_batch_size=2)
    assert (output.engine, output.batch_sizes, output.shared_prefix) == ("greedy", [2, 1], len(shared))
    assert output.tokens == expected
    assert len({tuple(ids) for ids in expected}) > 1, "the reference must not be one repeated answer"


def test_bad_requests_are_refused(model_and_prompts: tuple[Any, Any, list[list[int]]]) -> None:
    model, _, prompts = model_and_prompts
    with pytest.raises(ValueError, match="no empty prompt"):
        generate_greedy(model, [prompts[0], []], max_new_tokens=4, eos_ids=[], pad_id=0)
    with pytest.raises(ValueError, match="at least 1, once or once per prompt"):
        generate_greedy(model, prompts[:2], max_new_tokens=[4], eos_ids=[], pad_id=0)


class _TickingClock:
    """``time.monotonic`` that moves one second at each reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("engine", ["greedy", "generate"])
def test_a_deadline_ends_the_generation_inside_a_batch(
    model_and_prompts: tuple[Any, Any, list[list[int]]], monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """An evaluation's time budget: the deadline is read before each batch and while a batch decodes
    (the engine's checks for finished rows, each step of ``generate``), so one long batch is stopped
    too. The clock passes the deadline right after the batch has begun."""
    model, tokenizer, prompts = model_and_prompts
    if engine == "generate":
        monkeypatch.setattr(greedy_engine, "SUPPORTED_MODEL_TYPES", frozenset())
    clock = _TickingClock()
    monkeypatch.setattr(greedy_engine, "time", clock)
    with pytest.raises(greedy_engine.DeadlineExceededError):
        generate_greedy(
            model, prompts, max_new_tokens=NEW_TOKENS, eos_ids=[], pad_id=tokenizer.pad_token_id, deadline=2.5
        )
    assert 2 < clock.now < NEW_TOKENS  # read again within the batch, not after it
