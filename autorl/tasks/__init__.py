"""Task registry: ``get_task(name)`` and ``task_names()``."""

from __future__ import annotations

from collections.abc import Callable

from autorl.errors import UnknownTaskError
from autorl.tasks.arith import ArithTask
from autorl.tasks.base import Problem, Task
from autorl.tasks.gsm8k import GSM8KTask

_REGISTRY: dict[str, Callable[[], Task]] = {
    GSM8KTask.name: GSM8KTask,
    ArithTask.name: ArithTask,
}


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    """A new instance of the task registered as ``name``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}") from None
    return factory()


__all__ = ["Problem", "Task", "get_task", "task_names"]
