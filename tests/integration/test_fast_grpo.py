"""The example agent's fast GRPO path on the CPU in float32: sampled rollouts follow the model's
distribution, and the update's loss (shared prefix read once, without gradient) is the DAPO loss
computed over whole prompts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from autorl.decoding.greedy_engine import generate_greedy, generate_sampled
from autorl.tasks import get_task
from autorl_agents.example_config import GRPOSizes
from autorl_agents.fast_grpo import ADVANTAGE_EPS, FastGRPO, FastGRPOSettings, group_advantages
from tests.support.trainers import trainer_for_updates

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def model_and_prompts(
    tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any, list[Any]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_model, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # wide weights: peaked, varied next-token distributions
        for name, parameter in model.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.3, generator=generator)
    task = get_task("gsm8k")
    problems = task.load_test_problems(tmp_path_factory.mktemp("data"), source_dir=DATA)[:4]
    return model, tokenizer, problems


def _prompts(tokenizer: Any, problems: list[Any]) -> list[list[int]]:
    task = get_task("gsm8k")
    return [tokenizer(task.render_prompt(tokenizer, p.question)).input_ids for p in problems]


def test_sampled_first_ids_follow_the_softmax(model_and_prompts: tuple[Any, Any, list[Any]]) -> None:
    import torch

    model, tokenizer, problems = model_and_prompts
    prompt = _prompts(tokenizer, problems)[0]
    temperature = 2.0
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    expected = torch.softmax(logits / temperature, -1)
    torch.manual_seed(0)
    rows = 3000
    output = generate_sampled(
        model, [prompt] * rows, temperature=temperature, max_new_tokens=1, eos_ids=[], pad_id=0
    )
    counts = torch.bincount(torch.tensor([ids[0] for ids in output.tokens]), minlength=expected.numel())
    observed = counts.double() / rows
    # Every frequent id within 4 standard errors of its probability, and no id drawn the model
    # gives (almost) no chance.
    for token in torch.nonzero(expected > 0.02).flatten().tolist():
        p = expected[token].item()
        assert abs(observed[token].item() - p) < 4 * math.sqrt(p * (1 - p) / rows), token
    assert expected[counts > 0].min() > 1e-6
    assert len(set(ids[0] for ids in output.tokens)) > 1


def test_a_vanishing_temperature_samples_the_greedy_ids(
    model_and_prompts: tuple[Any, Any, list[Any]],
) -> None:
    model, tokenizer, problems = model_and_prompts
    prompts = _prompts(tokenizer, problems)
    greedy = generate_greedy(model, prompts, max_new_tokens=12, eos_ids=[], pad_id=0).tokens
    sampled = generate_sampled(
        model, prompts, temperature=1e-6, max_new_tokens=12, eos_ids=[], pad_id=0
    ).tokens
    assert sampled == greedy
    with pytest.raises(ValueError, match="temperature must be positive"):
        generate_sampled(model, prompts, temperature=0.0, max_new_tokens=1, eos_ids=[], pad_id=0)


def test_group_advantages_are_trls() -> None:
    rewards = [1.0, -1.0, -1.0, -1.0, 0.5, 0.5, 0.5, 0.5]
    advantages = group_advantages(rewards, 4)
    std = math.sqrt((1.5**2 + 3 * 0.5**2) / 3)  # unbiased, as torch.std
    assert advantages[:4] == pytest.approx([1.5 / (std + ADVANTAGE_EPS)] + [-0.5 / (std + ADVANTAGE_EPS)] * 3)
    assert advantages[4:] == [0.0] * 4  # a group with one reward teaches nothing
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(rewards[:6], 4)


def test_the_update_minimises_the_dapo_loss_over_whole_prompts(
    model_and_prompts: tuple[Any, Any, list[Any]],
) -> None:
    import copy

    import torch

    model, tokenizer, problems = model_and_prompts
    model = copy.deepcopy(model)
    prompts = _prompts(tokenizer, problems)
    completions = [[7, 8, 9], [10, 11], [12], [13, 14, 15, 16]]
    advantages = [0.5, -1.0, 2.0, -0.25]
    # The reference: whole prompt + completion through the model, no cache, no shared prefix.
    total, expected = sum(len(c) for c in completions), 0.0
    with torch.no_grad():
        for prompt, completion, advantage in zip(prompts, completions, advantages, strict=True):
            ids = torch.tensor([prompt + completion])
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            for j, token in enumerate(completion):
                expected -= advantage * log_probs[len(prompt) - 1 + j, token].item() / total
    trainer = trainer_for_updates(
        model,
        tokenizer,
        prompts,
        problems,
        FastGRPOSettings(
            prompts_per_step=2,
            num_generations=2,
            max_completion_length=4,
            learning_rate=1e-3,
            loss_micro_batch=3,
        ),
    )
    assert trainer.shared > 1000  # the few-shot turns are read once per micro-batch
    before = [p.detach().clone() for p in model.parameters()]
    loss = trainer.update([0, 1, 2, 3], completions, advantages)
    assert loss == pytest.approx(expected, rel=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_step_samples_groups_and_counts_their_tokens(model_and_prompts: tuple[Any, Any, list[Any]]) -> None:
    import copy

    model, tokenizer, problems = model_and_prompts
    task = get_task("gsm8k")
    model = copy.deepcopy(model)
    # As TRL's GRPOTrainer leaves a model: checkpointing on, which would turn the prefix cache off.
    model.gradient_checkpointing_enable()
    trainer = FastGRPO(
        model=model,
        tokenizer=tokenizer,
        prompts=_prompts(tokenizer, problems),
        answers=[p.answer for p in problems],
        reward=lambda completions, answers: task.reward(completions, answers),
        settings=FastGRPOSettings(
            prompts_per_step=2, num_generations=3, max_completion_length=5, learning_rate=1e-4
        ),
    )
    first = trainer.step()
    assert (first.step, first.completions) == (1, 6)
    assert 6 <= first.completion_tokens <= 30 and first.reward == -1.0  # random weights never answer
    assert not trainer.epoch_finished()
    trainer.step()
    assert trainer.epoch_finished() and trainer.epoch == 1 and trainer.steps_per_epoch() == 2


class _Agent:
    """The example agent's parts that its GRPO phase uses, with real model, tokenizer and task;
    submissions are recorded instead of sent to a grader."""

    def __init__(self, model: Any, tokenizer: Any, problems: list[Any], **settings: Any) -> None:
        from autorl_agents.example_config import ExampleGRPOConfig

        self.model, self.tokenizer, self.problems = model, tokenizer, problems
        self.task = get_task("gsm8k")
        self.config = ExampleGRPOConfig(**settings)
        self.submitted: list[tuple[str, str]] = []

    def save_and_submit(self, name: str, phase: str) -> None:
        self.submitted.append((name, phase))


def test_the_phase_submits_after_each_epoch_and_at_a_stop(
    model_and_prompts: tuple[Any, Any, list[Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    import copy
    import time

    from autorl_agents.fast_grpo import run_phase

    model, tokenizer, problems = model_and_prompts
    settings = {"grpo_epochs": 2, "logging_steps": 1}
    sizes = GRPOSizes(learning_rate=1e-4, num_generations=2, prompts_per_step=2)
    agent = _Agent(copy.deepcopy(model), tokenizer, problems, **settings)
    run_phase(agent, stop_at=time.time() + 600, sizes=sizes, completion_limit=3)
    assert agent.submitted == [("grpo-epoch-1", "grpo"), ("grpo-epoch-2", "grpo")]
    out = capsys.readouterr().out
    assert "event=phase_start phase=grpo rollouts=fast" in out and "event=phase_end phase=grpo steps=4" in out
    stopped = _Agent(copy.deepcopy(model), tokenizer, problems, **settings)
    run_phase(stopped, stop_at=time.time() - 1, sizes=sizes, completion_limit=3)
    assert stopped.submitted == []  # stopped before any step: nothing new to submit
