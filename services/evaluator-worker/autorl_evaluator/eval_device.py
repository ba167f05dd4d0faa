"""AUTORL_EVAL_DEVICE, checked where the evaluator starts: ``cpu``, ``cuda`` or ``cuda:N`` of a GPU
this process sees. A device that is not there is the evaluator's setting that is wrong, never a
submission's checkpoint (which would otherwise fail to load on it)."""

from __future__ import annotations

import re

from autorl.errors import UsageError
from autorl_evaluator.failures import EvaluatorFaultError

_DEVICE = re.compile(r"cuda(?::(\d+))?")


def device_problem(device: str | None, *, count_gpus: bool = True) -> str | None:
    """Why the evaluator cannot evaluate on ``device`` (AUTORL_EVAL_DEVICE) here, naming the setting
    and the fix; None when it can (or when it is unset: a GPU if one is visible, else the CPU).
    ``count_gpus=False``: its form only, without torch (whose CUDA queries a later fork may not survive)."""
    if device is None or device == "cpu":
        return None
    unset = "or unset it (a GPU if one is visible, else the CPU)"
    match = _DEVICE.fullmatch(device)
    if match is None:
        return (
            f"AUTORL_EVAL_DEVICE={device!r} is not a device; set it to cpu, cuda or cuda:N (a GPU), {unset}"
        )
    if not count_gpus:
        return None
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return f"AUTORL_EVAL_DEVICE={device} but no GPU is visible to the evaluator; set it to cpu {unset}"
    if match.group(1) is not None and int(match.group(1)) >= count:
        return (
            f"AUTORL_EVAL_DEVICE={device} but the evaluator sees {count} GPU(s), cuda:0 to cuda:{count - 1}; "
            f"set it to one of them {unset}"
        )
    return None


def check_device(device: str | None, *, count_gpus: bool = True) -> None:
    """At a command's start: a device the evaluator cannot use is bad input (exit 2)."""
    problem = device_problem(device, count_gpus=count_gpus)
    if problem is not None:
        raise UsageError(problem)


def require_device(device: str | None) -> None:
    """Before a submission's model loads: a device the evaluator cannot use is its own fault."""
    problem = device_problem(device)
    if problem is not None:
        raise EvaluatorFaultError(f"the evaluator is set up wrong: {problem}")
