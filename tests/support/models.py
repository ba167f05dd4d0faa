"""A tiny model that answers some, not all, test problems right: the subject of scoring tests.

:func:`train_tiny_model` builds ``builtin:tiny-qwen2`` (same seed, same tokenizer, same
architecture as the base model) and teaches it, with a plain torch loop on the CPU, the exact
prompt the ``hf`` backend renders for each problem followed by a short answer: ``The answer is N``
for every other problem (indices 0, 2, 4, ...) and ``I am not sure.`` (no number: wrong under
every protocol) for the rest. Teaching the wrong half too, rather than leaving it to chance, makes
every greedy output a learned one with a wide margin, so batched and unbatched generation agree.

Every prompt starts with the same four worked examples (about 1,400 tokens of the ~1,500), so a
step encodes that shared prefix once, without gradient, and trains on the per-problem suffixes
against its cached keys and values: a fraction of the cost of full sequences, for the same
model. Logits are computed only where an answer
token is predicted. Training stops once every answer token is the argmax by a margin, which means
greedy decoding reproduces every answer; greedy generation then checks it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autorl.models.tiny import build_tiny_qwen2
from autorl.tasks import get_task
from autorl.tasks.base import Problem
from autorl.tasks.gsm8k import extract_answer

#: Generation limit for evaluating the trained model: its answers are under a dozen tokens.
EVAL_MAX_NEW_TOKENS = 24
UNSURE = "I am not sure."
#: Logit margin of every answer token over the runner-up at which training stops.
MARGIN = 2.0
MAX_STEPS = 400
LEARNING_RATE = 5e-3


@dataclass(frozen=True)
class TrainedModel:
    """A trained checkpoint and what it was trained to answer."""

    path: Path
    task: str
    problems: tuple[Problem, ...]
    #: Indices of the problems taught their right answer; the others were taught UNSURE.
    right: tuple[int, ...]
    #: Greedy completions (special tokens skipped) under the hf backend's prompt, after training.
    completions: tuple[str, ...]
    #: ``task.score(completions, answers)``: strictly between 0 and 100.
    scores: dict[str, float]
    steps: int
    train_seconds: float


def target_text(index: int, problem: Problem) -> str:
    """What the model is taught to answer for the ``index``-th problem."""
    if index % 2:
        return UNSURE
    answer = extract_answer(problem.answer)
    if answer is None:
        raise ValueError(f"problem {index} has no numeric answer: {problem.answer!r}")
    return f"The answer is {answer}"


def train_tiny_model(
    target: Path, problems: Sequence[Problem], *, task_name: str = "gsm8k", seed: int = 0
) -> TrainedModel:
    """Build and train the model in ``target``; raise if it does not converge as intended."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl_evaluator.backends.hf.backend import prompt_texts
    from autorl_evaluator.model_settings import settings_for

    if len(problems) < 2:
        raise ValueError("need at least two problems: one answered right and one wrong")
    started = time.monotonic()
    torch.manual_seed(seed)
    build_tiny_qwen2(target, seed=seed)
    task = get_task(task_name)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    model_settings = settings_for(model.config.to_dict())
    prompts = prompt_texts(tokenizer, task, [p.question for p in problems], model_settings)
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
    answer_ids = [
        tokenizer(target_text(i, p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for i, p in enumerate(problems)
    ]
    threads = torch.get_num_threads()
    # One thread: on a small shared machine, intra-op threads that wait on each other make a step
    # several times slower, not faster.
    torch.set_num_threads(1)
    try:
        steps = _fit(model, prompt_ids, answer_ids, pad_id=tokenizer.pad_token_id)
        completions = greedy_completions(model, tokenizer, prompt_ids, EVAL_MAX_NEW_TOKENS)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(target)
    expected = [target_text(i, p) for i, p in enumerate(problems)]
    if completions != expected:
        raise AssertionError(f"greedy outputs differ from the taught answers: {completions} != {expected}")
    scores = task.score(completions, [p.answer for p in problems])
    if not 0 < scores["opencompass"] < 100:
        raise AssertionError(f"the trained model scores {scores}; expected strictly between 0 and 100")
    return TrainedModel(
        path=target,
        task=task_name,
        problems=tuple(problems),
        right=tuple(range(0, len(problems), 2)),
        completions=tuple(completions),
        scores=scores,
        steps=steps,
        train_seconds=time.monotonic() - started,
    )


def _fit(model: Any, prompt_ids: list[list[int]], answer_ids: list[list[int]], *, pad_id: int) -> int:
    """Train until every answer token wins by MARGIN; return the number of steps taken."""
    import torch

    shared = _common_prefix_length(prompt_ids)
    # Keep at least one prompt token per row in the suffix: it predicts the first answer token.
    shared = min(shared, min(len(ids) for ids in prompt_ids) - 1)
    prefix = torch.tensor([prompt_ids[0][:shared]])
    rows = [ids[shared:] + answer for ids, answer in zip(prompt_ids, answer_ids, strict=True)]
    width = max(len(row) for row in rows)
    suffix = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    # labels[r, t] is the token that the logits at suffix position t must predict (-100: none).
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for r, (row, answer) in enumerate(zip(rows, answer_ids, strict=True)):
        suffix[r, : len(row)] = torch.tensor(row)
        mask[r, shared : shared + len(row)] = 1
        first = len(row) - len(answer)
        labels[r, first - 1 : len(row) - 1] = torch.tensor(answer)
    taught = labels != -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    for step in range(1, MAX_STEPS + 1):
        with torch.no_grad():
            cache = model.model(input_ids=prefix, use_cache=True).cache
        cache.batch_repeat_interleave(len(rows))
        hidden = model.model(input_ids=suffix, attention_mask=mask, cache=cache).last_hidden_state
        logits = model.lm_head(hidden[taught])
        wanted = labels[taught]
        loss = torch.nn.functional.cross_entropy(logits, wanted)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            runner_up = logits.scatter(1, wanted[:, None], float("-inf")).max(dim=1).values
            margin = (logits.gather(1, wanted[:, None])[:, 0] - runner_up).min().item()
        if margin > MARGIN:
            model.eval()
            return step
    raise AssertionError(
        f"the tiny model did not learn its answers in {MAX_STEPS} steps (margin {margin:.2f})"
    )


def _common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    length = 0
    while all(len(row) > length and row[length] == rows[0][length] for row in rows):
        length += 1
    return length


def greedy_ids(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    eos_token_id: int | list[int] | None,
    pad_token_id: int | None,
) -> list[list[int]]:
    """The token ids of greedy completions by ``model.generate``, one prompt at a time (no padding),
    ending at ``eos_token_id`` (never, where None)."""
    import torch

    completions = []
    with torch.inference_mode():
        for ids in prompt_ids:
            inputs = torch.tensor([list(ids)])
            output = model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
            )
            completions.append(output[0, inputs.shape[1] :].tolist())
    return completions


def greedy_completions(
    model: Any, tokenizer: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int
) -> list[str]:
    """Greedy completions, one prompt at a time (no padding), ending at the tokenizer's end token,
    special tokens skipped."""
    completions = greedy_ids(
        model,
        prompt_ids,
        max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]


#: What a padding slot's value becomes in :func:`poison_padding`: finite weights, an infinite product.
HUGE = 3e38


def poison_padding(tensors: dict[str, Any], pad_id: int) -> None:
    """Edit a Qwen2/Llama state dict in place so that only a padding slot computes an infinite
    value: the pad token's embedding becomes one-hot in the last dimension, which no other token
    uses, and the first layer's value projection multiplies that dimension by :data:`HUGE`. A row
    without padding (alone, or the longest of its batch) computes only finite values; a left-padded
    row meets an infinite value behind its mask, and zero weight times it is NaN."""
    embeddings = tensors["model.embed_tokens.weight"]
    last = embeddings.shape[1] - 1
    embeddings[:, last] = 0.0
    embeddings[pad_id] = 0.0
    embeddings[pad_id, last] = 1.0
    tensors["model.layers.0.self_attn.v_proj.weight"][:, last] = HUGE
