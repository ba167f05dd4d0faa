"""GRPO that learns on one GPU: the example agent's fast path, and TRL with colocated vLLM beside it,
from a checkpoint with headroom.

1. **A checkpoint with headroom** (``C``): bench/common.py's small Qwen2 model (random init, the
   builtin tokenizer, bf16) fine-tuned on arith's train split's reference solutions (the fast path's
   update with every advantage 1, ``--sft-learning-rate``, 64 rows a step) until it answers
   ``--headroom`` percent of a 200-problem development draw (seed 777) greedily.
   ``--save-checkpoint DIR`` keeps it (weights, tokenizer, what it is in ``checkpoint.json``) for a
   later call's ``--checkpoint DIR``, which starts from it instead of training it again.
2. **A learning-rate sweep** (without ``--runs``): from ``C``, for each of ``--learning-rates``,
   the fast path's GRPO (``FastGRPO``: ``--prompts`` x ``--generations`` completions a step,
   temperature 1, seed 0, completions of at most 64 tokens) for ``--grpo-s`` seconds of training.
   Every ``--eval-every-s`` seconds of training, greedy accuracy on the held-out draw (``--held-out``
   arith problems of seed 12345 whose questions are not in the train split; the evaluation's own
   time is not counted): accuracy against training seconds, and completion tokens per second over
   whole steps.
3. **The two paths** (``--runs fast_64x8 trl_vllm_64x8``, at the one learning rate of
   ``--learning-rates``): from ``C``, each path in a process of its own (a vLLM engine starts once
   a process) with the same settings: prompts x generations a step, the learning rate, temperature
   1, completions of at most 64 tokens, seed ``--seed``, one policy update per generation batch, no
   KL term, and the same problems at every step (the train split cut to a multiple of the prompts
   a step, laid out for TRL's unshuffled sampler in the order the fast path draws them, epoch after
   epoch). Each trains for ``--grpo-s`` seconds of whole steps (generation, reward, loss, backward,
   optimizer step, and for TRL the weight sync into vLLM; the first step included, as an agent
   pays for it), with the held-out checkpoints of 2. (the policy's weights copied into one bf16
   model that answers greedily, the same engine for both paths). TRL keeps what it loads for a
   model named by its path: float32 weights under bf16 autocast; the fast path keeps bf16 weights
   with float32 copies in its optimizer. ``--speed-runs fast_1x8 trl_vllm_1x8``: the same from
   ``C`` for 1 + ``--speed-steps`` steps, completion tokens per second over whole steps after the
   first (warm-up). ``--deadline-s`` bounds the whole call: a run stops its steps early where the
   next would end past it, and the call writes its file before it.
4. **Against ``C``**: each run's last held-out per-problem results paired with ``C``'s: McNemar's
   exact test (``autorl.protocol.statistics.mcnemar_exact_p``), ``p_value`` with the gains and
   losses it counts.

On the GPU machine (torch and transformers there; for ``trl_vllm`` runs TRL 1.16 and vLLM
0.25 in /root/site), the sweep, then the two paths in two calls on one warm machine (bench/README.md
gives every argument): the first trains ``C`` and keeps it, the second starts from it:

    PYTHONPATH=.:bench:services/agents python3 bench/grpo_learning_gpu.py --grpo-s 80 \\
        --output $OUT/grpo_learning_gpu.json
    PYTHONPATH=/root/site:.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 python3 \\
        bench/grpo_learning_gpu.py --save-checkpoint /root/arith-C --runs fast_64x8 \\
        --speed-runs fast_1x8 trl_vllm_1x8 --learning-rates 3e-5 --grpo-s 120 \\
        --output $OUT/grpo_learning_paths_1.json
    PYTHONPATH=/root/site:.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 python3 \\
        bench/grpo_learning_gpu.py --checkpoint /root/arith-C --runs trl_vllm_64x8 \\
        --learning-rates 3e-5 --grpo-s 120 --output $OUT/grpo_learning_paths_2.json

Here: the calls' files joined (``--merge``, into ``bench/results/grpo_learning_paths_gpu.json`` by
default), the curves drawn (``--plot``: both paths where the file has them, else the sweep), and
the script checked on the CPU (``--smoke``: the builtin tiny model, TRL without vLLM):

    .venv/bin/python bench/grpo_learning_gpu.py --merge A/grpo_learning_paths_1.json \\
        B/grpo_learning_paths_2.json
    .venv/bin/python bench/grpo_learning_gpu.py --plot docs/grpo_learning_gpu.png
    PYTHONPATH=.:bench:services/agents .venv/bin/python bench/grpo_learning_gpu.py --smoke \\
        --runs fast_2x4 trl_2x4 --speed-runs fast_1x4 trl_1x4 --learning-rates 3e-5 --grpo-s 4 \\
        --eval-every-s 2 --sft-max-s 5 --speed-steps 2 --output /tmp/smoke.json

Writes ``bench/results/grpo_learning_gpu.json`` (the sweep) or ``--output`` after every run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

RESULTS = common.RESULTS_DIR / "grpo_learning_gpu.json"
#: The two paths' calls joined by ``--merge``.
PATHS_RESULTS = common.RESULTS_DIR / "grpo_learning_paths_gpu.json"
HELD_OUT_SEED = 12345
DEVELOPMENT_SEED = 777
DEVELOPMENT_SIZE = 200
SFT_ROWS = 64
#: Completion length (greedy answers and GRPO rollouts alike) unless --completion-tokens says otherwise.
COMPLETION_TOKENS = 64
#: What ``--save-checkpoint`` writes beside the weights: the checkpoint's record (its SFT, accuracy).
CHECKPOINT_RECORD = "checkpoint.json"
#: Seconds a run's process may run past the call's deadline before it is stopped (its start and its
#: last evaluation); the call still writes its file before 600 s with the default deadline.
RUN_GRACE_S = 25.0
#: Steps of a run's dataset for TRL (the fast path's draw order over as many epochs as that takes).
MAX_LEARNING_STEPS = 1000
#: When this process started: ``--deadline-s`` counts from it.
STARTED = time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help=f"default {RESULTS.name}, {PATHS_RESULTS.name} to merge")
    parser.add_argument("--headroom", type=float, default=25.0, help="development accuracy (%%) ending SFT")
    parser.add_argument("--sft-learning-rate", type=float, default=3e-4)
    parser.add_argument("--sft-check-steps", type=int, default=5, help="SFT steps between accuracy checks")
    parser.add_argument("--sft-max-s", type=float, default=180.0)
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4, 3e-4])
    parser.add_argument("--prompts", type=int, default=64, help="prompts a GRPO step (the sweep)")
    parser.add_argument("--generations", type=int, default=8, help="completions a prompt (the sweep)")
    parser.add_argument("--grpo-s", type=float, default=90.0, help="training seconds of each run")
    parser.add_argument("--eval-every-s", type=float, default=15.0)
    parser.add_argument("--held-out", type=int, default=1000)
    parser.add_argument(
        "--completion-tokens", type=int, default=COMPLETION_TOKENS, help="answers' and rollouts'"
    )
    parser.add_argument("--seed", type=int, default=0, help="GRPO's seed (torch, problem order, sampling)")
    parser.add_argument("--checkpoint", type=Path, help="start from C saved here (--save-checkpoint)")
    parser.add_argument("--save-checkpoint", type=Path, help="keep C here for a later call's --checkpoint")
    parser.add_argument(
        "--runs", nargs="*", type=common.parse_variant, default=[], help="learning runs, ENGINE_PxG"
    )
    parser.add_argument(
        "--speed-runs", nargs="*", type=common.parse_variant, default=[], help="throughput runs, ENGINE_PxG"
    )
    parser.add_argument("--speed-steps", type=int, default=20, help="timed steps of a speed run")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="the call ends by then (--runs)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script)")
    parser.add_argument("--plot", type=Path, help="draw --output's curves into this PNG and stop")
    parser.add_argument("--merge", type=Path, nargs="+", help="join these calls' files into --output")
    parser.add_argument("--run", type=common.parse_variant, help=argparse.SUPPRESS)  # a run's process
    parser.add_argument("--mode", choices=("learn", "speed"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    paths = bool(args.runs or args.speed_runs)
    if args.plot:
        source = args.output or (PATHS_RESULTS if PATHS_RESULTS.exists() else RESULTS)
        plot(json.loads(source.read_text(encoding="utf-8")), args.plot)
        return
    if args.merge:
        reports = [json.loads(path.read_text(encoding="utf-8")) for path in args.merge]
        target = args.output or PATHS_RESULTS
        target.write_text(json.dumps(merge(reports), indent=2) + "\n", encoding="utf-8")
        common.log(f"wrote {target}")
        return
    if (paths or args.run) and len(args.learning_rates) != 1:
        parser.error("--runs and --speed-runs take one learning rate (--learning-rates LR)")
    if args.run is not None:
        record = run_process(args)
        args.result.write_text(json.dumps(record), encoding="utf-8")
        return
    output: Path = args.output or RESULTS
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {
        "benchmark": "grpo_learning_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": common.command_line(output)
        if paths
        else "PYTHONPATH=.:bench:services/agents python3 bench/grpo_learning_gpu.py "
        + " ".join(sys.argv[1:]),
        "environment": common.environment()
        if paths
        else {
            "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in {"output", "plot", "merge", "run", "mode", "result", "stop_at", "runs", "speed_runs"}
            and not isinstance(v, Path)
        },
    }
    if paths:
        results["settings"].update(
            runs=[v.name for v in args.runs], speed_runs=[v.name for v in args.speed_runs]
        )

    def save() -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    if paths:
        two_paths(args, device, results, save)
        summary = {name: _summary(run) for name, run in {**results["runs"], **results["speed"]}.items()}
        common.log(json.dumps({"checkpoint": results["checkpoint"]["accuracy"], "runs": summary}, indent=1))
        return
    with tempfile.TemporaryDirectory() as scratch:
        sweep(Path(scratch), args, device, results, save)
    summary = {lr: _summary(run) for lr, run in results["runs"].items()}
    common.log(json.dumps({"checkpoint": results["checkpoint"]["accuracy"], "runs": summary}, indent=1))


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    kept = ("status", "accuracy", "p_value", "gains", "losses", "completion_tokens_per_s", "error")
    return {k: run[k] for k in kept if k in run}


# --------------------------------------------------------------------------- the task and its draws


class Arith:
    """arith's train records and the held-out and development draws in ``tokenizer``'s prompts,
    and greedy answers judged right or wrong."""

    def __init__(self, tokenizer: Any, smoke: bool, held_out_size: int, completion_tokens: int) -> None:
        from autorl.tasks.arith import ArithTask, generate_problems

        self.task = ArithTask()
        self.completion_tokens = completion_tokens
        self.tokenizer = tokenizer
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.train = self.task.train_problems()[: 128 if smoke else None]
        seen = {p.question for p in self.train}
        size = min(16, held_out_size) if smoke else held_out_size
        self.held_out = [p for p in generate_problems(HELD_OUT_SEED, 2 * size) if p.question not in seen][
            :size
        ]
        self.development = [
            p for p in generate_problems(DEVELOPMENT_SEED, DEVELOPMENT_SIZE) if p.question not in seen
        ]
        self.held_out_prompts = self.prompts(self.held_out)
        self.development_prompts = self.prompts(self.development)
        self.records = [
            {"prompt": self.task.render_prompt(tokenizer, p.question), "answer": p.answer, "index": index}
            for index, p in enumerate(self.train)
        ]

    def prompts(self, problems: list[Any]) -> list[list[int]]:
        return [
            self.tokenizer(self.task.render_prompt(self.tokenizer, p.question)).input_ids for p in problems
        ]

    def judged(self, model: Any, problems: list[Any], ids: list[list[int]]) -> list[bool]:
        from autorl.decoding.greedy_engine import generate_greedy

        output = generate_greedy(
            model,
            ids,
            max_new_tokens=self.completion_tokens,
            eos_ids=[self.eos],
            pad_id=self.tokenizer.pad_token_id,
        )
        texts = self.tokenizer.batch_decode(output.tokens, skip_special_tokens=True)
        return self.task.judge(texts, [p.answer for p in problems], "opencompass")

    def held_out_judged(self, model: Any) -> list[bool]:
        return self.judged(model, self.held_out, self.held_out_prompts)

    def describe_held_out(self) -> str:
        return f"{len(self.held_out)} arith problems of seed {HELD_OUT_SEED}, none in the train split"


def percent(judgements: list[bool]) -> float:
    return round(100.0 * sum(judgements) / len(judgements), 2)


def against(base: list[bool], latest: list[bool]) -> dict[str, Any]:
    """``latest`` paired with ``base``, problem by problem: McNemar's exact test (the platform's,
    checked against statsmodels in its tests) and what it counts."""
    from autorl.protocol.statistics import mcnemar_exact_p

    gains = sum(1 for b, a in zip(base, latest, strict=True) if a and not b)
    losses = sum(1 for b, a in zip(base, latest, strict=True) if b and not a)
    return {"gains": gains, "losses": losses, "p_value": mcnemar_exact_p(gains, losses)}


def fast_settings(lr: float, prompts: int, generations: int, completion_tokens: int, seed: int = 0) -> Any:
    from autorl_agents.fast_grpo import FastGRPOSettings

    return FastGRPOSettings(
        prompts_per_step=prompts,
        num_generations=generations,
        max_completion_length=completion_tokens,
        learning_rate=lr,
        seed=seed,
    )


def build_checkpoint(arith: Arith, model: Any, args: argparse.Namespace) -> dict[str, Any]:
    """SFT ``model`` in place until it answers ``--headroom`` % of the development draw (or
    ``--sft-max-s`` passed); what it became, held-out accuracy left for the caller."""
    from autorl_agents.sft import sft_target

    tokenizer = arith.tokenizer
    targets = [[*tokenizer(sft_target(p.answer)).input_ids, arith.eos] for p in arith.train]
    sft = common.fast_trainer(
        model,
        tokenizer,
        arith.task,
        arith.records,
        fast_settings(args.sft_learning_rate, SFT_ROWS, 2, args.completion_tokens),
        [arith.eos],
    )
    started, steps, checks = time.monotonic(), 0, []
    while time.monotonic() - started < args.sft_max_s:
        for _ in range(args.sft_check_steps):
            rows = sft.next_problems()
            sft.update(rows, [targets[i] for i in rows], [1.0] * len(rows))
            steps += 1
        accuracy = percent(arith.judged(model, arith.development, arith.development_prompts))
        checks.append({"step": steps, "development_accuracy": accuracy})
        common.log(f"sft step {steps}: {accuracy} % of the development draw")
        if accuracy >= args.headroom:
            break
    return {
        "model": f"Qwen2 architecture {'of the builtin tiny model' if args.smoke else common.SMALL_MODEL}, "
        f"builtin tokenizer, random init, {model.dtype}",
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft": {
            "steps": steps,
            "rows_per_step": SFT_ROWS,
            "learning_rate": args.sft_learning_rate,
            "seconds": round(time.monotonic() - started, 1),
        },
        "sft_checks": checks,
        "held_out": arith.describe_held_out(),
    }


# --------------------------------------------------------------------------- the sweep (one process)


def sweep(root: Path, args: argparse.Namespace, device: str, results: dict[str, Any], save: Any) -> None:
    import torch

    tokenizer, model = common.small_model(root, device, args.smoke)
    arith = Arith(tokenizer, args.smoke, args.held_out, args.completion_tokens)
    results["checkpoint"] = build_checkpoint(arith, model, args)
    base = arith.held_out_judged(model)
    results["checkpoint"]["accuracy"] = percent(base)
    checkpoint = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    results["runs"] = {}
    save()
    for lr in args.learning_rates:
        model.load_state_dict(checkpoint)
        torch.manual_seed(0)
        grpo = common.fast_trainer(
            model,
            tokenizer,
            arith.task,
            arith.records,
            fast_settings(lr, args.prompts, args.generations, args.completion_tokens),
            [arith.eos],
        )
        progress = Progress(lambda: arith.held_out_judged(model), args.grpo_s, args.eval_every_s, base=base)
        while True:
            stats = grpo.step()
            if progress.step(stats.seconds, stats.completion_tokens, stats.reward):
                break
        del grpo
        results["runs"][f"{lr:g}"] = {
            "learning_rate": lr,
            "prompts_per_step": args.prompts,
            "num_generations": args.generations,
            **progress.learned(),
        }
        common.log(f"lr {lr:g}: {_summary(results['runs'][f'{lr:g}'])}")
        save()


class Progress:
    """A run's steps: training seconds, completion tokens and rewards; the held-out accuracy at 0
    s, every ``eval_every_s`` training seconds and at the end (its own time not counted); when to
    stop (``seconds`` of training, ``max_steps`` steps, or the wall-clock ``stop_at``)."""

    def __init__(
        self,
        evaluate: Callable[[], list[bool]] | None,
        seconds: float,
        eval_every_s: float,
        *,
        max_steps: int | None = None,
        stop_at: float | None = None,
        base: list[bool] | None = None,
    ) -> None:
        self.evaluate, self.seconds, self.every = evaluate, seconds, eval_every_s
        self.max_steps, self.stop_at = max_steps, stop_at
        self.steps: list[dict[str, Any]] = []
        self.trained_s, self.next_eval, self.eval_s = 0.0, eval_every_s, 0.0
        self.curve: list[dict[str, Any]] = []
        self.stopped_by = ""
        self.base = self.latest = base or []
        if base is not None:  # the checkpoint's own answers, given
            self.curve.append({"t_s": 0.0, "step": 0, "accuracy": percent(base)})
        elif evaluate is not None:
            self.base = self._evaluate()

    def _evaluate(self) -> list[bool]:
        assert self.evaluate is not None
        started = time.monotonic()
        self.latest = self.evaluate()
        self.eval_s = time.monotonic() - started
        self.curve.append(
            {
                "t_s": round(self.trained_s, 1),
                "step": len(self.steps),
                "accuracy": percent(self.latest),
                "eval_s": round(self.eval_s, 1),
            }
        )
        return self.latest

    def step(self, seconds: float, tokens: int, reward: float, problems: int = 0) -> bool:
        """Record one whole step; evaluate where due; whether to stop."""
        self.steps.append(
            {
                "seconds": round(seconds, 3),
                "completion_tokens": tokens,
                "reward": round(reward, 4),
                "problems": problems,
            }
        )
        self.trained_s += seconds
        reasons = [
            ("seconds", self.trained_s >= self.seconds),
            ("steps", self.max_steps is not None and len(self.steps) >= self.max_steps),
            ("deadline", self.stop_at is not None and time.time() + seconds + self.eval_s > self.stop_at),
        ]
        self.stopped_by = next((name for name, due in reasons if due), "")
        if self.evaluate is not None and (self.trained_s >= self.next_eval or self.stopped_by):
            self._evaluate()
            common.log(f"held out: {self.curve[-1]}")
            while self.next_eval <= self.trained_s:
                self.next_eval += self.every
        return bool(self.stopped_by)

    def learned(self) -> dict[str, Any]:
        """The run's record: steps, seconds, tokens/s over whole steps, rewards, the curve and the
        last held-out accuracy against the first."""
        tokens = sum(s["completion_tokens"] for s in self.steps)
        return {
            "steps": len(self.steps),
            "trained_s": round(self.trained_s, 1),
            "stopped_by": self.stopped_by,
            "completion_tokens_per_s": round(tokens / self.trained_s, 1),
            "rewards": [s["reward"] for s in self.steps],
            "curve": self.curve,
            "accuracy": percent(self.latest),
            **against(self.base, self.latest),
        }


# --------------------------------------------------------------------------- the two paths


def two_paths(args: argparse.Namespace, device: str, results: dict[str, Any], save: Any) -> None:
    """``C`` (trained here, or read from ``--checkpoint``), then each run in a process of its own."""
    began = time.monotonic()
    results.update(runs={}, speed={})
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        checkpoint = args.checkpoint or args.save_checkpoint or scratch / "C"
        if args.checkpoint is None:
            save_checkpoint(scratch, checkpoint, args, device)
        results["checkpoint"] = {
            **json.loads((checkpoint / CHECKPOINT_RECORD).read_text(encoding="utf-8")),
            "directory": str(checkpoint),
        }
        results["problem_order"] = (
            "both paths draw the train split, cut to a multiple of the prompts a step, in the fast "
            f"path's order (seed {args.seed}): the same problems every step"
        )
        save()
        stop_at = STARTED + args.deadline_s
        for mode, variants in (("learn", args.runs), ("speed", args.speed_runs)):
            for variant in variants:
                group = results["runs" if mode == "learn" else "speed"]
                if time.time() > stop_at - RUN_GRACE_S:
                    group[variant.name] = {"status": "skipped (deadline)"}
                    continue
                common.log(f"{mode} run {variant.name}")
                result = scratch / f"{variant.name}-{mode}.json"
                command = [
                    sys.executable,
                    __file__,
                    *("--run", variant.name, "--mode", mode, "--checkpoint", str(checkpoint)),
                    *("--result", str(result), "--stop-at", str(stop_at)),
                    *("--learning-rates", str(args.learning_rates[0]), "--seed", str(args.seed)),
                    *("--grpo-s", str(args.grpo_s), "--eval-every-s", str(args.eval_every_s)),
                    *("--held-out", str(args.held_out), "--speed-steps", str(args.speed_steps)),
                    *("--completion-tokens", str(args.completion_tokens)),
                    *(["--smoke"] if args.smoke else []),
                ]
                started = time.monotonic()
                record = run_in_process(command, result, stop_at + RUN_GRACE_S)
                record["process_s"] = round(time.monotonic() - started, 1)
                group[variant.name] = record
                common.log(f"{variant.name}: {_summary(record)}")
                results["ratios"] = common.ratios({**results["runs"], **results["speed"]})
                results["total_s"] = round(time.monotonic() - began, 1)
                save()


def run_in_process(command: list[str], result: Path, end_at: float) -> dict[str, Any]:
    """``command``'s record from ``result``; the process is stopped at ``end_at`` (wall clock). A
    process that wrote its record and then failed or hung on its way out keeps the record, with why."""
    failure = ""
    try:
        subprocess.run(command, check=True, timeout=max(1.0, end_at - time.time()))
    except (subprocess.SubprocessError, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"[:2000]
    if not result.exists():
        return {"status": "error", "error": failure or "no record written"}
    record: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    if failure:
        record["process_failure"] = failure
    return record


def save_checkpoint(scratch: Path, target: Path, args: argparse.Namespace, device: str) -> None:
    """Train ``C`` here and keep it in ``target`` as a model folder both paths load (the tokenizer
    padded to the model's vocabulary for vLLM; generation ends at ``<|im_end|>``, as the fast path's)."""
    import torch

    tokenizer, model = common.small_model(scratch, device, args.smoke)
    arith = Arith(tokenizer, args.smoke, args.held_out, args.completion_tokens)
    record = build_checkpoint(arith, model, args)
    record["accuracy"] = percent(arith.held_out_judged(model))
    model.generation_config.eos_token_id = arith.eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    record["tokenizer_ids_added"] = common.pad_vocabulary(target, model.config.vocab_size)
    (target / CHECKPOINT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    common.log(f"C: {record['accuracy']} % held out, kept in {target}")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def run_process(args: argparse.Namespace) -> dict[str, Any]:
    """One run from ``C`` in this process: its record, or the error that ended it."""
    import traceback

    try:
        return {"status": "ok", **_run(args)}
    except Exception as exc:
        traceback.print_exc()
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    variant: common.Variant = args.run
    learn = args.mode == "learn"
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    arith = Arith(tokenizer, args.smoke, args.held_out, args.completion_tokens)
    bf16 = torch.bfloat16 if device == "cuda" else torch.float32
    dtype = bf16 if variant.engine == "fast" else torch.float32
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype)
    model = model.to(device)
    judge: Any = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=bf16)
    judge = judge.to(device).eval()

    def evaluate() -> list[bool]:
        policy = dict(model.named_parameters())
        with torch.no_grad():
            for name, parameter in judge.named_parameters():
                parameter.copy_(policy[name])
        return arith.held_out_judged(judge)

    progress = Progress(
        evaluate if learn else None,
        args.grpo_s if learn else float("inf"),
        args.eval_every_s,
        max_steps=None if learn else args.speed_steps + 1,
        stop_at=args.stop_at,
    )
    usable = len(arith.records) // variant.prompts * variant.prompts
    records = arith.records[:usable]
    ends = sorted({arith.eos, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
    started = time.monotonic()
    extra: dict[str, Any] = {}
    if variant.engine == "fast":
        _fast(variant, model, tokenizer, arith, records, ends, progress, args)
    else:
        extra = _trl(variant, model, tokenizer, arith, records, progress, args)
    common.log(f"{variant.name}: {len(progress.steps)} steps in {time.monotonic() - started:.1f} s")
    record: dict[str, Any] = {
        "engine": variant.engine,
        "prompts_per_step": variant.prompts,
        "num_generations": variant.generations,
        "learning_rate": args.learning_rates[0],
        "policy_dtype": str(dtype).removeprefix("torch."),
        "train_problems": usable,
        "problems_per_step": [s["problems"] for s in progress.steps],
        **extra,
    }
    if learn:
        record.update(progress.learned())
    else:
        record.update(common.summarise(progress.steps, variant.completions), stopped_by=progress.stopped_by)
    if device == "cuda":
        record["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return record


def digest(indices: list[int]) -> int:
    """A step's problems as one number (the same set of train indices, the same number)."""
    return zlib.crc32(json.dumps(sorted(indices)).encode())


def _fast(
    variant: common.Variant,
    model: Any,
    tokenizer: Any,
    arith: Arith,
    records: list[dict[str, Any]],
    ends: list[int],
    progress: Progress,
    args: argparse.Namespace,
) -> None:
    trainer = common.fast_trainer(
        model,
        tokenizer,
        arith.task,
        records,
        fast_settings(
            args.learning_rates[0], variant.prompts, variant.generations, args.completion_tokens, args.seed
        ),
        ends,
    )
    drawn = trainer.next_problems
    problems: list[int] = []

    def next_problems() -> list[int]:  # the step's problems, for the record
        chosen: list[int] = drawn()
        problems[:] = [records[i]["index"] for i in chosen]
        return chosen

    trainer.next_problems = next_problems
    while True:
        stats = trainer.step()
        if progress.step(stats.seconds, stats.completion_tokens, stats.reward, digest(problems)):
            break


def _trl(
    variant: common.Variant,
    model: Any,
    tokenizer: Any,
    arith: Arith,
    records: list[dict[str, Any]],
    progress: Progress,
    args: argparse.Namespace,
) -> dict[str, Any]:
    from transformers import TrainerCallback

    calls: list[tuple[float, int, int]] = []  # reward, completion tokens, problems of each generation batch
    mark = [0.0]

    def reward(completions: list[str], answer: list[str], index: list[int], **kwargs: Any) -> list[float]:
        rewards = [float(r) for r in arith.task.reward(completions, answer)]
        tokens = sum(len(ids) for ids in kwargs.get("completion_ids") or [])
        calls.append((sum(rewards) / len(rewards), tokens, digest(sorted(set(index)))))
        return rewards

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            common.synchronize()
            mark[0] = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            common.synchronize()
            seconds = time.monotonic() - mark[0]
            mean, tokens, problems = calls[-1]
            if progress.step(seconds, tokens, mean, problems):
                control.should_training_stop = True
            mark[0] = time.monotonic()  # after the evaluation, which is not training time
            return control

    with common.trl_grpo_trainer(
        variant,
        model,
        tokenizer,
        reward,
        records,
        completion_tokens=args.completion_tokens,
        learning_rate=args.learning_rates[0],
        seed=args.seed,
        max_steps=MAX_LEARNING_STEPS if args.mode == "learn" else args.speed_steps + 1,
        callbacks=[Clock()],
    ) as (trainer, start_s):
        trainer.train()
    extra: dict[str, Any] = {
        "trainer_start_s": round(start_s, 1),
        "generation_batches": len(calls),
        "trl_defaults_kept": "gradient_checkpointing, loss_type, scale_rewards, vLLM's importance "
        "sampling correction, vllm_gpu_memory_utilization",
    }
    if variant.engine == "trl_vllm":
        extra.update(
            vllm_mode="colocate", vllm_gpu_memory_utilization=trainer.args.vllm_gpu_memory_utilization
        )
    return extra


# --------------------------------------------------------------------------- merge and plot


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The two paths' calls in one file: each call's date, command and machine under ``calls``,
    every run with the index of its call, and the comparison (:func:`comparison`). Every call must
    have started from the same ``C``."""
    first = reports[0]
    merged: dict[str, Any] = {
        "benchmark": "grpo_learning_paths_gpu",
        "date": max(r["date"] for r in reports),
        "calls": [],
        "settings": first["settings"],
        "checkpoint": first["checkpoint"],
        "problem_order": first.get("problem_order"),
        "runs": {},
        "speed": {},
    }
    for index, report in enumerate(reports):
        if report["checkpoint"].get("sft_checks") != first["checkpoint"].get("sft_checks"):
            raise ValueError(f"call {index} did not start from the first call's checkpoint")
        merged["calls"].append(
            {"date": report["date"], "command": report["command"], "environment": report["environment"]}
        )
        for group in ("runs", "speed"):
            for name, record in report.get(group, {}).items():
                if name in merged[group]:
                    raise ValueError(f"{group} {name} is in two calls")
                merged[group][name] = {**record, "call": index}
    # Timings compare only on one kind of card: the calls' cards, for the reader to check.
    merged["cards"] = sorted({str(call["environment"].get("gpu", "CPU")) for call in merged["calls"]})
    merged["comparison"] = comparison(merged)
    return merged


def time_to(curve: list[dict[str, Any]], accuracy: float) -> float | None:
    """The training seconds of the first held-out checkpoint at or above ``accuracy``."""
    return next((point["t_s"] for point in curve if point["accuracy"] >= accuracy), None)


def comparison(merged: dict[str, Any]) -> dict[str, Any]:
    """Each fast-path run beside TRL's of the same size: final held-out accuracy, p against ``C``,
    the training seconds to reach ``C`` + 2, 4, 6 and 8 points, tokens/s, and how many leading
    steps drew the same problems; the speed runs' tokens/s ratios."""
    out: dict[str, Any] = {"learning": {}, "speed_ratios": common.ratios(merged["speed"])}
    start = merged["checkpoint"]["accuracy"]
    runs = merged["runs"]
    for name, fast in runs.items():
        if not name.startswith("fast_") or fast.get("status") != "ok":
            continue
        size = name.removeprefix("fast_")
        for engine in ("trl_vllm", "trl"):
            other = runs.get(f"{engine}_{size}", {})
            if other.get("status") != "ok":
                continue
            pair = {"fast": fast, engine: other}
            same = 0
            for a, b in zip(fast["problems_per_step"], other["problems_per_step"], strict=False):
                if a != b:
                    break
                same += 1
            out["learning"][f"{name}_vs_{engine}_{size}"] = {
                "accuracy": {key: run["accuracy"] for key, run in pair.items()},
                "p_value": {key: run["p_value"] for key, run in pair.items()},
                "trained_s": {key: run["trained_s"] for key, run in pair.items()},
                "steps": {key: run["steps"] for key, run in pair.items()},
                "completion_tokens_per_s": {key: run["completion_tokens_per_s"] for key, run in pair.items()},
                "seconds_to_accuracy": {
                    f"{start + gain:g}": {
                        key: time_to(run["curve"], start + gain) for key, run in pair.items()
                    }
                    for gain in (2, 4, 6, 8)
                },
                "same_problems_leading_steps": same,
            }
    return out


LABELS = {"fast": "fast path", "trl_vllm": "TRL + colocated vLLM", "trl": "TRL"}


def plot(results: dict[str, Any], target: Path) -> None:
    """Held-out accuracy against training seconds: one line a path (a merged file of the two
    paths), else one line a learning rate (the sweep)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    two = results.get("benchmark") == "grpo_learning_paths_gpu"
    for name, run in results["runs"].items():
        if "curve" not in run:
            continue
        points = run["curve"]
        label = (
            f"{LABELS[run['engine']]} {run['prompts_per_step']}x{run['num_generations']}"
            if two
            else f"lr {name}"
        )
        axes.plot([p["t_s"] for p in points], [p["accuracy"] for p in points], marker="o", label=label)
    held_out = results["checkpoint"]["held_out"].split(" of ")[0]
    if two:
        gpu = results["calls"][0]["environment"].get("gpu", "CPU")
        rate = results["settings"]["learning_rates"][0]
        axes.set_xlabel("GRPO training seconds (wall, whole steps)")
        axes.set_title(f"GRPO from one checkpoint, lr {rate:g} ({held_out}, {gpu})", fontsize=9)
    else:
        gpu = results["environment"]["gpu"]
        axes.set_xlabel("GRPO training seconds")
        axes.set_title(f"Fast-path GRPO from a checkpoint with headroom ({held_out}, {gpu})")
    axes.set_ylabel("held-out greedy accuracy (%)")
    axes.title.set_fontsize(9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, metadata={"Software": None})
    common.log(f"wrote {target}")


if __name__ == "__main__":
    main()
