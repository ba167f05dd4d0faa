"""The ``hf`` backend: batched greedy generation with transformers, in this process.

It gives the per-sample predictions OpenCompass's ``HuggingFacewithChatTemplate`` gives on the
same files (docs/EVALUATION.md, "Parity with the hf backend"): the prompt is OpenCompass's chat
handling of the task's few-shot turns (:mod:`autorl_evaluator.backends.hf.opencompass_chat`), encoded with
no special tokens added and truncated from the left to the model's context; completions come back
in problem order; decoding is greedy with the per-model settings of
:mod:`autorl_evaluator.model_settings`; generation stops at the eos ids, and the completion,
decoded with special tokens dropped as every engine decodes (vLLM's way, the platform's rule:
:data:`autorl.eval_config.SKIP_SPECIAL_TOKENS`; OpenCompass's own transformers model keeps them), is
cut at OpenCompass's stop words.

Generation runs on :mod:`autorl.decoding.greedy_engine`: the same greedy ids as
``generate``, batched from free GPU memory (or ``eval_batch_size``), the shared few-shot prefix
computed once, CUDA graphs; architectures the engine does not know go through ``generate``,
left-padded, in the same batches.

An agent's evaluation runs against its time budget (:mod:`autorl_evaluator.time_budget`): the
engine checks the deadline as it generates, and an evaluation past it fails as the checkpoint's.
On the CPU, denormal numbers are flushed to zero while the model runs (weights scaled into the
denormal range made every multiplication take the processor's slow path: a CPU evaluation 3-15
times slower, with the same answers as zeros give).

The model is read from the submission's snapshot (:mod:`autorl.checkpoints.snapshot`: evaluator-owned,
normalized files), never with remote code, and from safetensors only. Prompts are rendered by the
sandboxed, time- and size-limited renderer of :mod:`autorl.checkpoints.chat_template` from the base
model's template (the snapshot's). torch and transformers are imported inside functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from autorl.checkpoints.chat_template import ChatTemplate, ChatTemplateError
from autorl.decoding.greedy_engine import DeadlineExceededError, generate_greedy, unsupported_reason
from autorl.eval_config import SKIP_SPECIAL_TOKENS
from autorl.settings import CPU_EVAL_BATCH_SIZE, GPU_EVAL_BATCH_SIZE
from autorl.tasks.base import Task, evaluation_messages
from autorl_evaluator.backends.base import Backend, EvalResult, Evaluation
from autorl_evaluator.backends.hf.opencompass_chat import cut_at_stop_words, encode, stop_words
from autorl_evaluator.backends.hf.warm_models import RESIDENT
from autorl_evaluator.backends.opencompass.compass_models.padded_attention import use_padded_attention
from autorl_evaluator.eval_device import require_device
from autorl_evaluator.failures import PublicEvaluationError
from autorl_evaluator.model_settings import ModelSettings, settings_for

log = logging.getLogger("autorl.evaluator.hf")


def prompt_texts(tokenizer: Any, task: Task, questions: Sequence[str], model: ModelSettings) -> list[str]:
    """The prompts this backend generates from: the task's few-shot turns and each question, as
    OpenCompass shapes them, in the model's own chat template with the generation prompt, rendered
    as transformers renders it but with the sandbox's limits (what :meth:`Task.render_prompt` gives
    for one question)."""
    if not isinstance(tokenizer.chat_template, str):
        raise ChatTemplateError("the base model has no chat template; register one whose tokenizer has")
    template = ChatTemplate(tokenizer.chat_template, dict(tokenizer.special_tokens_map))
    conversations = [evaluation_messages(task.build_messages(question)) for question in questions]
    return template.render_batch(conversations, add_generation_prompt=True, **model.chat_template_kwargs())


def eos_token_ids(tokenizer: Any, *generation_eos: int | Sequence[int] | None) -> list[int]:
    """Where generation stops: the given generation configs' eos ids and the tokenizer's eos."""
    ids: set[int] = set()
    for eos in generation_eos:
        ids.update([eos] if isinstance(eos, int) else eos or ())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


class HFBackend(Backend):
    """In-process transformers evaluation (``AUTORL_EVAL_BACKEND=hf``)."""

    name = "hf"

    def run(self, evaluation: Evaluation) -> EvalResult:
        started = time.monotonic()
        try:
            with denormals_flushed():
                completions, details = _generate(evaluation, started)
        except DeadlineExceededError as exc:
            assert evaluation.budget is not None  # only a budget sets a deadline
            raise evaluation.budget.exceeded() from exc
        task, problems = evaluation.task, evaluation.problems
        scores = task.score(completions, [problem.answer for problem in problems])
        return EvalResult(
            completions=completions,
            scores=scores,
            n_samples=len(problems),
            seconds=time.monotonic() - started,
            details={"backend": self.name, **details},
        )


@contextlib.contextmanager
def denormals_flushed() -> Iterator[None]:
    """Denormal floats read and computed as zero on the CPU (``torch.set_flush_denormal``) inside,
    as before after (the warm child and the tests run more than evaluations in their process)."""
    import torch

    was_flushing = _flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was_flushing)


def _flushing_denormals() -> bool:
    """Whether a denormal float computes as zero here (torch has no getter for the flag)."""
    import torch

    return bool((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0)


def _generate(evaluation: Evaluation, started: float) -> tuple[list[str], dict[str, object]]:
    import torch

    model_dir, task, problems = evaluation.model_dir, evaluation.task, evaluation.problems
    config, settings, budget = evaluation.config, evaluation.worker, evaluation.budget

    model_settings = settings_for(json.loads((model_dir / "config.json").read_text(encoding="utf-8")))
    require_device(settings.eval_device)  # a device that is not there is no checkpoint's fault
    device = torch.device(settings.eval_device or ("cuda" if torch.cuda.is_available() else "cpu"))
    # float32 on the CPU, as OpenCompass's CPU path loads it; the GPU dtype of the model settings.
    dtype = torch.float32 if device.type == "cpu" else getattr(torch, model_settings.dtype)
    tokenizer = _tokenizer(model_dir)
    # The prompts before the weights: a template that fails on them (the platform's) costs no load.
    texts = prompt_texts(tokenizer, task, [problem.question for problem in problems], model_settings)
    model, generation_eos, swapped = _load(
        model_dir, tokenizer, device, dtype, warm=settings.eval_warm_worker
    )
    max_new_tokens = config.max_new_tokens or task.max_new_tokens
    words = stop_words(tokenizer, generation_eos)
    # The model's own generation config falls back to config.json's eos when the file is absent.
    eos_ids = eos_token_ids(tokenizer, model.generation_config.eos_token_id, generation_eos)
    rows = [encode(tokenizer, text) for text in texts]
    batch_size = config.batch_size_in_force(settings.eval_batch_size)
    # The engine sizes a GPU batch from free memory; plain ``generate`` (other architectures) and
    # the CPU take the configured or default size.
    if batch_size is None and (device.type != "cuda" or unsupported_reason(model) is not None):
        batch_size = GPU_EVAL_BATCH_SIZE if device.type == "cuda" else CPU_EVAL_BATCH_SIZE
    generation_started = time.monotonic()
    output = generate_greedy(
        model,
        # OpenCompass's left truncation: each prompt keeps its last max_seq_len ids.
        [ids[-model_settings.max_seq_len :] for ids in rows],
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=tokenizer.pad_token_id,
        max_batch_size=batch_size,
        # A GPU shared with a training agent: the evaluation keeps to the share it waited for.
        memory_share=settings.eval_gpu_min_free_fraction,
        generate_kwargs=model_settings.hf_generation_kwargs(),
        deadline=budget.deadline(started, device.type) if budget is not None else None,
    )
    seconds = time.monotonic() - generation_started
    texts = tokenizer.batch_decode(output.tokens, skip_special_tokens=SKIP_SPECIAL_TOKENS)
    completions = [cut_at_stop_words(text, words) for text in texts]
    new_tokens = sum(len(ids) for ids in output.tokens)
    details: dict[str, object] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "engine": output.engine,
        "batch_size": max(output.batch_sizes),
        "batches": len(output.batch_sizes),
        "shared_prefix_ids": output.shared_prefix,
        "max_new_tokens": max_new_tokens,
        "max_seq_len": model_settings.max_seq_len,
        "truncated_prompts": sum(1 for ids in rows if len(ids) > model_settings.max_seq_len),
        "new_tokens": new_tokens,
        "new_tokens_per_s": round(new_tokens / seconds, 1) if seconds > 0 else None,
        "tensor_parallel_size": 1,
        "weights_swapped_into_resident_model": swapped,
    }
    return completions, details


def _tokenizer(model_dir: Path) -> Any:
    """The snapshot's tokenizer (the base model's), as OpenCompass's wrapper loads it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            model_dir, trust_remote_code=False, padding_side="left", truncation_side="left"
        )
    except Exception as exc:
        raise _unloadable(exc) from exc


#: Fixed text: what transformers says can name the evaluator's paths and devices (its memory, which
#: other work holds); it stays in evaluator storage.
UNLOADABLE = (
    "transformers cannot load the checkpoint; save it with model.save_pretrained(path) and "
    "tokenizer.save_pretrained(path) and check that it loads with AutoModelForCausalLM.from_pretrained(path)"
)


def _unloadable(exc: Exception) -> PublicEvaluationError:
    return PublicEvaluationError(UNLOADABLE, detail=f"{type(exc).__name__}: {exc}")


def _load(
    model_dir: Path, tokenizer: Any, device: Any, dtype: Any, *, warm: bool = False
) -> tuple[Any, int | list[int] | None, bool]:
    """The model and the generation config's eos ids, as OpenCompass's wrapper loads them (the
    tokenizer's pad id set as it sets it), and whether the weights were swapped into the resident
    model (``warm``: :data:`autorl_evaluator.backends.hf.warm_models.RESIDENT`)."""
    from transformers import GenerationConfig

    try:
        if warm:
            model, swapped = RESIDENT.load(
                model_dir, device, dtype, lambda: _cold_load(model_dir, device, dtype)
            )
        else:
            model, swapped = _cold_load(model_dir, device, dtype), False
    # A submission's files can break loading in many ways (a truncated safetensors header, a
    # config with wrong types, shapes that do not match); each is the checkpoint's fault.
    # The snapshot's files are all that is read: the message cannot quote the test split.
    except Exception as exc:
        raise _unloadable(exc) from exc
    # OpenCompass reads stop words and a missing pad id from generation_config.json alone.
    try:
        generation_config = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        generation_config = None
    generation_eos = generation_config.eos_token_id if generation_config is not None else None
    if tokenizer.pad_token_id is None:
        # OpenCompass's fallback order: the generation config's pad id, then the eos token.
        pad = generation_config.pad_token_id if generation_config is not None else None
        if pad is None and tokenizer.eos_token_id is None:
            raise PublicEvaluationError(
                "the tokenizer has neither a pad nor an eos token; set one (tokenizer.pad_token = ...) "
                "and save it with tokenizer.save_pretrained(path)"
            )
        tokenizer.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
    return model, generation_eos, swapped


def _cold_load(model_dir: Path, device: Any, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=dtype,
        trust_remote_code=False,
        use_safetensors=True,
        attn_implementation=use_padded_attention(),  # for architectures the engine does not know
    )
    return model.to(device).eval()
