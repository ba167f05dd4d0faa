"""GRPO that learns on one GPU: the example agent's fast path from a checkpoint with headroom.

1. **A checkpoint with headroom** (``C``): bench/common.py's small Qwen2 model (random init, the
   builtin tokenizer, bf16) fine-tuned on arith's train split's reference solutions (the fast path's
   update with every advantage 1, ``--sft-learning-rate``, 64 rows a step) until it answers
   ``--headroom`` percent of a 200-problem development draw (seed 777) greedily.
2. **A learning-rate sweep**: from ``C``, for each of ``--learning-rates``, the fast path's GRPO
   (``FastGRPO``: ``--prompts`` x ``--generations`` completions a step, temperature 1, seed 0,
   completions of at most 64 tokens) for ``--grpo-s`` seconds of training. Every ``--eval-every-s``
   seconds of training, greedy accuracy on the held-out draw (``--held-out`` arith problems of seed
   12345 whose questions are not in the train split; the evaluation's own time is not counted):
   accuracy against training seconds, and completion tokens per second over whole steps.
3. **Against ``C``**: each run's last held-out per-problem results paired with ``C``'s: McNemar's
   exact test (statsmodels), ``p_value`` with the gains and losses it counts.

On the GPU machine (torch, transformers, statsmodels there; nothing to carry):

    PYTHONPATH=.:bench:services/agents python3 bench/grpo_learning_gpu.py \\
        --output $OUT/grpo_learning_gpu.json

Here, the curve as a PNG for docs/PERFORMANCE.md:

    .venv/bin/python bench/grpo_learning_gpu.py --plot docs/grpo_learning_gpu.png

Writes ``bench/results/grpo_learning_gpu.json`` (or ``--output``) after every run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "grpo_learning_gpu.json"
HELD_OUT_SEED = 12345
DEVELOPMENT_SEED = 777
DEVELOPMENT_SIZE = 200
SFT_ROWS = 64
COMPLETION_TOKENS = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--headroom", type=float, default=25.0, help="development accuracy (%%) ending SFT")
    parser.add_argument("--sft-learning-rate", type=float, default=3e-4)
    parser.add_argument("--sft-check-steps", type=int, default=5, help="SFT steps between accuracy checks")
    parser.add_argument("--sft-max-s", type=float, default=180.0)
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4, 3e-4])
    parser.add_argument("--prompts", type=int, default=64, help="prompts a GRPO step")
    parser.add_argument("--generations", type=int, default=8, help="completions a prompt")
    parser.add_argument("--grpo-s", type=float, default=90.0, help="training seconds of each run")
    parser.add_argument("--eval-every-s", type=float, default=15.0)
    parser.add_argument("--held-out", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script)")
    parser.add_argument("--plot", type=Path, help="draw --output's curves into this PNG and stop")
    args = parser.parse_args()
    if args.plot:
        plot(json.loads(args.output.read_text(encoding="utf-8")), args.plot)
        return
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {
        "benchmark": "grpo_learning_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": "PYTHONPATH=.:bench:services/agents python3 bench/grpo_learning_gpu.py "
        + " ".join(sys.argv[1:]),
        "environment": {
            "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "settings": {
            k: v for k, v in vars(args).items() if k not in {"output", "plot"} and not isinstance(v, Path)
        },
    }

    def save() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as scratch:
        learn(Path(scratch), args, device, results, save)
    summary = {
        lr: {k: run[k] for k in ("accuracy", "p_value", "gains", "losses", "completion_tokens_per_s")}
        for lr, run in results["runs"].items()
    }
    common.log(json.dumps({"checkpoint": results["checkpoint"]["accuracy"], "runs": summary}, indent=1))


def learn(root: Path, args: argparse.Namespace, device: str, results: dict[str, Any], save: Any) -> None:
    import torch

    from autorl.decoding.greedy_engine import generate_greedy
    from autorl.tasks.arith import ArithTask, generate_problems
    from autorl_agents.fast_grpo import FastGRPOSettings
    from autorl_agents.sft import sft_target

    task = ArithTask()
    tokenizer, model = common.small_model(root, device, args.smoke)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    train = task.train_problems()[: 128 if args.smoke else None]
    seen = {p.question for p in train}
    held_out_size = 16 if args.smoke else args.held_out
    held_out = [p for p in generate_problems(HELD_OUT_SEED, 2 * held_out_size) if p.question not in seen]
    held_out = held_out[:held_out_size]
    development = [p for p in generate_problems(DEVELOPMENT_SEED, DEVELOPMENT_SIZE) if p.question not in seen]

    def prompts(problems: list[Any]) -> list[list[int]]:
        return [tokenizer(task.render_prompt(tokenizer, p.question)).input_ids for p in problems]

    held_out_prompts, development_prompts = prompts(held_out), prompts(development)
    records = [{"prompt": task.render_prompt(tokenizer, p.question), "answer": p.answer} for p in train]

    def judged(problems: list[Any], ids: list[list[int]]) -> list[bool]:
        output = generate_greedy(
            model, ids, max_new_tokens=COMPLETION_TOKENS, eos_ids=[eos], pad_id=tokenizer.pad_token_id
        )
        texts = tokenizer.batch_decode(output.tokens, skip_special_tokens=True)
        return task.judge(texts, [p.answer for p in problems], "opencompass")

    def percent(judgements: list[bool]) -> float:
        return round(100.0 * sum(judgements) / len(judgements), 2)

    def trainer(lr: float, prompts_per_step: int, generations: int) -> Any:
        settings = FastGRPOSettings(
            prompts_per_step=prompts_per_step,
            num_generations=generations,
            max_completion_length=COMPLETION_TOKENS,
            learning_rate=lr,
        )
        return common.fast_trainer(model, tokenizer, task, records, settings, eos_ids=[eos])

    # 1. The checkpoint with headroom.
    targets = [[*tokenizer(sft_target(p.answer)).input_ids, eos] for p in train]
    sft = trainer(args.sft_learning_rate, SFT_ROWS, 2)
    started, steps, checks = time.monotonic(), 0, []
    while time.monotonic() - started < args.sft_max_s:
        for _ in range(args.sft_check_steps):
            rows = sft.next_problems()
            sft.update(rows, [targets[i] for i in rows], [1.0] * len(rows))
            steps += 1
        accuracy = percent(judged(development, development_prompts))
        checks.append({"step": steps, "development_accuracy": accuracy})
        common.log(f"sft step {steps}: {checks[-1]['development_accuracy']} % of the development draw")
        if checks[-1]["development_accuracy"] >= args.headroom:
            break
    del sft
    base = judged(held_out, held_out_prompts)
    checkpoint = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    results["checkpoint"] = {
        "model": f"Qwen2 architecture {common.SMALL_MODEL}, builtin tokenizer, random init, {model.dtype}",
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft": {"steps": steps, "rows_per_step": SFT_ROWS, "learning_rate": args.sft_learning_rate},
        "sft_checks": checks,
        "held_out": f"{len(held_out)} arith problems of seed {HELD_OUT_SEED}, none in the train split",
        "accuracy": percent(base),
    }
    results["runs"] = {}
    save()

    # 2. and 3. GRPO from the checkpoint, one run a learning rate.
    from statsmodels.stats.contingency_tables import mcnemar

    for lr in args.learning_rates:
        model.load_state_dict(checkpoint)
        torch.manual_seed(0)
        grpo = trainer(lr, args.prompts, args.generations)
        curve = [{"t_s": 0.0, "step": 0, "accuracy": percent(base)}]
        trained_s, tokens, rewards, latest = 0.0, 0, [], base
        next_eval = args.eval_every_s
        while trained_s < args.grpo_s:
            stats = grpo.step()
            trained_s += stats.seconds
            tokens += stats.completion_tokens
            rewards.append(round(stats.reward, 4))
            if trained_s >= next_eval or trained_s >= args.grpo_s:
                latest = judged(held_out, held_out_prompts)
                curve.append({"t_s": round(trained_s, 1), "step": stats.step, "accuracy": percent(latest)})
                common.log(f"lr {lr:g}: {curve[-1]}")
                next_eval += args.eval_every_s
        del grpo
        gains = sum(1 for b, a in zip(base, latest, strict=True) if a and not b)
        losses = sum(1 for b, a in zip(base, latest, strict=True) if b and not a)
        both = sum(1 for b, a in zip(base, latest, strict=True) if a and b)
        table = [[both, losses], [gains, len(base) - both - gains - losses]]
        results["runs"][f"{lr:g}"] = {
            "learning_rate": lr,
            "prompts_per_step": args.prompts,
            "num_generations": args.generations,
            "steps": len(rewards),
            "trained_s": round(trained_s, 1),
            "completion_tokens_per_s": round(tokens / trained_s, 1),
            "rewards": rewards,
            "curve": curve,
            "accuracy": percent(latest),
            "gains": gains,
            "losses": losses,
            "p_value": float(mcnemar(table, exact=True).pvalue),
        }
        save()


def plot(results: dict[str, Any], target: Path) -> None:
    """Held-out accuracy against training seconds, one line a learning rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for name, run in results["runs"].items():
        points = run["curve"]
        axes.plot([p["t_s"] for p in points], [p["accuracy"] for p in points], marker="o", label=f"lr {name}")
    axes.set_xlabel("GRPO training seconds")
    axes.set_ylabel("held-out greedy accuracy (%)")
    held_out = results["checkpoint"]["held_out"].split(" of ")[0]
    gpu = results["environment"]["gpu"]
    axes.set_title(f"Fast-path GRPO from a checkpoint with headroom ({held_out}, {gpu})")
    axes.title.set_fontsize(9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, metadata={"Software": None})
    common.log(f"wrote {target}")


if __name__ == "__main__":
    main()
