"""What every evaluation backend returns and provides."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from autorl.errors import EvaluationError
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


@dataclass(frozen=True)
class Evaluation:
    """One evaluation, as a backend is handed it: the model in ``model_dir`` (a snapshot) on
    ``problems`` of ``task``, as ``config`` (the experiment's recorded evaluation: generation limit,
    batch size, hard timeout; from the worker, with the split's hash and the package versions
    measured for this evaluation) says; ``worker`` (the worker's own settings) says only where and
    with what it runs (device, paths); ``budget`` (an agent's evaluation) how long it may take on
    the kind of device the baseline ran on: past it the evaluation stops and raises the budget's
    error (:mod:`autorl_evaluator.time_budget`)."""

    model_dir: Path
    task: Task
    problems: list[Problem]
    config: EvalConfig
    worker: WorkerSettings
    budget: TimeBudget | None = None


class Backend(abc.ABC):
    """Generates completions for an evaluation's problems with its model and scores them."""

    name: ClassVar[str]

    def evaluate(
        self,
        model_dir: Path,
        task: Task,
        problems: list[Problem],
        config: EvalConfig,
        worker: WorkerSettings,
        budget: TimeBudget | None = None,
    ) -> EvalResult:
        """Evaluate, once the task is one this backend evaluates and there are problems to evaluate
        (:class:`Evaluation` says what each argument is)."""
        self.check_task(task)
        if not problems:
            raise EvaluationError("no test problems to evaluate")
        return self.run(Evaluation(model_dir, task, problems, config, worker, budget))

    def check_task(self, task: Task) -> None:
        """Refuse a task whose format this backend cannot evaluate (every task, by default)."""
        return None

    @abc.abstractmethod
    def run(self, evaluation: Evaluation) -> EvalResult:
        """Generate and score, the problems being there and the task one this backend evaluates."""
