"""The example agent's ``sft`` phase: supervised fine-tuning on the train split's reference
solutions, in the evaluator's prompt format, with a hand-written training loop."""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autorl_agents.agent_log import log
from autorl_agents.cache_compat import forward, output_cache
from autorl_agents.example_config import sft_sizes
from autorl_agents.step_clock import StepClock

if TYPE_CHECKING:
    from autorl_agents.protocol import Agent

_CALCULATOR = re.compile(r"<<[^>]*>>")
#: Of the budget left when SFT starts, the most it takes to make its least steps (GRPO keeps the rest).
MAX_SHARE_FOR_LEAST_STEPS = 0.9
_FINAL_ANSWER = re.compile(r"\n?####\s*(.+?)\s*$")


def sft_target(answer: str) -> str:
    """A reference solution written the way the evaluator's worked examples answer.

    GSM8K-style answers carry calculator annotations (``<<3+4=7>>``) and end in ``#### 7``; the
    few-shot examples the evaluator shows have neither and end in ``The answer is 7``.
    """
    text = _CALCULATOR.sub("", answer).strip()
    match = _FINAL_ANSWER.search(text)
    if match is None:
        return text + "\n"
    reasoning = text[: match.start()].rstrip()
    final = f"The answer is {match.group(1)}\n"
    return f"{reasoning}\n{final}" if reasoning else final


def run_phase(agent: Agent, *, stop_at: float) -> None:
    """Supervised fine-tuning on the reference solutions, in the evaluator's prompt format.

    Every prompt starts with the same few-shot examples (~85% of its tokens). That shared
    prefix is encoded once per step, without gradient, and its cache is reused by the whole
    batch, so a step costs the question and answer tokens only: several times faster than
    encoding the full prompt per example, which is what makes SFT fit a CPU budget of minutes.
    """
    import torch

    from autorl_agents.precision import MasterWeightAdamW

    config = agent.config
    sizes = sft_sizes(config, tiny=agent.tiny)
    lr, batch_size = sizes.learning_rate, sizes.batch_size
    # The time share stops SFT only once it has made its least steps; before, it may take up to
    # MAX_SHARE_FOR_LEAST_STEPS of what is left (a loaded machine gives SFT more, GRPO less).
    share_stop = stop_at
    prompts = [
        agent.tokenizer(agent.task.render_prompt(agent.tokenizer, p.question)).input_ids
        for p in agent.problems
    ]
    eos = agent.tokenizer.eos_token or ""
    targets = [agent.tokenizer(sft_target(p.answer) + eos).input_ids for p in agent.problems]
    shared = common_prefix_length(prompts)
    device = agent.model.device
    prefix = torch.tensor([prompts[0][:shared]], device=device)
    pad_id = agent.tokenizer.pad_token_id if agent.tokenizer.pad_token_id is not None else 0
    steps_per_epoch = math.ceil(len(prompts) / batch_size)
    log(
        "phase_start",
        phase="sft",
        examples=len(prompts),
        epochs=config.sft_epochs,
        learning_rate=lr,
        shared_prefix_tokens=shared,
        budget_s=round(stop_at - time.time()),
        min_steps=sizes.min_steps,
    )
    optimizer = MasterWeightAdamW(agent.model.parameters(), lr=lr)
    generator = random.Random(config.seed)
    order = list(range(len(prompts)))
    agent.model.train()
    step, stopped, behind = 0, False, False
    clock = StepClock()
    least_stop = max(
        stop_at, clock.now() + MAX_SHARE_FOR_LEAST_STEPS * max(0.0, agent.stop_time() - clock.now())
    )
    for epoch in range(1, config.sft_epochs + 1):
        generator.shuffle(order)
        for start in range(0, len(order), batch_size):
            if not clock.has_room_before(share_stop if step >= sizes.min_steps else least_stop):
                stopped = True
                break
            clock.begin()
            batch = order[start : start + batch_size]
            inputs, labels, mask = sft_batch(
                [prompts[i][shared:] for i in batch], [targets[i] for i in batch], shared, pad_id
            )
            with torch.no_grad():
                cache = output_cache(forward(agent.model, prefix, use_cache=True))
            cache.batch_repeat_interleave(len(batch))
            positions = torch.arange(shared, shared + inputs.shape[1], device=device).expand(len(batch), -1)
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / 10)  # a short warm-up
            loss = forward(
                agent.model,
                inputs.to(device),
                cache=cache,
                attention_mask=mask.to(device),
                position_ids=positions,
                labels=labels.to(device),
                use_cache=False,
            ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.end()
            step += 1
            if step % config.logging_steps == 0:
                log(
                    "train",
                    phase="sft",
                    epoch=epoch,
                    step=step,
                    of=steps_per_epoch * config.sft_epochs,
                    loss=loss.item(),
                )
        if stopped:
            log(
                "phase_stop",
                phase="sft",
                reason="time",
                epoch=epoch,
                step=step,
                next_step_s=round(clock.step_estimate(), 1),
            )
            break
        left = steps_per_epoch * config.sft_epochs - step
        if epoch < config.sft_epochs and clock.ends_after(left, share_stop):
            # Behind its plan (a slow or loaded machine): an evaluation now would take cores from
            # training; the phase's last checkpoint is submitted.
            log("skip_submit", checkpoint=f"sft-epoch-{epoch}", reason="behind")
            behind = True
            continue
        agent.save_and_submit(f"sft-epoch-{epoch}", "sft")
        behind = False
    if stopped and (step % steps_per_epoch or behind):
        agent.save_and_submit("sft-final", "sft")
    agent.model.eval()
    del optimizer
    log("phase_end", phase="sft", steps=step)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens every sequence starts with, leaving each at least one token of its own."""
    first = sequences[0]
    length = min(len(s) for s in sequences) - 1
    for sequence in sequences[1:]:
        k = 0
        while k < length and sequence[k] == first[k]:
            k += 1
        length = k
    return max(0, length)


def sft_batch(
    prompt_tails: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], prefix_length: int, pad_id: int
) -> tuple[Any, Any, Any]:
    """Right-padded inputs (prompt tail + target), labels on the target only, and the attention
    mask over prefix + inputs."""
    import torch

    rows = [list(tail) + list(target) for tail, target in zip(prompt_tails, targets, strict=True)]
    width = max(len(row) for row in rows)
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), prefix_length + width), dtype=torch.long)
    mask[:, :prefix_length] = 1
    for i, (row, tail) in enumerate(zip(rows, prompt_tails, strict=True)):
        inputs[i, : len(row)] = torch.tensor(row)
        labels[i, len(tail) : len(row)] = torch.tensor(row[len(tail) :])
        mask[i, prefix_length : prefix_length + len(row)] = 1
    return inputs, labels, mask
