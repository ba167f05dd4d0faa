"""Per-model evaluation settings: the one place to change how a model family is evaluated.

The defaults are the reference's (AutoRL-Bench's ``models.yaml``): greedy decoding, bf16 on
GPU, 90 % of GPU memory for vLLM, thinking mode off, reasoning content (``<think>…</think>``)
stripped before scoring. The output limit is not set here: the dataset's own (GSM8K: 512 new
tokens, or ``AUTORL_EVAL_MAX_NEW_TOKENS``) applies, as it does in the reference, where the
dataset's ``max_out_len`` wins over the model's.

Overrides are keyed by ``model_type`` from the checkpoint's ``config.json``: a submission is a
fine-tune with its base model's architecture, and that is what an evaluator can read from it
(the hub name of the base model is not in the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autorl.eval_config import SKIP_SPECIAL_TOKENS


@dataclass(frozen=True)
class ModelSettings:
    """How one model family is evaluated. Sampling is greedy everywhere: scores are reproducible."""

    #: Context length given to vLLM (``max_model_len``) and to prompt truncation; never more than
    #: the model's own ``max_position_embeddings``.
    max_seq_len: int = 32768
    #: vLLM weights and activations dtype on GPU.
    dtype: str = "bfloat16"
    #: Fraction of each GPU's memory vLLM may take (weights + KV cache).
    gpu_memory_utilization: float = 0.9
    #: Prompts handed to vLLM per ``generate`` call. vLLM schedules them itself, so one call for
    #: the whole test split (1,319 prompts) keeps the GPU full; the reference's 16 leaves it
    #: waiting on the longest answer of every batch of 16.
    gpu_batch_size: int = 2048
    #: Passed to the chat template as ``enable_thinking``; templates without it ignore it.
    enable_thinking: bool = False
    #: Remove reasoning content before the answer is extracted (OpenCompass's
    #: ``extract-non-reasoning-content`` post-processor).
    strip_reasoning: bool = True
    #: CUDA graphs cost start-up time that one evaluation does not win back (the reference's choice).
    enforce_eager: bool = True

    def vllm_generation_kwargs(self) -> dict[str, Any]:
        """vLLM ``SamplingParams`` for greedy decoding, as the reference writes them, and the
        platform's decoding rule (:data:`autorl.eval_config.SKIP_SPECIAL_TOKENS`) stated, not left
        to vLLM's default; the resident engine's transformers engine reads it too."""
        return {"temperature": 0.0, "top_p": 1.0, "top_k": 1, "skip_special_tokens": SKIP_SPECIAL_TOKENS}

    def hf_generation_kwargs(self) -> dict[str, Any]:
        """transformers ``generate`` arguments for greedy decoding.

        A checkpoint's ``generation_config.json`` may carry sampling settings or a repetition
        penalty (Qwen2.5-Instruct ships 1.05); vLLM ignores them when given explicit sampling
        parameters, so they are neutralised here too and both paths decode the same way.
        """
        return {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0}

    def chat_template_kwargs(self) -> dict[str, Any]:
        return {"enable_thinking": self.enable_thinking}


DEFAULT = ModelSettings()

#: ``model_type`` → overrides of :data:`DEFAULT`: the reference's per-family context lengths.
#: Its per-family sampling settings (Qwen3's temperature 0.6, ...) are not taken: every model is
#: evaluated greedily here, so a score does not depend on a sampling seed.
OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3": {"max_seq_len": 40960},
}


def settings_for(model_config: dict[str, Any]) -> ModelSettings:
    """The settings for a checkpoint, from its parsed ``config.json``."""
    settings = replace(DEFAULT, **OVERRIDES.get(str(model_config.get("model_type", "")), {}))
    limit = model_config.get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < settings.max_seq_len:
        settings = replace(settings, max_seq_len=limit)
    return settings


def within_free_memory_gate(settings: ModelSettings, min_free_fraction: float | None) -> ModelSettings:
    """vLLM refuses to start unless ``gpu_memory_utilization`` of each GPU's memory is free. A local
    worker that shares GPUs starts an evaluation once ``min_free_fraction`` of every GPU is free
    (``AUTORL_EVAL_GPU_MIN_FREE_FRACTION``), so vLLM may take no more than that fraction."""
    if min_free_fraction is None or min_free_fraction >= settings.gpu_memory_utilization:
        return settings
    return replace(settings, gpu_memory_utilization=min_free_fraction)
