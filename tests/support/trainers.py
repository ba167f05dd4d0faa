"""Trainers built for tests that drive their steps by hand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autorl.tasks.base import Problem
    from autorl_agents.fast_grpo import FastGRPO, FastGRPOSettings


def trainer_for_updates(
    model: Any, tokenizer: Any, prompts: list[list[int]], problems: list[Problem], settings: FastGRPOSettings
) -> FastGRPO:
    """A :class:`FastGRPO` of ``problems`` (their tokenized ``prompts``) for a test that calls its
    ``update`` with advantages of its own: its reward, never asked, is 0 for every completion."""
    from autorl_agents.fast_grpo import FastGRPO

    return FastGRPO(
        model=model,
        tokenizer=tokenizer,
        prompts=prompts,
        answers=[p.answer for p in problems],
        reward=lambda completions, answers: [0.0] * len(completions),
        settings=settings,
    )
