"""GRPO on one GPU: TRL's ``GRPOTrainer`` with colocated vLLM against the example agent's fast path.

TRL 1.16 recommends ``use_vllm=True, vllm_mode="colocate"`` (vLLM in the training process, on
the same GPU, weights synced into it before every generation). This measures that against
:class:`autorl_agents.fast_grpo.FastGRPO` (the example agent's GRPO path on a CUDA GPU), in one
call on one machine, each variant in a fresh process of its own (a vLLM engine cannot be started
twice in one process), on:

- the same model: the Qwen2.5-1.5B architecture, random bf16 weights drawn from ``--seed``
  (bench/hf_eval_gpu.py's checkpoint), with the builtin tiny model's Qwen2-format tokenizer whose
  vocabulary is padded with letter-only tokens to the model's 151,936 ids (vLLM detokenizes every
  id it samples; an id its tokenizer does not know would stop it). transformers renumbers the
  three special tokens past the padded ids when it loads this tokenizer (its end-of-text becomes
  the last id); both paths load it the same way, so they see the same ids;
- the same prompts: 4-shot GSM8K prompts around generated problems (bench/grpo_gpu.py's);
- the same algorithm settings: ``P`` prompts x ``G`` generations a step, one policy update per
  generation batch, no KL term, TRL's ``dapo`` loss, AdamW at a constant ``--learning-rate``,
  temperature 1 over the whole vocabulary, ``--completion-tokens`` at most, seed ``--seed``.

Timed: whole steps (generation, reward, loss, backward, optimizer step, and for TRL the weight
sync into vLLM), the first step of each variant left out as warm-up; completion tokens per second
over the timed steps and the mean reward of every step. TRL's engine start (building the trainer,
vLLM's initialisation included) is reported apart.

    PYTHONPATH=.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/grpo_trl_vllm_gpu.py \\
        [--variants trl_vllm_2x4 fast_2x4 ...] [--steps 3] [--output PATH]
    .venv/bin/python bench/grpo_trl_vllm_gpu.py --merge A.json B.json   # calls' files into one

with TRL 1.16, datasets and vLLM 0.25 installed beside the GPU machine's packages. Writes
``bench/results/grpo_trl_vllm_gpu.json`` (or ``--output``) after every variant. Random weights
answer nothing, so every reward is the wrong-answer one and the advantages are zero: the
comparison is of throughput; a reward curve needs a trained checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from grpo_gpu import _gsm8k_records as _records
from grpo_gpu import _synchronize, fast_trainer

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "grpo_trl_vllm_gpu.json"
DEFAULT_VARIANTS = ["trl_vllm_2x4", "fast_2x4", "trl_vllm_16x8", "fast_16x8", "trl_vllm_64x8", "fast_64x8"]
ENGINES = ("trl_vllm", "trl", "fast")
#: Rows per forward/backward pass of the loss on both paths (FastGRPO's LOSS_MICRO_BATCH).
MICRO_BATCH = 32
VARIABLES = ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER")


def command_line(output: Path) -> str:
    """This process's command as run (its environment variables named, ``--output`` under $OUT)."""
    variables = " ".join(f"{name}={os.environ[name]}" for name in VARIABLES if name in os.environ)
    arguments = " ".join(sys.argv[1:]).replace(str(output), f"$OUT/{output.name}")
    return f"{variables} python3 bench/{Path(sys.argv[0]).name} {arguments}".strip()


@dataclass(frozen=True)
class Variant:
    engine: str
    prompts: int
    generations: int

    @property
    def name(self) -> str:
        return f"{self.engine}_{self.prompts}x{self.generations}"

    @property
    def completions(self) -> int:
        return self.prompts * self.generations

    def trl_batches(self) -> tuple[int, int]:
        """TRL's ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` that make one
        generation batch of ``prompts x generations`` completions and one optimizer step a batch."""
        micro = min(self.completions, MICRO_BATCH)
        return micro, self.completions // micro


def parse_variant(text: str) -> Variant:
    """``ENGINE_PxG`` (e.g. ``trl_vllm_2x4``, ``fast_64x8``) → :class:`Variant`."""
    engine, _, size = text.rpartition("_")
    prompts, x, generations = size.partition("x")
    if engine not in ENGINES or not x or not prompts.isdigit() or not generations.isdigit():
        raise ValueError(f"variant {text!r} is not ENGINE_PxG with ENGINE one of {', '.join(ENGINES)}")
    variant = Variant(engine, int(prompts), int(generations))
    if variant.prompts < 1 or variant.generations < 2:
        raise ValueError(f"variant {text!r}: at least 1 prompt and 2 generations a step")
    if variant.completions > MICRO_BATCH and variant.completions % MICRO_BATCH:
        raise ValueError(f"variant {text!r}: more than {MICRO_BATCH} completions must be a multiple of it")
    return variant


def summarise(steps: list[dict[str, float]], completions: int) -> dict[str, Any]:
    """Throughput over whole steps from per-step ``seconds``, ``completion_tokens`` and ``reward``,
    the first step left out as warm-up; every step's reward kept."""
    if len(steps) < 2:
        raise ValueError(f"{len(steps)} steps: at least 2 (the first is warm-up)")
    timed = steps[1:]
    seconds = sum(s["seconds"] for s in timed)
    tokens = sum(s["completion_tokens"] for s in timed)
    return {
        "completions_per_step": completions,
        "steps_timed": len(timed),
        "step_s": round(seconds / len(timed), 2),
        "mean_completion_tokens": round(tokens / (completions * len(timed)), 1),
        "completion_tokens_per_s": round(tokens / seconds, 1),
        "reward_per_step": [round(s["reward"], 4) for s in steps],
        "warmup_step_s": round(steps[0]["seconds"], 2),
    }


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``fast_PxG`` over ``trl_vllm_PxG`` (and over ``trl_PxG``) in completion tokens/s, where both ran."""
    out: dict[str, float] = {}
    for name, record in variants.items():
        if not name.startswith("fast_") or "completion_tokens_per_s" not in record:
            continue
        size = name.removeprefix("fast_")
        for engine in ("trl_vllm", "trl"):
            other = variants.get(f"{engine}_{size}", {})
            if other.get("completion_tokens_per_s"):
                out[f"{name}_over_{engine}_{size}"] = round(
                    record["completion_tokens_per_s"] / other["completion_tokens_per_s"], 2
                )
    return out


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One results file from several calls' (consecutive runs on the GPU machine): each call's date
    and command under ``calls``, every variant with the index of its call, ratios within a call."""
    merged = {key: value for key, value in reports[0].items() if key not in ("variants", "ratios")}
    merged["calls"] = []
    merged["variants"] = {}
    merged["ratios"] = {}
    for index, report in enumerate(reports):
        merged["calls"].append({"date": report["date"], "command": report["command"]})
        for name, record in report["variants"].items():
            if name in merged["variants"]:
                raise ValueError(f"variant {name} is in two calls")
            merged["variants"][name] = {**record, "call": index}
        merged["ratios"].update(ratios(report["variants"]))
    return merged


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


# --------------------------------------------------------------------------- the checkpoint


def pad_vocabulary(checkpoint: Path, size: int) -> int:
    """Give the tokenizer in ``checkpoint`` ``size`` ids: letter-only tokens no merge produces (so
    encoding is unchanged) for every id past its own. Returns how many it added."""
    tokenizer_file = checkpoint / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    taken = {*vocab.values(), *(t["id"] for t in tokenizer["added_tokens"])}
    added = 0
    for token_id in range(max(taken) + 1, size):
        name, n = "", token_id
        while True:
            name, n = chr(ord("a") + n % 26) + name, n // 26
            if not n:
                break
        vocab[f"ĠQ{name}"] = token_id
        added += 1
    tokenizer_file.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    vocab_file = checkpoint / "vocab.json"
    if vocab_file.exists():
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return added


def build(target: Path, seed: int, smoke: bool) -> dict[str, Any]:
    import hf_eval_gpu

    saved = dict(hf_eval_gpu.QWEN25_1_5B)
    if smoke:
        hf_eval_gpu.QWEN25_1_5B.update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=16,
            vocab_size=2048,
        )
    try:
        checkpoint, parameters = hf_eval_gpu.build_checkpoint(target, seed=seed)
    finally:
        hf_eval_gpu.QWEN25_1_5B.clear()
        hf_eval_gpu.QWEN25_1_5B.update(saved)
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    added = pad_vocabulary(checkpoint, config["vocab_size"])
    return {"parameters": parameters, "vocab_size": config["vocab_size"], "tokenizer_ids_added": added}


# --------------------------------------------------------------------------- one variant (a process)


def run_variant(variant: Variant, checkpoint: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.tasks import get_task

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    task = get_task("gsm8k")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).to(device)
    records = _records(tokenizer, max(256, variant.prompts * (args.steps + 1)))
    if variant.engine == "fast":
        steps = _fast(variant, model, tokenizer, task, records, args)
        extra: dict[str, Any] = {}
    else:
        steps, extra = _trl(variant, model, tokenizer, task, records, args)
    result = {**summarise(steps, variant.completions), **extra, "steps": steps}
    if device == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return result


def _fast(
    variant: Variant, model: Any, tokenizer: Any, task: Any, records: list[dict[str, str]], args: Any
) -> list[dict[str, float]]:
    from autorl_agents.fast_grpo import FastGRPOSettings

    settings = FastGRPOSettings(
        prompts_per_step=variant.prompts,
        num_generations=variant.generations,
        max_completion_length=args.completion_tokens,
        learning_rate=args.learning_rate,
        seed=args.seed,
        loss_micro_batch=MICRO_BATCH,
    )
    trainer = fast_trainer(model, tokenizer, task, records, settings)
    steps = []
    for _ in range(args.steps + 1):
        s = trainer.step()
        steps.append(
            {
                "seconds": round(s.seconds, 3),
                "rollout_s": round(s.rollout_s, 3),
                "train_s": round(s.train_s, 3),
                "completion_tokens": s.completion_tokens,
                "reward": s.reward,
            }
        )
        log(f"{variant.name} step {s.step}: {steps[-1]}")
    return steps


def _trl(
    variant: Variant, model: Any, tokenizer: Any, task: Any, records: list[dict[str, str]], args: Any
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    marks: list[float] = []
    logs: list[dict[str, float]] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            _synchronize()
            marks.append(time.monotonic())

        def on_log(self, *a: Any, **k: Any) -> None:
            entry = k.get("logs")
            if entry and "completions/mean_length" in entry:
                logs.append(dict(entry))

    def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        return list(task.reward(completions, answer, **kwargs))

    micro, accumulation = variant.trl_batches()
    vllm = variant.engine == "trl_vllm"
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=args.seed,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            num_generations=variant.generations,
            max_completion_length=args.completion_tokens,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            beta=0.0,
            bf16=model.dtype.itemsize == 2,
            use_cpu=model.device.type == "cpu",
            max_steps=args.steps + 1,
            disable_tqdm=True,
            dataloader_num_workers=0,
            use_vllm=vllm,
            **({"vllm_mode": "colocate"} if vllm else {}),
        )
        started = time.monotonic()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=config,
            train_dataset=Dataset.from_list(records),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)
        start_s = time.monotonic() - started
        log(f"{variant.name}: trainer built in {start_s:.1f} s")
        started = time.monotonic()
        trainer.train()
    seconds = [b - a for a, b in zip([started, *marks], marks, strict=False)]
    steps = [
        {
            "seconds": round(s, 3),
            "completion_tokens": round(entry["completions/mean_length"] * variant.completions),
            "reward": float(entry["reward"]),
        }
        for s, entry in zip(seconds, logs, strict=False)
    ]
    for step in steps:
        log(f"{variant.name}: {step}")
    extra = {
        "trainer_start_s": round(start_s, 1),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "trl_defaults_kept": "gradient_checkpointing, loss_type, scale_rewards, vLLM's importance "
        "sampling correction, vllm_gpu_memory_utilization",
    }
    if vllm:
        extra["vllm_mode"] = "colocate"
        extra["vllm_gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
    return steps, extra


# --------------------------------------------------------------------------- the driver


def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found: dict[str, Any] = {"python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    for name in ("torch", "transformers", "trl", "vllm", "datasets", "accelerate"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", type=parse_variant, default=None)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant, after one warm-up")
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--deadline-s", type=float, default=540.0, help="start no variant after this")
    parser.add_argument("--variant-timeout-s", type=float, default=300.0)
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (checks the script)")
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)  # a variant's process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--merge", type=Path, nargs="+", help="join these results files into --output")
    args = parser.parse_args()
    if args.merge:
        reports = [json.loads(path.read_text(encoding="utf-8")) for path in args.merge]
        args.output.write_text(json.dumps(merge(reports), indent=2) + "\n", encoding="utf-8")
        return 0
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    variants: list[Variant] = args.variants or [parse_variant(v) for v in DEFAULT_VARIANTS]
    if args.result is not None:  # one variant, in its own process
        try:
            record = {"status": "ok", **run_variant(variants[0], args.checkpoint, args)}
        except Exception as exc:
            traceback.print_exc()
            record = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        args.result.write_text(json.dumps(record), encoding="utf-8")
        return 0
    began = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "grpo_trl_vllm_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": command_line(args.output),
        "environment": environment(),
        "settings": {
            "completion_tokens": args.completion_tokens,
            "learning_rate": args.learning_rate,
            "seed": args.seed,
            "steps_timed": args.steps,
            "warmup_steps": 1,
            "loss_micro_batch": MICRO_BATCH,
            "temperature": 1.0,
            "beta": 0.0,
        },
        "variants": {},
    }

    def save() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "qwen25-1.5b"
        started = time.monotonic()
        report["model"] = {
            "description": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed}), the builtin "
            "Qwen2-format tokenizer padded to the model's vocabulary",
            **build(checkpoint, args.seed, args.smoke),
            "build_s": round(time.monotonic() - started, 1),
        }
        probe = _records(_tokenizer(checkpoint), 64)
        report["model"]["prompt_ids_mean"] = round(
            statistics.mean(len(_tokenizer(checkpoint)(r["prompt"]).input_ids) for r in probe)
        )
        save()
        for variant in variants:
            if time.monotonic() - began > args.deadline_s:
                report["variants"][variant.name] = {"status": "skipped (deadline)"}
                continue
            log(f"variant {variant.name}")
            result = Path(scratch) / f"{variant.name}.json"
            command = [
                sys.executable,
                __file__,
                "--variants",
                variant.name,
                "--checkpoint",
                str(checkpoint),
                "--result",
                str(result),
                "--steps",
                str(args.steps),
                "--completion-tokens",
                str(args.completion_tokens),
                "--learning-rate",
                str(args.learning_rate),
                "--seed",
                str(args.seed),
            ]
            started = time.monotonic()
            try:
                subprocess.run(command, check=True, timeout=args.variant_timeout_s)
                record = json.loads(result.read_text(encoding="utf-8"))
            except Exception as exc:  # a failed variant is a result too
                record = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
            record["process_s"] = round(time.monotonic() - started, 1)
            report["variants"][variant.name] = record
            log(f"{variant.name}: { {k: v for k, v in record.items() if k != 'steps'} }")
            report["ratios"] = ratios(report["variants"])
            report["total_s"] = round(time.monotonic() - began, 1)
            save()
    log(json.dumps({"ratios": report["ratios"], "total_s": report["total_s"]}))
    return 0


def _tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
