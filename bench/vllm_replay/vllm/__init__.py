"""A stand-in for the ``vllm`` package inside OpenCompass's environment, for bench/opencompass_vllm_gpu.py.

OpenCompass's ``VLLMwithChatTemplate`` renders every prompt itself (its chat-template call, its
stop words, its sampling parameters) and hands them to ``vllm.LLM.generate``. This module takes
that call's place on a machine without a GPU:

- ``AUTORL_VLLM_REPLAY_MODE=record``: writes the engine arguments, the sampling parameters and the
  rendered prompts to ``AUTORL_VLLM_REPLAY_FILE`` (JSON) and answers empty completions;
- ``AUTORL_VLLM_REPLAY_MODE=replay``: answers each prompt with the completion that a real vLLM
  engine gave for it, read from ``AUTORL_VLLM_REPLAY_FILE`` (``{"completions": {prompt: text}}``).

OpenCompass then writes its predictions, scores them with its own evaluator and writes its summary
exactly as after a real engine. The worker passes OpenCompass only a filtered environment, so the
two variables and ``PYTHONPATH`` are set by the wrapper command the benchmark gives the worker as
its ``opencompass`` command.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "replay"


# The classes OpenCompass receives are the worker's own shim's (engine_shim/vllm), loaded by path:
# this module is named ``vllm`` too.
if TYPE_CHECKING:
    from autorl_evaluator.backends.opencompass.engine_shim.vllm import CompletionOutput as _Completion
    from autorl_evaluator.backends.opencompass.engine_shim.vllm import RequestOutput as _Output
    from autorl_evaluator.backends.opencompass.engine_shim.vllm import SamplingParams
else:
    _spec = importlib.util.spec_from_file_location(
        "autorl_engine_shim",
        Path(__file__).resolve().parents[3]
        / "services/evaluator-worker/autorl_evaluator/backends/opencompass/engine_shim/vllm/__init__.py",
    )
    assert _spec is not None and _spec.loader is not None
    _shim = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _shim
    _spec.loader.exec_module(_shim)
    SamplingParams = _shim.SamplingParams
    _Completion = _shim.CompletionOutput
    _Output = _shim.RequestOutput


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model = model
        self.engine_kwargs = kwargs
        self.mode = os.environ["AUTORL_VLLM_REPLAY_MODE"]
        self.path = os.environ["AUTORL_VLLM_REPLAY_FILE"]

    def get_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            self.model, trust_remote_code=bool(self.engine_kwargs.get("trust_remote_code", False))
        )

    def generate(self, prompts: list[str], sampling_params: SamplingParams, **kwargs: Any) -> list[_Output]:
        if self.mode == "record":
            record = {
                "model": self.model,
                "engine_kwargs": self.engine_kwargs,
                "sampling_kwargs": sampling_params.kwargs,
                "calls_before": 0,
                "prompts": list(prompts),
            }
            if os.path.exists(self.path):
                raise RuntimeError(f"{self.path} exists: one generate call per recording")
            with open(self.path, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            return [_Output(prompt, [_Completion("")]) for prompt in prompts]
        with open(self.path, encoding="utf-8") as handle:
            completions = json.load(handle)["completions"]
        return [_Output(prompt, [_Completion(completions[prompt])]) for prompt in prompts]
