"""GRPO on one GPU: TRL's ``GRPOTrainer`` against the example agent's fast path, side by side.

1. **Throughput** (Qwen2.5-1.5B architecture, random bf16 weights, bench/hf_eval_gpu.py's
   checkpoint with the builtin tokenizer; 4-shot GSM8K prompts; random weights never stop, so
   every completion is ``--completion-tokens`` long): completion tokens per second over whole
   training steps (generation, reward, loss, backward, optimizer), the first step of each variant
   left out as warm-up. ``trl``: ``GRPOTrainer`` at the example agent's reference settings (2
   prompts x 4 generations a step); ``fast_PxG``:
   :class:`autorl_agents.fast_grpo.FastGRPO` with P prompts x G generations a step.
2. **Learning curve** (``arith``): a small Qwen2 model (random init, builtin tokenizer) is
   fine-tuned on the train split's reference solutions for ``--sft-s`` seconds (the fast path's
   update with every advantage 1), then trained with fast GRPO for ``--grpo-s`` seconds; mean
   reward per step, and greedy accuracy on 200 held-out problems (seed 12345) before and after.
3. **bf16 agreement**: that trained model's greedy completions through the engine against
   transformers ``generate`` in bf16 on ``--agreement-rows`` prompts: equal final answers, equal ids;
   beside it, ``generate`` against itself in batches of another size, and the engine against
   ``generate`` on a float32 copy of the model (is a difference rounding or a fault?).
4. **Weight swap** (the 1.5B checkpoint): a cold ``from_pretrained`` to the GPU against reading
   the safetensors file straight to the GPU into a resident model of the same architecture,
   each to the first generated id of one prompt.

    PYTHONPATH=.:bench:services/agents python3 bench/grpo_gpu.py

Writes ``bench/results/grpo_gpu.json`` after every part.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "grpo_gpu.json"
HELD_OUT_SEED = 12345
GRPO_LEARNING_RATE = 5e-5
#: TRL at the example agent's reference settings, as the design's reference measurements give it.
DESIGN_REFERENCE = {
    "trl_2x4_completion_tokens_per_s": 317,
    "source": "design document, reference measurements (one H200, 2026-11-30, TRL 1.16 GRPOTrainer at "
    "the same settings)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--trl-steps", type=int, default=4)
    parser.add_argument("--fast-steps", type=int, default=3)
    parser.add_argument("--fast-variants", nargs="*", default=["2x4", "32x8", "64x8"])
    parser.add_argument("--sft-s", type=float, default=60.0)
    parser.add_argument("--grpo-s", type=float, default=75.0)
    parser.add_argument("--agreement-rows", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script)")
    parser.add_argument("--parts", nargs="*", default=["throughput", "learning", "weight_swap"])
    args = parser.parse_args()
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {
        "benchmark": "grpo_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": "PYTHONPATH=.:bench:services/agents python3 bench/grpo_gpu.py",
        "environment": {
            "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": _version("trl"),
        },
    }

    def save() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        checkpoint = None
        if "throughput" in args.parts or "weight_swap" in args.parts:
            checkpoint = _checkpoint(root, args.smoke)

        def built() -> Path:
            assert checkpoint is not None, "built above for each part that uses it"
            return checkpoint

        parts: dict[str, Callable[[], dict[str, Any]]] = {
            "throughput": lambda: throughput(built(), args, device, results, save),
            "learning": lambda: learning(root, args, device),
            "weight_swap": lambda: weight_swap(built(), device),
        }
        for name, run in parts.items():
            if name not in args.parts:
                continue
            results.setdefault("runs", {})[name] = {
                "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
                "arguments": " ".join(sys.argv[1:]),
            }
            try:
                results[name] = run()
            except Exception as exc:  # one part's failure is recorded; the others still run
                traceback.print_exc()
                results[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
            save()
    common.log(json.dumps({k: v for k, v in results.items() if k != "environment"}, indent=1)[:6000])


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _checkpoint(root: Path, smoke: bool) -> Path:
    shape = common.SMOKE_SHAPE if smoke else None
    return common.build_checkpoint(root / "qwen25-1.5b", seed=0, shape=shape)[0]


def _load(checkpoint: Path, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    return tokenizer, model.to(device)


def throughput(
    checkpoint: Path,
    args: argparse.Namespace,
    device: str,
    results: dict[str, Any],
    save: Callable[[], None],
) -> dict[str, Any]:
    import torch

    from autorl.tasks import get_task

    task = get_task("gsm8k")
    tokenizer, model = _load(checkpoint, device)
    records = common.gsm8k_records(tokenizer, 2048)
    out: dict[str, Any] = {
        "model": "Qwen2.5-1.5B architecture, random bf16 weights (seed 0), builtin tokenizer",
        "parameters": sum(p.numel() for p in model.parameters()),
        "prompt_ids_mean": round(
            statistics.mean(len(tokenizer(r["prompt"]).input_ids) for r in records[:64])
        ),
        "completion_tokens": args.completion_tokens,
        "variants": {},
    }
    results["throughput"] = out  # written after each variant
    common.log("trl reference")
    try:
        out["variants"]["trl_2x4"] = _trl(model, tokenizer, task, records, args)
    except Exception as exc:  # the fast variants still run
        traceback.print_exc()
        out["variants"]["trl_2x4"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
    save()
    torch.cuda.empty_cache() if device == "cuda" else None
    for variant in args.fast_variants:
        prompts, generations = (int(n) for n in variant.split("x"))
        common.log(f"fast {variant}")
        out["variants"][f"fast_{variant}"] = _fast(
            model, tokenizer, task, records, prompts, generations, args
        )
        save()
        torch.cuda.empty_cache() if device == "cuda" else None
    reference = out["variants"]["trl_2x4"].get("completion_tokens_per_s")
    for record in out["variants"].values():
        if reference and "completion_tokens_per_s" in record:
            record["vs_trl_2x4"] = round(record["completion_tokens_per_s"] / reference, 2)
    out["design_reference"] = DESIGN_REFERENCE
    del model
    return out


def _trl(
    model: Any, tokenizer: Any, task: Any, records: list[dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    marks: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            common.synchronize()
            marks.append(time.monotonic())

        def on_log(self, *a: Any, logs: Any = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float | None]:
        return list(task.reward(completions, answer, **kwargs))

    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=args.completion_tokens,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            beta=0.0,
            bf16=model.dtype.itemsize == 2,
            use_cpu=model.device.type == "cpu",
            max_steps=args.trl_steps + 1,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=config,
            train_dataset=Dataset.from_list(records[:64]),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        started = time.monotonic()
        trainer.train()
    steps = [b - a for a, b in zip([started, *marks], marks, strict=False)][1:]
    mean_length = statistics.mean(lengths[1:] or lengths) if lengths else float(args.completion_tokens)
    tokens = 8 * mean_length
    seconds = statistics.mean(steps)
    return {
        "completions_per_step": 8,
        "steps_timed": len(steps),
        "step_s": round(seconds, 2),
        "mean_completion_tokens": round(mean_length, 1),
        "completion_tokens_per_s": round(tokens / seconds, 1),
    }


def _fast(
    model: Any,
    tokenizer: Any,
    task: Any,
    records: list[dict[str, str]],
    prompts: int,
    generations: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    from autorl_agents.fast_grpo import FastGRPOSettings

    settings = FastGRPOSettings(
        prompts_per_step=prompts,
        num_generations=generations,
        max_completion_length=args.completion_tokens,
        learning_rate=1e-6,
    )
    trainer = common.fast_trainer(model, tokenizer, task, records, settings)
    stats = [trainer.step() for _ in range(args.fast_steps + 1)][1:]
    tokens = sum(s.completion_tokens for s in stats)
    seconds = sum(s.seconds for s in stats)
    del trainer
    return {
        "completions_per_step": prompts * generations,
        "steps_timed": len(stats),
        "step_s": round(seconds / len(stats), 2),
        "rollout_s": round(sum(s.rollout_s for s in stats) / len(stats), 2),
        "train_s": round(sum(s.train_s for s in stats) / len(stats), 2),
        "mean_completion_tokens": round(tokens / sum(s.completions for s in stats), 1),
        "completion_tokens_per_s": round(tokens / seconds, 1),
    }


def learning(root: Path, args: argparse.Namespace, device: str) -> dict[str, Any]:
    from autorl.decoding.greedy_engine import generate_greedy
    from autorl.tasks.arith import ArithTask, generate_problems
    from autorl_agents.fast_grpo import FastGRPO, FastGRPOSettings
    from autorl_agents.sft import sft_target

    task = ArithTask()
    tokenizer, model = common.small_model(root, device, args.smoke)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    train = task.train_problems()[: 128 if args.smoke else None]
    held_out = generate_problems(HELD_OUT_SEED, 8 if args.smoke else 200)

    def prompts(problems: list[Any]) -> list[list[int]]:
        return [tokenizer(task.render_prompt(tokenizer, p.question)).input_ids for p in problems]

    train_prompts, test_prompts = prompts(train), prompts(held_out)

    def accuracy() -> float:
        output = generate_greedy(
            model, test_prompts, max_new_tokens=64, eos_ids=[eos], pad_id=tokenizer.pad_token_id
        )
        texts = tokenizer.batch_decode(output.tokens, skip_special_tokens=True)
        return round(task.score(texts, [p.answer for p in held_out])["opencompass"], 1)

    def trainer(lr: float, prompts_per_step: int, generations: int) -> Any:
        return FastGRPO(
            model=model,
            tokenizer=tokenizer,
            prompts=train_prompts,
            answers=[p.answer for p in train],
            reward=lambda completions, answers: task.reward(completions, answers),
            settings=FastGRPOSettings(
                prompts_per_step=prompts_per_step,
                num_generations=generations,
                max_completion_length=64,
                learning_rate=lr,
            ),
            eos_ids=[eos],
        )

    common.log("learning: initial accuracy")
    out: dict[str, Any] = {
        "model": f"Qwen2 architecture {common.SMALL_MODEL}, builtin tokenizer, random init, bf16",
        "parameters": sum(p.numel() for p in model.parameters()),
        "held_out": f"200 arith problems, seed {HELD_OUT_SEED}",
        "accuracy_initial": accuracy(),
    }
    targets = [[*tokenizer(sft_target(p.answer)).input_ids, eos] for p in train]
    sft = trainer(1e-3, 64, 2)
    started, sft_steps, losses = time.monotonic(), 0, []
    while time.monotonic() - started < args.sft_s:
        rows = sft.next_problems()
        losses.append(sft.update(rows, [targets[i] for i in rows], [1.0] * len(rows)))
        sft_steps += 1
    out["sft"] = {
        "seconds": round(time.monotonic() - started, 1),
        "steps": sft_steps,
        "rows_per_step": 64,
        "learning_rate": 1e-3,
        "last_loss": round(statistics.mean(losses[-10:]), 4),
    }
    common.log(f"sft: {out['sft']}")
    out["accuracy_after_sft"] = accuracy()
    common.log(f"accuracy after sft {out['accuracy_after_sft']}")
    del sft
    grpo = trainer(GRPO_LEARNING_RATE, 64, 8)
    curve = []
    started = time.monotonic()
    while time.monotonic() - started < args.grpo_s:
        s = grpo.step()
        curve.append(
            {
                "step": s.step,
                "reward": round(s.reward, 4),
                "completion_tokens_per_s": round(s.completion_tokens / s.seconds),
                "t_s": round(time.monotonic() - started, 1),
            }
        )
    out["grpo"] = {
        "prompts_per_step": 64,
        "num_generations": 8,
        "learning_rate": GRPO_LEARNING_RATE,
        "max_completion_length": 64,
        "curve": curve,
    }
    common.log(f"grpo: {len(curve)} steps, rewards {[c['reward'] for c in curve]}")
    out["accuracy_after_grpo"] = accuracy()
    common.log(f"accuracy after grpo {out['accuracy_after_grpo']}")
    del grpo
    out["agreement"] = agreement(
        model, tokenizer, task, train_prompts[: args.agreement_rows - len(test_prompts)] + test_prompts, eos
    )
    return out


def agreement(model: Any, tokenizer: Any, task: Any, prompts: list[list[int]], eos: int) -> dict[str, Any]:
    """Greedy final answers of the engine against ``generate``'s, same prompts, in the model's dtype.

    Two controls tell rounding from a fault: ``generate`` against itself with the same prompts in
    batches of another size (the floor any batched decoder can reach in this dtype), and the engine
    against ``generate`` on a float32 copy of the same model (where near-ties no longer round alike).
    """
    import copy

    import torch

    from autorl.decoding.greedy_engine import _generate_batch, generate_greedy
    from autorl.tasks.gsm8k import extract_answer

    def engine_ids(on: Any) -> list[list[int]]:
        return generate_greedy(
            on, prompts, max_new_tokens=64, eos_ids=[eos], pad_id=tokenizer.pad_token_id
        ).tokens

    def generate_ids(on: Any, batch_size: int) -> list[list[int]]:
        ids: list[list[int]] = []
        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                batch = prompts[start : start + batch_size]
                ids += _generate_batch(
                    on, batch, [64] * len(batch), [eos], tokenizer.pad_token_id, {"do_sample": False}
                )
        return ids

    def answers(ids: list[list[int]]) -> list[str | None]:
        return [extract_answer(t) for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    def compare(first: list[list[int]], second: list[list[int]]) -> dict[str, Any]:
        same = sum(a == b for a, b in zip(answers(first), answers(second), strict=True))
        return {
            "equal_final_answers": same,
            "equal_final_answers_pct": round(100 * same / len(prompts), 2),
            "identical_ids": sum(a == b for a, b in zip(first, second, strict=True)),
        }

    engine, reference = engine_ids(model), generate_ids(model, 250)
    result: dict[str, Any] = {
        "rows": len(prompts),
        **compare(engine, reference),
        "rows_with_an_answer": sum(a is not None for a in answers(reference)),
        "generate_batch_sizes": [250, 100],
        "generate_vs_generate_other_batches": compare(reference, generate_ids(model, 100)),
    }
    wide = copy.deepcopy(model).float()
    result["float32_engine_vs_generate"] = compare(engine_ids(wide), generate_ids(wide, 250))
    del wide
    return result


def weight_swap(checkpoint: Path, device: str) -> dict[str, Any]:
    """Cold load against a weight swap into a resident model, each to the first generated id."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompt = torch.tensor([tokenizer(common.gsm8k_records(tokenizer, 1)[0]["prompt"]).input_ids])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def first_token(model: Any) -> int:
        with torch.inference_mode():
            token = int(model(input_ids=prompt.to(device), logits_to_keep=1).logits[0, -1].argmax())
        common.synchronize()
        return token

    cold, warm = [], []
    resident = None
    for _ in range(3):
        started = time.monotonic()
        model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
        model = model.to(device).eval()
        cold_token = first_token(model)
        cold.append(time.monotonic() - started)
        if resident is None:
            resident = model
        else:
            del model
        started = time.monotonic()
        state = load_file(str(checkpoint / "model.safetensors"), device=device)
        resident.load_state_dict(state, strict=False)
        del state
        warm_token = first_token(resident)
        warm.append(time.monotonic() - started)
        assert warm_token == cold_token
    return {
        "model": "the 1.5B checkpoint of part 1 (3.1 GB safetensors, page cache warm after the first read)",
        "prompt_ids": int(prompt.shape[1]),
        "cold_load_to_first_token_s": [round(s, 2) for s in cold],
        "weight_swap_to_first_token_s": [round(s, 2) for s in warm],
    }


if __name__ == "__main__":
    main()
