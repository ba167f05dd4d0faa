"""What every evaluation backend returns and provides."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from autorl.eval_config import EvalConfig
from autorl.tasks.base import Problem, Task
from autorl_evaluator.settings import WorkerSettings
from autorl_evaluator.time_budget import TimeBudget


@dataclass
class EvalResult:
    """One evaluation's outcome. ``completions`` hold test questions' answers: evaluator-side only."""

    #: Per sample, in problem order.
    completions: list[str]
    #: Accuracy (0-100, unrounded) under each protocol: ``opencompass``, ``flexible``, ``strict``.
    scores: dict[str, float]
    n_samples: int
    seconds: float
    #: Backend facts worth recording (device, batch size, tensor-parallel size, ...).
    details: dict[str, object] = field(default_factory=dict)


class Backend(Protocol):
    """Generates completions for ``problems`` with the model in ``model_dir`` and scores them, as
    ``config`` (the experiment's recorded evaluation: generation limit, batch size, hard timeout;
    from the worker, with the split's hash and the package versions measured for this evaluation)
    says; ``worker`` (the worker's own settings) says only where and with what it runs (device, paths);
    ``budget`` (an agent's evaluation) how long it may take on the kind of device the baseline ran on:
    past it the evaluation stops and raises the budget's error (:mod:`autorl_evaluator.time_budget`)."""

    name: str

    def evaluate(
        self,
        model_dir: Path,
        task: Task,
        problems: list[Problem],
        config: EvalConfig,
        worker: WorkerSettings,
        budget: TimeBudget | None = None,
    ) -> EvalResult: ...
