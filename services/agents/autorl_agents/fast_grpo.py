"""GRPO steps with fast rollouts, for the example agent on a CUDA GPU.

The algorithm and reward are those the example agent runs through TRL's ``GRPOTrainer`` with its
settings (one policy update per generation batch, no KL term, ``loss_type="dapo"``, rewards
scaled by each group's standard deviation, AdamW at a constant learning rate, gradients clipped at
norm 1); only the work around the model differs:

- **Rollouts** come from :func:`autorl.decoding.greedy_engine.generate_sampled`: every completion
  of the step in one batch, the prompts' shared few-shot prefix computed once, a preallocated
  cache, CUDA graphs, finished rows dropped; ids drawn from ``softmax(logits / temperature)``.
- **The loss** reads the shared prefix's keys and values once per micro-batch, without gradient
  (no parameter's gradient flows through them: they would only carry the prefix's own
  log-probabilities, which the loss does not use), so each row's forward and backward pass
  covers its own prompt tail and completion.

With one update per generation batch the policy that sampled is the policy being updated, so
the importance ratio is 1 and the DAPO loss is ``-sum(A_i * log p(token)) / completion tokens``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autorl_agents.agent_log import log
from autorl_agents.cache_compat import forward, output_cache
from autorl_agents.example_config import GRPOSizes
from autorl_agents.step_clock import StepClock

#: Rows per forward/backward pass of the loss.
LOSS_MICRO_BATCH = 32
#: TRL's epsilon in ``(r - mean) / (std + eps)``.
ADVANTAGE_EPS = 1e-4


@dataclass
class StepStats:
    step: int
    reward: float
    loss: float
    completions: int
    completion_tokens: int
    rollout_s: float
    train_s: float

    @property
    def seconds(self) -> float:
        return self.rollout_s + self.train_s


@dataclass
class FastGRPOSettings:
    prompts_per_step: int
    num_generations: int
    max_completion_length: int
    learning_rate: float
    temperature: float = 1.0
    seed: int = 0
    loss_micro_batch: int = LOSS_MICRO_BATCH


def group_advantages(rewards: Sequence[float], group: int) -> list[float]:
    """TRL's ``scale_rewards="group"``: each reward minus its group's mean, over the group's
    (unbiased) standard deviation plus :data:`ADVANTAGE_EPS`."""
    if group < 2 or len(rewards) % group:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group} (at least 2)")
    advantages: list[float] = []
    for start in range(0, len(rewards), group):
        values = rewards[start : start + group]
        mean = sum(values) / group
        std = (sum((v - mean) ** 2 for v in values) / (group - 1)) ** 0.5
        advantages += [(v - mean) / (std + ADVANTAGE_EPS) for v in values]
    return advantages


@dataclass
class FastGRPO:
    """GRPO on ``prompts`` (token ids, one per problem) with ``reward(completions, answers)``."""

    model: Any
    tokenizer: Any
    prompts: list[list[int]]
    answers: list[str]
    reward: Callable[[list[str], list[str]], Sequence[float | None]]
    settings: FastGRPOSettings
    eos_ids: list[int] = field(default_factory=list)
    step_count: int = 0

    def __post_init__(self) -> None:

        from autorl.decoding.greedy_engine import shared_prefix_length
        from autorl_agents.precision import MasterWeightAdamW

        if self.settings.num_generations < 2:
            raise ValueError("GRPO needs at least 2 generations per prompt")
        # transformers renamed the flag (the old name warns where the new one exists).
        checkpointing = getattr(self.model, "is_activation_checkpointing", None)
        if checkpointing is None:
            checkpointing = getattr(self.model, "is_gradient_checkpointing", False)
        if checkpointing:
            # The shared prefix's cache needs use_cache, which checkpointing turns off; the loss
            # covers only prompt tails and completions, whose activations fit without it.
            self.model.gradient_checkpointing_disable()
        self.shared = shared_prefix_length(self.prompts)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if not self.eos_ids:
            self.eos_ids = [self.tokenizer.eos_token_id]
        self.optimizer = MasterWeightAdamW(self.model.parameters(), lr=self.settings.learning_rate)
        self.order: list[int] = []
        self.epoch = 0
        self.random = random.Random(self.settings.seed)

    def steps_per_epoch(self) -> int:
        return -(-len(self.prompts) // self.settings.prompts_per_step)

    def next_problems(self) -> list[int]:
        """The next step's problem indices, a shuffled pass over the problems per epoch."""
        if not self.order:
            self.order = list(range(len(self.prompts)))
            self.random.shuffle(self.order)
            self.epoch += 1
        chosen, self.order = (
            self.order[: self.settings.prompts_per_step],
            self.order[self.settings.prompts_per_step :],
        )
        return chosen

    def epoch_finished(self) -> bool:
        return not self.order

    def step(self) -> StepStats:
        """One generation batch and one policy update."""
        import torch

        from autorl.decoding.greedy_engine import generate_sampled

        problems = self.next_problems()
        group = self.settings.num_generations
        rows = [i for i in problems for _ in range(group)]
        started = time.monotonic()
        self.model.eval()
        output = generate_sampled(
            self.model,
            [self.prompts[i] for i in rows],
            temperature=self.settings.temperature,
            max_new_tokens=self.settings.max_completion_length,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            max_batch_size=len(rows),
        )
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        rollout_s = time.monotonic() - started
        started = time.monotonic()
        texts = self.tokenizer.batch_decode(output.tokens, skip_special_tokens=True)
        rewards = [
            float(r) if r is not None else 0.0 for r in self.reward(texts, [self.answers[i] for i in rows])
        ]
        advantages = group_advantages(rewards, group)
        loss = self.update(rows, output.tokens, advantages)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        self.step_count += 1
        return StepStats(
            step=self.step_count,
            reward=sum(rewards) / len(rewards),
            loss=loss,
            completions=len(rows),
            completion_tokens=sum(len(ids) for ids in output.tokens),
            rollout_s=rollout_s,
            train_s=time.monotonic() - started,
        )

    def update(self, rows: list[int], completions: list[list[int]], advantages: list[float]) -> float:
        """One optimizer step on `-sum(advantage * log p(completion id))` over all completion ids
        (prompt `rows[i]` followed by `completions[i]`), divided by their count; with every
        advantage 1 this is supervised fine-tuning on the completions. Returns the loss."""
        import torch

        model = self.model
        device = model.device
        total_tokens = max(1, sum(len(ids) for ids in completions))
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        prefix = torch.tensor([self.prompts[rows[0]][: self.shared]], device=device)
        loss_sum = 0.0
        micro = self.settings.loss_micro_batch
        for start in range(0, len(rows), micro):
            batch = range(start, min(len(rows), start + micro))
            tails = [self.prompts[rows[i]][self.shared :] for i in batch]
            inputs, targets, weights, mask = _loss_batch(
                tails,
                [completions[i] for i in batch],
                [advantages[i] for i in batch],
                self.shared,
                self.pad_id,
            )
            cache = None
            if self.shared:
                with torch.no_grad():
                    cache = output_cache(forward(model, prefix, use_cache=True))
                cache.batch_repeat_interleave(len(batch))
            positions = torch.arange(self.shared, self.shared + inputs.shape[1], device=device)
            logits = forward(
                model,
                inputs.to(device),
                cache=cache,
                attention_mask=mask.to(device),
                position_ids=positions.expand(len(batch), -1),
                use_cache=False,
            ).logits
            targets, weights = targets.to(device), weights.to(device)
            chosen = targets >= 0
            log_probs = -torch.nn.functional.cross_entropy(
                logits[chosen].float(), targets[chosen], reduction="none"
            )
            loss = -(log_probs * weights[chosen]).sum() / total_tokens
            loss.backward()
            loss_sum += loss.item()
            del logits, log_probs, loss, cache
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        return loss_sum


def _loss_batch(
    tails: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    advantages: Sequence[float],
    prefix_length: int,
    pad_id: int,
) -> tuple[Any, Any, Any, Any]:
    """Right-padded inputs (prompt tail + completion); per position the id it predicts (-100
    outside the completion) and its advantage; the attention mask over prefix + inputs."""
    import torch

    width = max(len(t) + len(c) for t, c in zip(tails, completions, strict=True))
    inputs = torch.full((len(tails), width), pad_id, dtype=torch.long)
    targets = torch.full((len(tails), width), -100, dtype=torch.long)
    weights = torch.zeros((len(tails), width), dtype=torch.float32)
    mask = torch.zeros((len(tails), prefix_length + width), dtype=torch.long)
    mask[:, :prefix_length] = 1
    for row, (tail, completion, advantage) in enumerate(zip(tails, completions, advantages, strict=True)):
        ids = list(tail) + list(completion)
        inputs[row, : len(ids)] = torch.tensor(ids)
        mask[row, prefix_length : prefix_length + len(ids)] = 1
        # The logits at position p predict id p + 1: completion id j is predicted at len(tail) - 1 + j.
        first = len(tail) - 1
        targets[row, first : first + len(completion)] = torch.tensor(list(completion))
        weights[row, first : first + len(completion)] = advantage
    return inputs, targets, weights, mask


def run_phase(agent: Any, *, stop_at: float, sizes: GRPOSizes, completion_limit: int) -> None:
    """The example agent's ``grpo`` phase on this path: epochs over the train prompts, a
    submission after each, a stop at ``stop_at`` (and a submission of what it left)."""
    config = agent.config
    trainer = FastGRPO(
        model=agent.model,
        tokenizer=agent.tokenizer,
        prompts=[
            agent.tokenizer(agent.task.render_prompt(agent.tokenizer, p.question)).input_ids
            for p in agent.problems
        ],
        answers=[p.answer for p in agent.problems],
        reward=lambda completions, answers: agent.task.reward(completions, answers),
        settings=FastGRPOSettings(
            prompts_per_step=sizes.prompts_per_step,
            num_generations=sizes.num_generations,
            max_completion_length=completion_limit,
            learning_rate=sizes.learning_rate,
            seed=config.seed,
        ),
        eos_ids=_eos_ids(agent),
    )
    total = trainer.steps_per_epoch() * config.grpo_epochs
    log(
        "phase_start",
        phase="grpo",
        rollouts="fast",
        prompts=len(trainer.prompts),
        epochs=config.grpo_epochs,
        learning_rate=sizes.learning_rate,
        num_generations=sizes.num_generations,
        max_completion_length=completion_limit,
        shared_prefix_tokens=trainer.shared,
        budget_s=round(stop_at - time.time()),
    )
    stopped = False
    clock = StepClock()
    while trainer.step_count < total:
        if not clock.has_room_before(stop_at):
            stopped = True
            log(
                "phase_stop",
                phase="grpo",
                reason="time",
                step=trainer.step_count,
                next_step_s=round(clock.step_estimate(), 1),
            )
            break
        clock.begin()
        stats = trainer.step()
        clock.end()
        if stats.step % config.logging_steps == 0 or stats.step == 1:
            log(
                "train",
                phase="grpo",
                step=stats.step,
                reward=stats.reward,
                loss=stats.loss,
                completion_tokens_per_s=stats.completion_tokens / stats.seconds,
            )
        if trainer.epoch_finished():
            agent.save_and_submit(f"grpo-epoch-{trainer.epoch}", "grpo")
    if stopped and not trainer.epoch_finished():
        agent.save_and_submit("grpo-final", "grpo")
    del trainer.optimizer
    log("phase_end", phase="grpo", steps=trainer.step_count)


def _eos_ids(agent: Any) -> list[int]:
    eos = agent.model.generation_config.eos_token_id
    ids = {eos} if isinstance(eos, int) else set(eos or ())
    if agent.tokenizer.eos_token_id is not None:
        ids.add(agent.tokenizer.eos_token_id)
    return sorted(ids)
