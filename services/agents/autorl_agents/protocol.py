"""What a training phase is given: the agent protocol.

A phase (``sft.run_phase``, the GRPO phases of ``example_grpo``) works on one run's shared state
(the model, the tokenizer, the task, the train problems, the settings) and submits through it. It
reads that state through this protocol, not through the example agent's class, so a phase module
never imports the agent that runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autorl.tasks.base import Problem, Task
    from autorl_agents.example_config import ExampleGRPOConfig


class Agent(Protocol):
    """One run of an agent, as its phases see it."""

    @property
    def config(self) -> ExampleGRPOConfig: ...

    @property
    def task(self) -> Task: ...

    @property
    def problems(self) -> Sequence[Problem]:
        """The train problems the run uses."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The base model's tokenizer (transformers)."""
        ...

    @property
    def model(self) -> Any:
        """The causal language model being trained (transformers)."""
        ...

    @property
    def tiny(self) -> bool:
        """Whether the model is small enough that the tiny model's settings apply."""
        ...

    def stop_time(self) -> float:
        """When training stops for good: the deadline less the reserve for saving and submitting."""
        ...

    def save_and_submit(self, name: str, phase: str) -> None:
        """Save the model under ``OUTPUT_DIR/name`` and submit it, unless the budget is nearly over."""
        ...
