"""Batched greedy decoding near the GPU's floor, with the model's own transformers modules.

Greedy answers are those of ``model.generate(do_sample=False)`` on the same prompt ids (one prompt
at a time or batched with left padding: the same function); only the work around the model differs:

- **Shared prefix once.** Every GSM8K evaluation prompt starts with the same few-shot turns (1,441
  of its ~1,516 Qwen2.5 ids). Their keys and values are computed once, with one row, and every
  row attends to that one copy (:mod:`autorl.decoding.grouped_attention`); each row's
  prefill and cache cover only its own ids after the prefix and what it generates.
- **Batch from free memory.** The batch is as many rows as the free GPU memory holds
  (:mod:`autorl.decoding.batch_memory`), prompts sorted by length so that a batch pads
  little; answers come back in the prompts' order.
- **A preallocated cache** (:mod:`autorl.decoding.slot_cache`) and **grouped-query
  attention without expanding the key/value heads**.
- **CUDA graphs.** A decode step has the same shapes every time (it attends over all of a row's
  slots, the mask hiding those not written yet), so on a GPU it is captured once per batch size
  and replayed: transformers' Python work for one forward pass (tens of milliseconds on the
  machines measured) is paid once instead of at every step.
- **Finished rows dropped.** Every :data:`CHECK_EVERY_STEPS` steps (each check waits for the GPU)
  the loop counts the rows still generating and, once they are at most :data:`KEEP_AT_MOST` of
  the batch, moves them to the front so later steps compute only those (a new capture each time).

Decoding settings are the platform's: greedy, stop at ``eos_ids`` or a row's own token limit; no
setting of the checkpoint's ``generation_config.json`` other than its eos ids applies.

**A deadline** (an evaluation's time budget) is checked before each batch and at each check for
finished rows (or each step of ``generate``): past it, :class:`DeadlineExceededError` ends the
generation.

**Sampling** (:func:`generate_sampled`, for RL rollouts): the same loop draws each next id from
``softmax(logits / temperature)`` over the whole vocabulary (no top-k or top-p: TRL's GRPO
defaults) through the Gumbel-max trick, which stays inside the captured graphs.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from autorl.decoding.batch_memory import PREFILL_TOKENS, ModelShape, aligned_slots, rows_that_fit
from autorl.decoding.grouped_attention import WINDOW_ARGUMENT, AttentionWindow, grouped_attention_for
from autorl.decoding.slot_cache import SlotCache

log = logging.getLogger("autorl.evaluator.hf")

#: Architectures whose attention layers go through transformers' attention interface and cache
#: ``update`` with full (not sliding-window) attention; others decode with ``generate``.
SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})
#: Decode steps between checks for finished rows.
CHECK_EVERY_STEPS = 8
#: Rows still generating, as a share of the batch, at or under which the finished ones are dropped.
KEEP_AT_MOST = 0.5
#: Capture decode steps as CUDA graphs on a GPU.
CUDA_GRAPHS = True
#: A decode step attends over a row's slots up to the next multiple of this past the slot it
#: writes: fewer empty slots read, one new capture per this many steps.
SPAN_SLOTS = 128
#: Prefix positions one prefill pass of the single prefix row takes (its scores are prefix²-sized).
PREFIX_CHUNK = 2048


class DeadlineExceededError(TimeoutError):
    """The generation passed the deadline it was given."""


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceededError("the generation passed its deadline")


@dataclass
class GreedyOutput:
    #: Generated ids per prompt, in the prompts' order, up to and including the first eos id.
    tokens: list[list[int]]
    #: Rows of each batch, in the order they ran.
    batch_sizes: list[int] = field(default_factory=list)
    #: Prompt ids shared by every prompt and computed once.
    shared_prefix: int = 0
    #: ``greedy`` (this engine) or ``generate`` (transformers, for an architecture it does not know).
    engine: str = "greedy"


def unsupported_reason(model: Any) -> str | None:
    """Why :func:`generate_greedy` cannot decode ``model`` (None: it can)."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    return None


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Leading ids every prompt has, never a whole prompt: the last id's logits give a row's first token."""
    first = list(prompts[0])
    length = min(len(ids) for ids in prompts) - 1
    for ids in prompts:
        if list(ids[:length]) != first[:length]:
            length = next(i for i in range(length) if ids[i] != first[i])
    return length


def model_shape(model: Any) -> ModelShape:
    config = model.config
    return ModelShape(
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
        dtype_bytes=model.dtype.itemsize,
    )


def generate_greedy(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int],
    eos_ids: Sequence[int],
    pad_id: int,
    max_batch_size: int | None = None,
    memory_share: float | None = None,
    generate_kwargs: dict[str, Any] | None = None,
    temperature: float | None = None,
    deadline: float | None = None,
) -> GreedyOutput:
    """Greedy completions of ``prompts`` (lists of ids, none empty). ``max_new_tokens`` is one
    limit for all rows or one per prompt. ``max_batch_size`` caps the batch; on a GPU the free
    memory sets it otherwise (no more than ``memory_share`` of the device's memory, where a
    training process shares the GPU), and an out-of-memory error halves it and retries the batch.
    A model the engine does not support (:func:`unsupported_reason`) decodes with
    ``model.generate(**generate_kwargs)`` in the same batches. ``temperature`` samples instead of
    taking the argmax (:func:`generate_sampled`). Past ``deadline`` (a ``time.monotonic()``) it
    raises :class:`DeadlineExceededError`."""
    import torch

    if temperature is not None and not temperature > 0:
        raise ValueError("temperature must be positive (None: greedy)")

    if not prompts or min(len(ids) for ids in prompts) == 0:
        raise ValueError("generate_greedy needs at least one prompt and no empty prompt")
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != len(prompts) or min(limits) < 1:
        raise ValueError("max_new_tokens must be at least 1, once or once per prompt")
    device = model.device
    shape = model_shape(model)
    reason = unsupported_reason(model)
    shared = shared_prefix_length(prompts) if reason is None else 0
    output = GreedyOutput(tokens=[[] for _ in prompts], shared_prefix=shared)
    # Longest first: the first batch is the largest in memory, so a misfit shows at once.
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    cap = max_batch_size or len(prompts)
    with torch.inference_mode(), ExitStack() as stack:
        decode: Callable[[list[list[int]], list[int]], list[list[int]]]
        if reason is None:
            stack.enter_context(grouped_attention_for(model))
            # transformers 5.24 renamed the forward argument ``past_key_values`` to ``cache``.
            parameters = inspect.signature(type(model).forward).parameters
            forward = _Forward(model, "cache" if "cache" in parameters else "past_key_values", temperature)
            prefix = _prefix_keys(forward, shape, [int(i) for i in prompts[0][:shared]])

            def decode(suffixes: list[list[int]], batch_limits: list[int]) -> list[list[int]]:
                return _decode_batch(
                    forward, shape, prefix, shared, suffixes, batch_limits, eos_ids, pad_id, deadline
                )

        else:
            log.info("event=hf_plain_generate reason=%r", reason)
            output.engine = "generate"

            def decode(suffixes: list[list[int]], batch_limits: list[int]) -> list[list[int]]:
                return _generate_batch(
                    model, suffixes, batch_limits, eos_ids, pad_id, generate_kwargs or {}, deadline
                )

        start = 0
        while start < len(order):
            _check_deadline(deadline)
            row_slots = aligned_slots(len(prompts[order[start]]) - shared + max(limits) - 1, SPAN_SLOTS)
            rows = min(cap, len(order) - start)
            if device.type == "cuda" and max_batch_size is None:
                free, total = torch.cuda.mem_get_info(device)
                if memory_share is not None:
                    free = min(free, int(memory_share * total))
                rows = min(rows, rows_that_fit(free, shape, row_slots, shared))
            batch = order[start : start + rows]
            started = time.monotonic()
            try:
                tokens = decode([list(prompts[i][shared:]) for i in batch], [limits[i] for i in batch])
            except torch.OutOfMemoryError:
                if rows == 1:
                    raise
                # Greedy ids do not depend on the batch a row runs in, so a smaller batch that
                # fits gives the same completions (and samples from the same distribution).
                cap = max(1, rows // 2)
                torch.cuda.empty_cache()
                log.warning("event=hf_out_of_memory new_batch_size=%d", cap)
                continue
            for index, ids in zip(batch, tokens, strict=True):
                output.tokens[index] = ids
            output.batch_sizes.append(rows)
            start += rows
            log.info(
                "event=hf_batch done=%d total=%d rows=%d seconds=%.1f",
                start,
                len(order),
                rows,
                time.monotonic() - started,
            )
    return output


def _until_stop(ids: list[int], limit: int, eos_ids: Sequence[int]) -> list[int]:
    """``ids`` up to ``limit`` and up to and including the first eos id."""
    ids = ids[:limit]
    stop = set(eos_ids)
    return ids[: next((i + 1 for i, token in enumerate(ids) if token in stop), len(ids))]


def _generate_batch(
    model: Any,
    prompts: list[list[int]],
    limits: list[int],
    eos_ids: Sequence[int],
    pad_id: int,
    generate_kwargs: dict[str, Any],
    deadline: float | None = None,
) -> list[list[int]]:
    """One left-padded batch through ``model.generate`` (``deadline`` checked at each step)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class PastDeadline(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            _check_deadline(deadline)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids) :] = 1
    output = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        **generate_kwargs,
        max_new_tokens=max(limits),
        eos_token_id=list(eos_ids) or None,
        pad_token_id=pad_id,
        stopping_criteria=StoppingCriteriaList([PastDeadline()] if deadline is not None else []),
    )
    generated = output[:, width:].tolist()
    return [_until_stop(ids, limit, eos_ids) for ids, limit in zip(generated, limits, strict=True)]


def generate_sampled(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float,
    max_new_tokens: int | Sequence[int],
    eos_ids: Sequence[int],
    pad_id: int,
    max_batch_size: int | None = None,
    memory_share: float | None = None,
) -> GreedyOutput:
    """Sampled completions of ``prompts`` (one independent draw per row; repeat a prompt for a
    group), with everything else as :func:`generate_greedy` does it."""
    return generate_greedy(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
        max_batch_size=max_batch_size,
        memory_share=memory_share,
        generate_kwargs={"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0},
        temperature=temperature,
    )


class _Forward:
    """One forward pass of the model over a cache window: the next id of each row, the argmax or,
    with a ``temperature``, a draw from the softmax of the scaled logits."""

    def __init__(self, model: Any, cache_argument: str, temperature: float | None = None) -> None:
        self.model = model
        self.cache_argument = cache_argument
        self.temperature = temperature

    def __call__(self, cache: SlotCache, input_ids: Any, positions: Any, window: AttentionWindow) -> Any:
        import torch

        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            # No mask for the model to build: the grouped attention takes the window as it is.
            attention_mask=None,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_argument: cache, WINDOW_ARGUMENT: window},
        )
        logits = out.logits[:, -1]
        if self.temperature is None:
            # argmax of the bf16 logits picks what generate's argmax of their float32 copy picks.
            return logits.argmax(-1)
        # Gumbel-max: argmax(z / T + g), g = -log(E) with E ~ Exp(1), is a draw from softmax(z / T).
        scaled = logits.float() / self.temperature
        return (scaled - torch.empty_like(scaled).exponential_().log()).argmax(-1)


def _causal_mask(key_valid: Any, start: int, width: int) -> Any:
    """``[rows, 1, width, start + width]``: query ``i`` (slot ``start + i``) sees the valid keys up
    to its own slot, and always itself, so a padding query has a key and stays finite."""
    import torch

    slots = start + width
    key_slot = torch.arange(slots, device=key_valid.device)
    query_slot = torch.arange(start, slots, device=key_valid.device)[:, None]
    causal = key_slot[None, :] <= query_slot
    return (key_valid[:, None, None, :slots] & causal) | (key_slot[None, :] == query_slot)


def _new_cache(shape: ModelShape, rows: int, slots: int, model: Any) -> SlotCache:
    return SlotCache(
        layers=shape.layers,
        rows=rows,
        slots=slots,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        dtype=model.dtype,
        device=model.device,
    )


def _prefix_keys(forward: _Forward, shape: ModelShape, prefix: list[int]) -> tuple[tuple[Any, Any], ...]:
    """Per layer, the shared prefix's keys and values (``[kv_heads, prefix, head_dim]``); empty
    when there is no shared prefix."""
    import torch

    if not prefix:
        return ()
    device = forward.model.device
    cache = _new_cache(shape, 1, aligned_slots(len(prefix)), forward.model)
    valid = torch.ones((1, len(prefix)), dtype=torch.bool, device=device)
    for start in range(0, len(prefix), PREFIX_CHUNK):
        chunk = prefix[start : start + PREFIX_CHUNK]
        cache.prefill_window(0, 1, start)
        forward(
            cache,
            torch.tensor([chunk], device=device),
            torch.arange(start, start + len(chunk), device=device)[None],
            AttentionWindow(_causal_mask(valid, start, len(chunk))),
        )
    return cache.prefix(len(prefix))


def _decode_batch(
    forward: _Forward,
    shape: ModelShape,
    prefix: tuple[tuple[Any, Any], ...],
    shared: int,
    suffixes: list[list[int]],
    limits: list[int],
    eos_ids: Sequence[int],
    pad_id: int,
    deadline: float | None = None,
) -> list[list[int]]:
    """Greedy ids of one batch: its rows' own prompt ids after the ``shared`` prefix ids whose
    keys and values ``prefix`` holds; ``deadline`` checked at each check for finished rows.

    A row's slots: ``[0, width)`` its own ids, left-padded to the widest row, then one slot per
    decode step."""
    import torch

    model = forward.model
    device = model.device
    rows = len(suffixes)
    width = max(len(ids) for ids in suffixes)
    steps = max(limits)
    cache = _new_cache(shape, rows, aligned_slots(width + steps - 1, SPAN_SLOTS), model)
    lengths = torch.tensor([len(ids) for ids in suffixes], device=device)
    slot = torch.arange(cache.slots, device=device)
    # A row attends to its own ids; a decode slot becomes valid when the step writes it.
    valid = (slot[None, :] >= width - lengths[:, None]) & (slot[None, :] < width)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    for row, ids in enumerate(suffixes):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
    input_ids = input_ids.to(device)
    # Row positions continue the prefix; padding slots get the first one (they are never attended).
    offsets = torch.arange(width, device=device)[None, :] - (width - lengths[:, None])
    positions = shared + offsets.clamp(min=0)
    tokens = torch.empty(rows, dtype=torch.long, device=device)
    chunk = max(1, PREFILL_TOKENS // width)
    for start in range(0, rows, chunk):
        end = min(rows, start + chunk)
        cache.prefill_window(start, end, 0, written=valid[start:end, :width])
        window = AttentionWindow(_causal_mask(valid[start:end], 0, width), prefix)
        tokens[start:end] = forward(cache, input_ids[start:end], positions[start:end], window)

    eos = torch.tensor(list(eos_ids) or [-1], device=device)
    limit = torch.tensor(limits, device=device)
    generated = torch.full((rows, steps), pad_id, dtype=torch.long, device=device)
    generated[:, 0] = tokens
    live = torch.arange(rows, device=device)  # the batch row each cache row holds
    next_position = shared + lengths
    done = torch.isin(tokens, eos) | (limit <= 1)
    slot_index = torch.tensor([width], device=device)
    step_index = torch.tensor([1], device=device)

    def step(n: int, span: int) -> None:
        """One decode step of rows ``0..n`` over slots ``0..span``, in place: the same shapes for
        every step with the same ``n`` and ``span``."""
        valid[:n].index_fill_(1, slot_index, True)
        cache.decode_window(n, slot_index, span)
        window = AttentionWindow(valid[:n, None, None, :span], prefix)
        chosen = forward(cache, tokens[:n, None], next_position[:n, None], window)
        chosen = torch.where(done[:n], pad_id, chosen)
        tokens[:n] = chosen
        generated.index_put_((live[:n], step_index.expand(n)), chosen)
        done[:n] |= torch.isin(chosen, eos) | (limit[:n] <= step_index + 1)
        next_position[:n] += 1
        slot_index.add_(1)
        step_index.add_(1)

    run = _graph_runner(step) if device.type == "cuda" and CUDA_GRAPHS else step
    n = rows
    for step_number in range(1, steps):
        if step_number % CHECK_EVERY_STEPS == 1:
            still = int((~done[:n]).sum())
            _check_deadline(deadline)
            if still == 0:
                break
            if still <= KEEP_AT_MOST * n:
                keep = torch.nonzero(~done[:n]).squeeze(1)
                cache.keep(keep)
                for state in (valid, tokens, next_position, limit, done, live):
                    state[:still] = state.index_select(0, keep)
                n = still
        run(n, min(cache.slots, aligned_slots(width + step_number, SPAN_SLOTS)))

    return [_until_stop(ids, limit, eos_ids) for ids, limit in zip(generated.tolist(), limits, strict=True)]


def _graph_runner(step: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """``step`` replayed from a CUDA graph captured once per shape (rows, span). The first call
    runs it directly: lazily created library state must exist before a capture."""
    import torch

    graphs: dict[tuple[int, int], Any] = {}
    pool = torch.cuda.graph_pool_handle()
    warmed = False

    def run(n: int, span: int) -> None:
        nonlocal warmed
        if not warmed:
            step(n, span)
            warmed = True
            return
        if (n, span) not in graphs:
            # A graph is not replayed once a later one is captured (rows only shrink, spans only
            # grow), so all can share one memory pool.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                step(n, span)
            graphs[n, span] = graph
        graphs[n, span].replay()

    return run
