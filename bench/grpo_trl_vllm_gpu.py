"""GRPO on one GPU: TRL's ``GRPOTrainer`` with colocated vLLM against the example agent's fast path.

TRL 1.16 recommends ``use_vllm=True, vllm_mode="colocate"`` (vLLM in the training process, on
the same GPU, weights synced into it before every generation). This measures that against
:class:`autorl_agents.fast_grpo.FastGRPO` (the example agent's GRPO path on a CUDA GPU), in one
call on one machine, each variant in a fresh process of its own (a vLLM engine cannot be started
twice in one process), on:

- the same model: by default the Qwen2.5-1.5B architecture with random bf16 weights drawn from
  ``--seed`` (bench/hf_eval_gpu.py's checkpoint and the builtin tiny model's Qwen2-format
  tokenizer); with ``--checkpoint DIR`` a trained checkpoint instead (below). Either way the
  tokenizer is padded to the model's vocabulary (vLLM detokenizes every id it samples; an id its
  tokenizer does not know would stop it) by :func:`pad_vocabulary`, which keeps every id it had;
- the same prompts, in the same order: 4-shot GSM8K prompts (the evaluated ``gsm8k_gen_1d7fe4``
  prompt in the checkpoint's chat template) around generated problems, TRL's dataset laid out in
  the order the fast path draws them (and TRL's shuffling off), so that step ``k`` of either path
  gets the same ``P`` problems; each step records which;
- the same algorithm settings: ``P`` prompts x ``G`` generations a step, one policy update per
  generation batch, no KL term, TRL's ``dapo`` loss, AdamW at a constant ``--learning-rate``,
  gradients clipped at norm 1, temperature 1 over the whole vocabulary, ``--completion-tokens`` at
  most, seed ``--seed``. Reward: the gsm8k task's, +1 for a right final answer, -1 otherwise.

Timed: whole steps (generation, reward, loss, backward, optimizer step, and for TRL the weight
sync into vLLM), the first step of each variant left out as warm-up; completion tokens per second
over the timed steps and the mean reward of every step. TRL's engine start (building the trainer,
vLLM's initialisation included) is reported apart.

**Learning per step** (``--checkpoint``): random weights answer nothing (every reward -1, every
advantage 0), so learning needs a trained checkpoint: bench/resident_engine_gpu.py's ``T2`` (the
Qwen2.5-1.5B architecture fine-tuned on generated problems in the evaluated 4-shot prompt, about
10 % greedy accuracy). Both paths start from it; GRPO and held-out problems are generated problems
that are neither among T2's training draw nor among the evaluated split. Each variant records its
mean reward and accuracy per step (every step, the warm-up too, is a learning step) and saves its
final weights; one more process then answers ``--held-out`` problems greedily with one engine
(``autorl.decoding.greedy_engine``, bf16) for T2 as it was and for each variant's final weights.
TRL keeps its own defaults for a model named by its path: float32 weights under bf16 autocast;
the fast path keeps bf16 weights with float32 copies in its optimizer, so neither loses small
updates to bf16 rounding. ``--deadline-s`` bounds the whole call: steps stop early when the next
would end past it (less the held-out evaluation's reserve), and the steps run are recorded.

    PYTHONPATH=.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/grpo_trl_vllm_gpu.py \\
        [--variants trl_vllm_2x4 fast_2x4 ...] [--steps 3] [--output PATH]
    PYTHONPATH=/root/site:.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 python3 \\
        bench/grpo_trl_vllm_gpu.py --checkpoint /root/resident/T2 --steps 12 --output PATH
    .venv/bin/python bench/grpo_trl_vllm_gpu.py --merge A.json B.json   # calls' files into one
    .venv/bin/python bench/grpo_trl_vllm_gpu.py --smoke [--checkpoint builtin:tiny-qwen2]  # CPU check

with TRL 1.16, datasets and vLLM 0.25 installed beside the GPU machine's packages
(bench/data/trl-1.16-wheels.txt, bench/data/vllm-0.25-serve-wheels.txt). Writes
``bench/results/grpo_trl_vllm_gpu.json`` (or ``--output``) after every variant.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

RESULTS = common.RESULTS_DIR / "grpo_trl_vllm_gpu.json"
DEFAULT_VARIANTS = ["trl_vllm_2x4", "fast_2x4", "trl_vllm_16x8", "fast_16x8", "trl_vllm_64x8", "fast_64x8"]
#: With ``--checkpoint``: the fast path first, so that the deadline, if anything, shortens TRL's run.
LEARNING_VARIANTS = ["fast_16x8", "trl_vllm_16x8"]
#: ``--smoke`` on the CPU: TRL without vLLM.
SMOKE_VARIANTS = ["fast_2x4", "trl_2x4"]
#: The learning rate of the random-weights throughput runs (the reference agent's for a 1.5B model).
THROUGHPUT_LEARNING_RATE = 1e-6
#: The learning rate of the learning comparison: at 1e-6 thirteen Adam steps move a weight by at
#: most about 1.3e-5, far too little to change a 10 %-accuracy model's answers; T2 itself was
#: fine-tuned at 3e-4, and 1e-4 is a third of that.
CHECKPOINT_LEARNING_RATE = 1e-4
#: Held-out problems answered greedily before and after, with ``--checkpoint``.
HELD_OUT = 256
#: bench/resident_engine_gpu.py's gpu_prepare trains T1 and T2 on ``training_examples(recorded,
#: 4096)``: the first 4,096 problems of ``generate_problems(TRAIN_PROBLEM_SEED, 4,096 + the
#: evaluated split's size)`` that are not evaluated ones. All of that draw is kept out here.
T2_TRAINING_PROBLEMS = 4096
#: The seed of the GRPO and held-out problems (another draw than T2's and the evaluated split's).
LEARNING_PROBLEM_SEED = 20_261_205
LEARNING_PROBLEM_DRAW = 5000


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One results file from several calls' (consecutive runs on the GPU machine): each call's date
    and command under ``calls``, every variant with the index of its call, ratios within a call
    (``ratios``) and, where a size's two paths ran in different calls, across them
    (``ratios_across_calls``).

    A file that is itself a merge keeps its calls; a learning run (``--checkpoint``: it has a
    ``learning`` comparison) goes whole under ``learning_run``, its variants apart from the
    random-weights ones (the last such run given wins)."""
    throughput = [r for r in reports if "learning" not in r]
    runs = [r for r in reports if "learning" in r]
    if not throughput:
        raise ValueError("no random-weights run among the files to merge")
    merged = {
        key: value
        for key, value in throughput[0].items()
        if key not in ("variants", "ratios", "calls", "learning_run")
    }
    merged["calls"] = []
    merged["variants"] = {}
    merged["ratios"] = {}
    for report in throughput:
        offset = len(merged["calls"])
        merged["calls"] += report.get("calls") or [{"date": report["date"], "command": report["command"]}]
        for name, record in report["variants"].items():
            if name in merged["variants"]:
                raise ValueError(f"variant {name} is in two calls")
            merged["variants"][name] = {**record, "call": offset + record.get("call", 0)}
        # A merged file's ratios were taken within its calls; a call's own are taken here.
        merged["ratios"].update(report["ratios"] if "calls" in report else common.ratios(report["variants"]))
        if "learning_run" in report:
            merged["learning_run"] = report["learning_run"]
    every = common.ratios(merged["variants"])
    across = {name: ratio for name, ratio in every.items() if name not in merged["ratios"]}
    if across:  # the two paths of one size in different calls of one warm machine
        merged["ratios_across_calls"] = across
    if runs:
        merged["learning_run"] = runs[-1]
    return merged


# --------------------------------------------------------------------------- the checkpoint


def resolve_checkpoint(source: str, scratch: Path) -> Path:
    """A checkpoint folder, or ``builtin:NAME`` built into ``scratch``."""
    from autorl.models.sources import resolve_model

    return resolve_model(source, scratch / "models").resolve()


def prepare_checkpoint(source: Path, target: Path) -> dict[str, Any]:
    """``target``: ``source``'s files (its weights linked, not copied) with the tokenizer padded to
    the model's vocabulary; what it is, for the report."""
    from safetensors import safe_open

    target.mkdir(parents=True)
    parameters = 0
    for path in sorted(source.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            (target / path.name).symlink_to(path.resolve())
            with safe_open(str(path), framework="pt") as handle:
                for name in list(handle.keys()):
                    parameters += math.prod(handle.get_slice(name).get_shape())
        else:
            shutil.copyfile(path, target / path.name)
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    added = common.pad_vocabulary(target, config["vocab_size"])
    described: dict[str, Any] = {
        "source": str(source),
        "parameters": parameters,
        "vocab_size": config["vocab_size"],
        "tokenizer_ids_added": added,
        "eos_token_id": config.get("eos_token_id"),
    }
    prepared = source.parent / "prepare.json"  # bench/resident_engine_gpu.py --phase prepare's record
    if prepared.exists():
        training = json.loads(prepared.read_text(encoding="utf-8")).get("training", {})
        described["training"] = {
            key: training[key]
            for key in ("steps", "saves", "batch", "learning_rate", "seconds", "loss_first_last", "examples")
            if key in training
        }
    return described


def learning_problems(held_out: int, grpo: int) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """Held-out and GRPO problems (disjoint, in that order of one draw), none of them among T2's
    training draw or the evaluated split (bench/resident_engine_gpu.py, bench/opencompass_vllm_gpu.py)."""
    from autorl.tasks.arith import generate_problems

    evaluated = {problem.question for problem in common.evaluated_problems()}
    trained = {
        p.question
        for p in generate_problems(common.TRAIN_PROBLEM_SEED, T2_TRAINING_PROBLEMS + len(evaluated))
    }
    fresh = [
        p
        for p in generate_problems(LEARNING_PROBLEM_SEED, LEARNING_PROBLEM_DRAW)
        if p.question not in evaluated and p.question not in trained
    ]
    if len(fresh) < held_out + grpo:
        raise ValueError(f"{len(fresh)} fresh problems, {held_out} + {grpo} asked for")
    return (
        fresh[:held_out],
        fresh[held_out : held_out + grpo],
        {
            "seed": LEARNING_PROBLEM_SEED,
            "held_out": held_out,
            "grpo": grpo,
            "kept_out": "T2's training draw (generate_problems with bench/resident_engine_gpu.py's "
            f"TRAIN_PROBLEM_SEED {common.TRAIN_PROBLEM_SEED}, {len(trained):,} problems) and the "
            f"evaluated split ({len(evaluated):,})",
        },
    )


def prompt_check(source: Path, model_dir: Path) -> dict[str, Any]:
    """Whether the prompts here are those the checkpoint learned: the gsm8k task's prompt for each
    evaluated problem against OpenCompass's recorded prompt (``recorded.json.gz`` beside the
    checkpoint, where bench/resident_engine_gpu.py --phase prepare leaves it; T2's training
    prompts are those with their question replaced)."""
    from transformers import AutoTokenizer

    from autorl.tasks import get_task

    recorded_file = source.parent / "recorded.json.gz"
    if not recorded_file.exists():
        return {"checked": False, "why": f"no {recorded_file.name} beside the checkpoint"}
    with gzip.open(recorded_file, "rt", encoding="utf-8") as handle:
        prompts = json.load(handle)["prompts"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = get_task("gsm8k")
    problems = common.evaluated_problems()
    equal = sum(
        task.render_prompt(tokenizer, p.question) == prompt
        for p, prompt in zip(problems, prompts, strict=True)
    )
    return {"checked": True, "recorded_prompts": len(prompts), "equal": equal}


def learning_records(tokenizer: Any, problems: list[Any]) -> list[dict[str, Any]]:
    """Each problem in the gsm8k task's prompt (the evaluated one), with its answer and index."""
    from autorl.tasks import get_task

    task = get_task("gsm8k")
    return [
        {"prompt": task.render_prompt(tokenizer, p.question), "answer": p.answer, "index": index}
        for index, p in enumerate(problems)
    ]


# --------------------------------------------------------------------------- one variant (a process)


class RewardLog:
    """The gsm8k reward, each call's rewards and problems kept (one call a generation batch): the
    problem indices come with the call (TRL passes the dataset's columns) or from :attr:`drawn`."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.calls: list[dict[str, Any]] = []
        self.drawn: list[int] = []

    def reward(
        self, completions: list[Any], answer: list[str], index: list[int] | None = None, **kwargs: Any
    ) -> list[float]:
        """Rewards of ``completions`` against ``answer``: called by the fast path, or by TRL with the
        dataset's columns by name (``index`` among them) and what else it passes in ``kwargs``."""
        rewards = [float(r) for r in self.task.reward(completions, answer)]
        problems = sorted(set(index)) if index is not None else self.drawn
        self.calls.append({"rewards": rewards, "problems": problems})
        return rewards


def step_record(seconds: float, completion_tokens: int, call: dict[str, Any], group: int) -> dict[str, Any]:
    """One step: its time and completion tokens, and from its rewards (+1 right, -1 wrong) the mean
    reward, the share right and how many groups had both (the only ones with an advantage)."""
    rewards = call["rewards"]
    groups = [rewards[i : i + group] for i in range(0, len(rewards), group)]
    return {
        "seconds": round(seconds, 3),
        "completion_tokens": completion_tokens,
        "reward": round(statistics.mean(rewards), 4),
        "accuracy": round(sum(r > 0 for r in rewards) / len(rewards), 4),
        "groups_with_signal": sum(len(set(g)) > 1 for g in groups),
        "problems": call["problems"],
    }


def run_variant(variant: common.Variant, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.tasks import get_task

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    learning = args.held_out > 0
    task = get_task("gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    count = max(256, variant.prompts * (args.steps + 1))
    if learning:
        _, problems, _ = learning_problems(args.held_out, variant.prompts * (args.steps + 1))
        records = learning_records(tokenizer, problems)
    else:
        records = [{**r, "index": i} for i, r in enumerate(common.gsm8k_records(tokenizer, count))]
    # The fast path keeps bf16 weights (float32 copies in its optimizer). TRL is given what it
    # loads for a model named by its path: float32 weights (it trains under bf16 autocast), except
    # in the random-weights runs, which gave it the bf16 model.
    dtype = torch.float32
    if device == "cuda" and (variant.engine == "fast" or not learning):
        dtype = torch.bfloat16
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device)
    training = Training(variant, model, tokenizer, RewardLog(task), records, args)
    if variant.engine == "fast":
        steps = _fast(training)
        extra: dict[str, Any] = {}
    else:
        steps, extra = _trl(training)
    result: dict[str, Any] = common.summarise(steps, variant.completions) if len(steps) >= 2 else {}
    result.update(
        extra,
        steps_run=len(steps),
        policy_dtype=str(dtype).removeprefix("torch."),
        reward_per_step=[s["reward"] for s in steps],
        accuracy_per_step=[s["accuracy"] for s in steps],
        steps=steps,
    )
    if args.save_weights is not None:
        started = time.monotonic()
        save_weights(model, args.save_weights)
        result["save_weights_s"] = round(time.monotonic() - started, 1)
    if device == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return result


def save_weights(model: Any, path: Path) -> None:
    """The policy's parameters (each tied one once) as a safetensors file, in bf16 on a GPU."""
    import torch
    from safetensors.torch import save_file

    dtype = torch.bfloat16 if model.device.type == "cuda" else torch.float32
    tensors = {name: p.detach().to(dtype).contiguous().cpu() for name, p in model.named_parameters()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def end_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids a completion ends at: the generation config's end ids (where vLLM and transformers'
    ``generate`` stop, TRL's engines both) and the tokenizer's end token (the example agent's set)."""
    eos = model.generation_config.eos_token_id
    ids = {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def _out_of_time(stop_at: float | None, next_step_s: float) -> bool:
    """Whether a step of ``next_step_s`` started now would end past ``stop_at`` (wall clock)."""
    return stop_at is not None and time.time() + next_step_s > stop_at


@dataclass(frozen=True)
class Training:
    """What one variant trains with, on either path: the policy and its tokenizer, the reward log,
    the problems (``records``) and the call's arguments."""

    variant: common.Variant
    model: Any
    tokenizer: Any
    rewards: RewardLog
    records: list[dict[str, Any]]
    args: Any


def _fast(run: Training) -> list[dict[str, Any]]:
    from autorl_agents.fast_grpo import FastGRPOSettings

    variant, rewards, records, args = run.variant, run.rewards, run.records, run.args
    settings = FastGRPOSettings(
        prompts_per_step=variant.prompts,
        num_generations=variant.generations,
        max_completion_length=args.completion_tokens,
        learning_rate=args.learning_rate,
        seed=args.seed,
        loss_micro_batch=common.micro_batch(),
    )
    ends = end_ids(run.model, run.tokenizer)
    trainer = common.fast_trainer(run.model, run.tokenizer, rewards, records, settings, ends)
    drawn = trainer.next_problems

    def next_problems() -> list[int]:  # the step's problems, for the record
        chosen: list[int] = drawn()
        rewards.drawn = sorted(records[i]["index"] for i in chosen)
        return chosen

    trainer.next_problems = next_problems
    steps: list[dict[str, Any]] = []
    for _ in range(args.steps + 1):
        if steps and _out_of_time(args.stop_at, steps[-1]["seconds"]):
            common.log(f"{variant.name}: stopped after {len(steps)} steps (deadline)")
            break
        s = trainer.step()
        step = step_record(s.seconds, s.completion_tokens, rewards.calls[-1], variant.generations)
        steps.append({**step, "rollout_s": round(s.rollout_s, 3), "train_s": round(s.train_s, 3)})
        common.log(
            f"{variant.name} step {s.step}: { {k: v for k, v in steps[-1].items() if k != 'problems'} }"
        )
    return steps


def _trl(run: Training) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    variant, rewards, args = run.variant, run.rewards, run.args

    marks: list[float] = []
    logs: list[dict[str, float]] = []
    started = time.monotonic()
    stop_at = args.stop_at  # on_step_end's own args are TRL's training arguments

    class Clock(TrainerCallback):
        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> TrainerControl:
            common.synchronize()
            marks.append(time.monotonic())
            last = marks[-1] - (marks[-2] if len(marks) > 1 else started)
            if _out_of_time(stop_at, last):
                common.log(f"{variant.name}: stopping after {len(marks)} steps (deadline)")
                control.should_training_stop = True
            return control

        def on_log(self, *a: Any, **k: Any) -> None:
            entry = k.get("logs")
            if entry and "completions/mean_length" in entry:
                logs.append(dict(entry))

    micro, accumulation = variant.trl_batches(common.micro_batch())
    vllm = variant.engine == "trl_vllm"
    with common.trl_grpo_trainer(
        variant,
        run.model,
        run.tokenizer,
        rewards.reward,
        run.records,
        completion_tokens=args.completion_tokens,
        learning_rate=args.learning_rate,
        seed=args.seed,
        max_steps=args.steps + 1,
        callbacks=[Clock()],
    ) as (trainer, start_s):
        started = time.monotonic()
        trainer.train()
    seconds = [b - a for a, b in zip([started, *marks], marks, strict=False)]
    steps = [
        step_record(
            s, round(entry["completions/mean_length"] * variant.completions), call, variant.generations
        )
        for s, entry, call in zip(seconds, logs, rewards.calls, strict=False)
    ]
    for step in steps:
        common.log(f"{variant.name}: { {k: v for k, v in step.items() if k != 'problems'} }")
    extra = {
        "trainer_start_s": round(start_s, 1),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "trl_defaults_kept": "gradient_checkpointing, loss_type, scale_rewards, vLLM's importance "
        "sampling correction, vllm_gpu_memory_utilization",
    }
    if vllm:
        extra["vllm_mode"] = "colocate"
        extra["vllm_gpu_memory_utilization"] = trainer.args.vllm_gpu_memory_utilization
    return steps, extra


# --------------------------------------------------------------------------- held-out answers (a process)


def evaluate_held_out(model_dir: Path, weights: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Greedy answers to the held-out problems with one engine and one model: the checkpoint as it
    is (``checkpoint``), then each of ``weights`` (a variant's final parameters) loaded into it."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.decoding.greedy_engine import generate_greedy
    from autorl.tasks import get_task

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    task = get_task("gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    held_out, _, described = learning_problems(args.held_out, 0)
    prompts = [tokenizer(r["prompt"]).input_ids for r in learning_records(tokenizer, held_out)]
    answers = [p.answer for p in held_out]
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    count = sum(p.numel() for p in original.values())
    eos = end_ids(model, tokenizer)
    out: dict[str, Any] = {"problems": described, "engine": "autorl.decoding.greedy_engine", "answers": {}}
    for name, path in [("checkpoint", None), *weights.items()]:
        started = time.monotonic()
        if path is not None:
            state = load_file(str(path), device=device)
            with torch.no_grad():
                for parameter_name, parameter in model.named_parameters():
                    parameter.copy_(state.pop(parameter_name))
            if state:
                raise ValueError(f"{path.name}: tensors the model does not have: {sorted(state)[:5]}")
            del state
        with torch.no_grad():
            change = sum(
                float((p.float() - original[key].float()).abs().sum()) for key, p in model.named_parameters()
            )
        loaded = time.monotonic()
        output = generate_greedy(
            model,
            prompts,
            max_new_tokens=args.completion_tokens,
            eos_ids=eos,
            pad_id=tokenizer.pad_token_id or 0,
        )
        common.synchronize()
        texts = tokenizer.batch_decode(output.tokens, skip_special_tokens=True)
        right = sum(r > 0 for r in task.reward(texts, answers))
        out["answers"][name] = {
            "accuracy": round(100 * right / len(answers), 2),
            "opencompass_accuracy": round(task.score(texts, answers)["opencompass"], 2),
            "right": right,
            "stopped": sum(bool(ids) and ids[-1] in eos for ids in output.tokens),
            "mean_new_tokens": round(statistics.mean(len(ids) for ids in output.tokens), 1),
            "weights_mean_abs_change": float(f"{change / count:.3g}"),
            "load_s": round(loaded - started, 1),
            "generate_s": round(time.monotonic() - loaded, 1),
        }
        common.log(f"held out, {name}: {out['answers'][name]}")
    return out


def learning_comparison(
    variants: dict[str, dict[str, Any]], held_out: dict[str, Any] | None
) -> dict[str, Any]:
    """The reward curves side by side: over the steps every variant ran, the mean reward of the
    first and the last third of them, whether each step gave every variant the same problems, and
    the held-out accuracy before and after each."""
    curves = {name: r["steps"] for name, r in variants.items() if r.get("status") == "ok" and r.get("steps")}
    answers = (held_out or {}).get("answers", {})
    out: dict[str, Any] = {"variants": {}}
    if not curves:
        return out
    common = min(len(steps) for steps in curves.values())
    window = max(1, common // 3)
    out.update(steps_compared=common, window=window)
    for name, steps in curves.items():
        rewards = [s["reward"] for s in steps[:common]]
        record: dict[str, Any] = {
            "steps_run": len(steps),
            "reward_per_step": [s["reward"] for s in steps],
            "accuracy_per_step": [s["accuracy"] for s in steps],
            "mean_reward_first": round(statistics.mean(rewards[:window]), 4),
            "mean_reward_last": round(statistics.mean(rewards[-window:]), 4),
        }
        if "checkpoint" in answers and name in answers:
            record["held_out_accuracy_before"] = answers["checkpoint"]["accuracy"]
            record["held_out_accuracy_after"] = answers[name]["accuracy"]
        out["variants"][name] = record
    drawn = [[s.get("problems") for s in steps[:common]] for steps in curves.values()]
    out["same_problems_every_step"] = all(d == drawn[0] for d in drawn) and all(p for p in drawn[0])
    return out


# --------------------------------------------------------------------------- the driver


def _child(args: argparse.Namespace, *extra: str) -> list[str]:
    """This script in a process of its own, with this call's settings and ``extra``."""
    return [
        sys.executable,
        __file__,
        "--steps",
        str(args.steps),
        "--completion-tokens",
        str(args.completion_tokens),
        "--learning-rate",
        str(args.learning_rate),
        "--seed",
        str(args.seed),
        "--held-out",
        str(args.held_out),
        *extra,
    ]


def _run_child(command: list[str], result: Path, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        subprocess.run(command, check=True, timeout=timeout)
        record: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    except Exception as exc:  # a failed process is a result too
        record = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
    record["process_s"] = round(time.monotonic() - started, 1)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", type=common.parse_variant, default=None)
    parser.add_argument("--steps", type=int, default=3, help="steps per variant after one warm-up step")
    parser.add_argument("--completion-tokens", type=int, default=None, help="256 (16 with --smoke)")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help=f"{THROUGHPUT_LEARNING_RATE} ({CHECKPOINT_LEARNING_RATE} with --checkpoint)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint",
        help="a trained checkpoint folder (or builtin:NAME) both paths start from: the learning comparison",
    )
    parser.add_argument(
        "--held-out",
        type=int,
        default=None,
        help=f"held-out problems answered greedily before and after, with --checkpoint "
        f"({HELD_OUT}; 8 with --smoke)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=540.0,
        help="start no variant after this; with --checkpoint also stop steps so that the call ends by it",
    )
    parser.add_argument("--variant-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--eval-reserve-s",
        type=float,
        default=75.0,
        help="with --checkpoint: seconds kept before the deadline for the held-out answers",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (checks the script)")
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)  # a child process's
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--save-weights", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", nargs="*", help=argparse.SUPPRESS)  # NAME=PATH of final weights
    parser.add_argument("--merge", type=Path, nargs="+", help="join these results files into --output")
    args = parser.parse_args()
    if args.merge:
        reports = [json.loads(path.read_text(encoding="utf-8")) for path in args.merge]
        args.output.write_text(json.dumps(merge(reports), indent=2) + "\n", encoding="utf-8")
        return 0
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    learning = args.checkpoint is not None
    if args.completion_tokens is None:
        args.completion_tokens = 16 if args.smoke else 256
    if args.learning_rate is None:
        args.learning_rate = CHECKPOINT_LEARNING_RATE if args.checkpoint else THROUGHPUT_LEARNING_RATE
    if args.held_out is None:
        args.held_out = (8 if args.smoke else HELD_OUT) if args.checkpoint else 0
    default = SMOKE_VARIANTS if args.smoke else LEARNING_VARIANTS if args.checkpoint else DEFAULT_VARIANTS
    variants: list[common.Variant] = args.variants or [common.parse_variant(v) for v in default]
    if args.result is not None:  # a child process: one variant, or the held-out answers
        try:
            if args.evaluate is not None:
                finals = {name: Path(path) for name, _, path in (w.partition("=") for w in args.evaluate)}
                record = {"status": "ok", **evaluate_held_out(args.model_dir, finals, args)}
            else:
                record = {"status": "ok", **run_variant(variants[0], args.model_dir, args)}
        except Exception as exc:
            traceback.print_exc()
            record = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        args.result.write_text(json.dumps(record), encoding="utf-8")
        return 0
    began, began_wall = time.monotonic(), time.time()
    report: dict[str, Any] = {
        "benchmark": "grpo_trl_vllm_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": common.command_line(args.output),
        "environment": common.environment(),
        "settings": {
            "completion_tokens": args.completion_tokens,
            "learning_rate": args.learning_rate,
            "seed": args.seed,
            "steps_timed": args.steps,
            "warmup_steps": 1,
            "loss_micro_batch": common.micro_batch(),
            "temperature": 1.0,
            "beta": 0.0,
            "reward": "the gsm8k task's: +1 for a right final answer, -1 otherwise",
        },
        "variants": {},
    }

    def save() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        checkpoint = scratch / "checkpoint"
        started = time.monotonic()
        if learning:
            source = resolve_checkpoint(args.checkpoint, scratch)
            report["model"] = {
                "description": f"the trained checkpoint {source.name} ({source}), its tokenizer padded "
                "to the model's vocabulary with every id kept",
                **prepare_checkpoint(source, checkpoint),
            }
            report["settings"].update(held_out=args.held_out, deadline_s=args.deadline_s)
            report["prompt_check"] = prompt_check(source, checkpoint)
            report["problems"] = learning_problems(
                args.held_out, max(v.prompts for v in variants) * (args.steps + 1)
            )[2]
        else:
            report["model"] = {
                "description": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed}), the "
                "builtin Qwen2-format tokenizer padded to the model's vocabulary",
                **common.build_padded_checkpoint(checkpoint, args.seed, args.smoke),
            }
        report["model"]["build_s"] = round(time.monotonic() - started, 1)
        tokenizer = _tokenizer(checkpoint)
        report["model"]["prompt_ids_mean"] = round(
            statistics.mean(
                len(tokenizer(r["prompt"]).input_ids) for r in common.gsm8k_records(tokenizer, 64)
            )
        )
        save()
        weights: dict[str, Path] = {}
        for variant in variants:
            if time.monotonic() - began > args.deadline_s:
                report["variants"][variant.name] = {"status": "skipped (deadline)"}
                continue
            common.log(f"variant {variant.name}")
            result = scratch / f"{variant.name}.json"
            extra = ["--variants", variant.name, "--model-dir", str(checkpoint), "--result", str(result)]
            if learning:
                weights[variant.name] = scratch / f"{variant.name}.safetensors"
                stop_at = began_wall + args.deadline_s - args.eval_reserve_s
                extra += ["--save-weights", str(weights[variant.name]), "--stop-at", str(stop_at)]
            record = _run_child(_child(args, *extra), result, args.variant_timeout_s)
            report["variants"][variant.name] = record
            common.log(f"{variant.name}: { {k: v for k, v in record.items() if k != 'steps'} }")
            report["ratios"] = common.ratios(report["variants"])
            report["total_s"] = round(time.monotonic() - began, 1)
            save()
        if learning:
            common.log("held-out answers")
            finished = [f"{name}={path}" for name, path in weights.items() if path.exists()]
            result = scratch / "held_out.json"
            extra = ["--model-dir", str(checkpoint), "--result", str(result), "--evaluate", *finished]
            report["held_out"] = _run_child(_child(args, *extra), result, args.variant_timeout_s)
            report["learning"] = learning_comparison(report["variants"], report["held_out"])
            report["total_s"] = round(time.monotonic() - began, 1)
            save()
    summary = {key: report.get(key) for key in ("ratios", "learning", "total_s")}
    common.log(json.dumps(summary))
    return 0


def _tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
