"""Calling a causal language model with a KV cache, under whichever name the installed
transformers version gives it (``cache`` in transformers 5, ``past_key_values`` before)."""

from __future__ import annotations

from typing import Any


def forward(model: Any, input_ids: Any, *, cache: Any = None, **kwargs: Any) -> Any:
    """Call the model with a KV cache under whichever name this transformers version takes."""
    if cache is not None:
        kwargs["cache" if _takes_cache_kwarg(model) else "past_key_values"] = cache
    return model(input_ids=input_ids, **kwargs)


def output_cache(output: Any) -> Any:
    """The KV cache of a forward pass (``cache`` in transformers 5, ``past_key_values`` before)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def _takes_cache_kwarg(model: Any) -> bool:
    import inspect

    return "cache" in inspect.signature(model.forward).parameters
