"""Training a model held in bfloat16 at the small learning rates of RL fine-tuning: updates add up
in float32 copies instead of rounding away in the bfloat16 weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from autorl_agents.precision import MasterWeightAdamW

LEARNING_RATE = 1e-5
STEPS = 40


def _train(layer: torch.nn.Linear, optimizer: torch.optim.Optimizer) -> None:
    inputs = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    target = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    for _ in range(STEPS):
        output = layer(inputs.to(layer.weight.dtype)).float()
        loss = torch.nn.functional.mse_loss(output, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _layers() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    reference = torch.nn.Linear(64, 64)
    with torch.no_grad():  # weights of a pretrained model's size
        reference.weight.normal_(0.0, 0.02)
    return reference, copy.deepcopy(reference).to(torch.bfloat16)


def _agreement(moved: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """How a bfloat16 model's displacement from its initial weights compares with float32 training's:
    the ratio of their norms and their cosine."""
    moved, reference = moved.flatten().float(), reference.flatten().float()
    cosine = (moved @ reference / (moved.norm() * reference.norm())).item()
    return (moved.norm() / reference.norm()).item(), cosine


def _displacements(optimizer: type[torch.optim.AdamW]) -> tuple[float, float]:
    reference, model = _layers()
    initial = reference.weight.detach().clone()
    _train(reference, torch.optim.AdamW(reference.parameters(), lr=LEARNING_RATE, weight_decay=0.0))
    _train(model, optimizer(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0))
    assert model.weight.dtype == torch.bfloat16  # the model keeps its dtype (generation speed)
    return _agreement(model.weight.detach().float() - initial, reference.weight.detach() - initial)


def test_small_updates_of_a_bfloat16_model_follow_float32_training() -> None:
    ratio, cosine = _displacements(MasterWeightAdamW)
    assert 0.9 < ratio < 1.1
    assert cosine > 0.98


def test_plain_adamw_on_bfloat16_weights_loses_those_updates() -> None:
    """The failure the optimizer exists for: stepping the bfloat16 weights themselves."""
    ratio, cosine = _displacements(torch.optim.AdamW)
    assert ratio < 0.6
    assert cosine < 0.6


def test_a_float32_model_is_stepped_as_plain_adamw_does() -> None:
    reference, _ = _layers()
    model = copy.deepcopy(reference)
    _train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.0))
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-3)
    assert all(m is p for m, p in zip(optimizer.masters, optimizer.model_params, strict=True))
    _train(model, optimizer)
    assert torch.equal(model.weight, reference.weight)


@pytest.mark.slow
def test_fast_grpo_updates_a_bfloat16_model_at_an_rl_learning_rate(tiny_base_model: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.tasks import get_task
    from autorl_agents.fast_grpo import FastGRPOSettings
    from tests.support.trainers import trainer_for_updates

    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
    task = get_task("arith")
    problems = task.train_problems()[:4]
    prompts = [tokenizer(task.render_prompt(tokenizer, p.question)).input_ids for p in problems]

    def trained(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(tiny_base_model, dtype=dtype).eval()
        initial = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        settings = FastGRPOSettings(
            prompts_per_step=4, num_generations=2, max_completion_length=4, learning_rate=1e-5
        )
        trainer = trainer_for_updates(model, tokenizer, prompts, problems, settings)
        for _ in range(30):  # enough for float32 copies to cross bfloat16's spacing
            trainer.update([0, 1, 2, 3], [[7, 8, 9], [10, 11], [12], [13, 14]], [1.0, -1.0, 1.0, -1.0])
        assert next(model.parameters()).dtype == dtype
        return torch.cat([p.detach().float().flatten() for p in model.parameters()]), initial

    reference, reference_initial = trained(torch.float32)
    moved, initial = trained(torch.bfloat16)
    ratio, cosine = _agreement(moved - initial, reference - reference_initial)
    # Stepping the bfloat16 weights themselves gives about 0.2 and 0.2 here.
    assert 0.8 < ratio < 1.3
    assert cosine > 0.7
