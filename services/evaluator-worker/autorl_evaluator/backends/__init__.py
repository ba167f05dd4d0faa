"""Evaluation backends by name. Each is imported only when asked for: the ``hf`` backend needs
torch and transformers, the ``opencompass`` backend only a subprocess."""

from __future__ import annotations

import importlib

from autorl.errors import ConfigurationError
from autorl_evaluator.backends.base import Backend, EvalResult

#: Backend name → ``module:class``.
BACKENDS: dict[str, str] = {
    "hf": "autorl_evaluator.backends.hf.backend:HFBackend",
    "opencompass": "autorl_evaluator.backends.opencompass.backend:OpenCompassBackend",
}


def get_backend(name: str) -> Backend:
    """A new instance of the backend registered as ``name``."""
    try:
        module_name, class_name = BACKENDS[name].split(":")
    except KeyError:
        raise ConfigurationError(
            f"unknown evaluation backend {name!r}; "
            f"set AUTORL_EVAL_BACKEND to one of {', '.join(sorted(BACKENDS))}"
        ) from None
    backend: Backend = getattr(importlib.import_module(module_name), class_name)()
    return backend


__all__ = ["BACKENDS", "Backend", "EvalResult", "get_backend"]
