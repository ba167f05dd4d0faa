"""The ``vllm`` module OpenCompass imports when the worker hands generation to the resident engine.

OpenCompass's ``VLLMwithChatTemplate`` renders every prompt itself and calls ``LLM(path, **kwargs)``,
``get_tokenizer()`` and ``generate(prompts, SamplingParams(...))``. This module answers those calls
by forwarding them to the worker's engine server (``engine_server.py``, in the Python of
``AUTORL_VLLM_PYTHON``) over the Unix socket named by ``AUTORL_ENGINE_SOCKET``, so OpenCompass's
prompts, stop words, sampling parameters and scoring are untouched. Only the standard library,
the worker's ``json_lines.py`` (loaded by its path) and OpenCompass's own transformers (for the
tokenizer it renders with) are used here.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autorl_evaluator import json_lines
else:  # OpenCompass's Python has none of our packages
    _spec = importlib.util.spec_from_file_location(
        "autorl_json_lines", Path(__file__).resolve().parents[4] / "json_lines.py"
    )
    json_lines = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(json_lines)

__version__ = "autorl-resident-engine"


class EngineError(RuntimeError):
    """The resident engine refused or failed a request."""


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"SamplingParams({self.kwargs!r})"


@dataclass
class CompletionOutput:
    text: str


@dataclass
class RequestOutput:
    prompt: str
    outputs: list[CompletionOutput] = field(default_factory=list)


def exchange(path: str, payload: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """One request to the engine server at ``path`` and its answer; raises ``EngineError`` when the
    server answers nothing or says the request failed, ``OSError`` when it cannot be reached."""
    answer = json_lines.request(path, payload, timeout_s=timeout_s)
    if answer is None:
        raise EngineError("the resident engine closed the connection without an answer")
    if not answer.get("ok"):
        raise EngineError(f"the resident engine failed: {answer.get('error')}")
    return answer


def request(payload: dict[str, Any]) -> dict[str, Any]:
    """One request to the engine the worker named for this evaluation."""
    return exchange(os.environ["AUTORL_ENGINE_SOCKET"], payload)


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.engine_kwargs = kwargs
        self.loaded = request({"op": "load", "model": model, "engine_kwargs": kwargs})

    def get_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model, trust_remote_code=False)

    def generate(
        self, prompts: Any, sampling_params: SamplingParams | None = None, **kwargs: Any
    ) -> list[RequestOutput]:
        if kwargs.get("lora_request") is not None:
            raise EngineError("LoRA adapters are not evaluated: a submission is a whole checkpoint")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        sampling = sampling_params.kwargs if sampling_params is not None else {}
        texts = request({"op": "generate", "prompts": prompts, "sampling": sampling})["texts"]
        if len(texts) != len(prompts):
            raise EngineError(f"the resident engine answered {len(texts)} of {len(prompts)} prompts")
        return [
            RequestOutput(prompt, [CompletionOutput(str(text))])
            for prompt, text in zip(prompts, texts, strict=True)
        ]
