"""GPU wall time of the ``hf`` evaluation backend at several batch sizes, end to end.

Builds a checkpoint with the Qwen2.5-1.5B architecture (hidden 1536, 28 layers, 12 query and
2 KV heads, MLP 8960, vocabulary 151,936, tied embeddings; 1.54 B parameters) holding random
bf16 weights drawn from a fixed seed, with the builtin tiny Qwen2's locally trained ChatML
tokenizer (1,301 tokens; nothing is downloaded). Greedy decoding can pick any of the 151,936
ids; the tokenizer decodes ids it does not know as nothing, so the completions are short or
empty strings and no id needs to be masked. Random weights almost never emit an eos id, so every
row runs the full ``--max-new-tokens``: the worst case for wall time.

Each variant runs ``HFBackend().evaluate`` (sanitized view, load, prompts, generation, scoring)
on the 4-shot GSM8K prompts of ``tests/data/gsm8k/test.jsonl`` repeated to fill one batch, and
records wall time, generation time, new tokens per second, peak GPU memory and an estimate for
the 1,319-problem test split. A variant ``B@L`` keeps only the last ``L`` prompt ids (the
checkpoint's ``max_position_embeddings`` is set to ``L``, which is what the backend truncates
to): the tiny tokenizer writes the prompt in about 1,450 ids, about twice the 700-token prompts
of the reference measurements (docs/PERFORMANCE.md), so ``@700`` stands for a real-length prompt.

    PYTHONPATH=.:services/evaluator-worker python3 bench/hf_eval_gpu.py \\
        [--variants 64@700 256@700 512@700 1319@700 64 256 512 1319] [--max-new-tokens 512] \\
        [--deadline-s 540] [--output PATH]

Writes ``bench/results/hf_eval_gpu.json`` (or ``--output``) after every variant.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "hf_eval_gpu.json"
SOURCE_DIR = REPO_ROOT / "tests" / "data"
GSM8K_TEST_PROBLEMS = 1319
DEFAULT_VARIANTS = ["64@700", "256@700", "512@700", "1319@700", "64", "256", "512", "1319"]


@dataclass(frozen=True)
class Variant:
    batch_size: int
    prompt_cap: int | None  # keep only the last N prompt ids; None: the whole prompt

    @classmethod
    def parse(cls, text: str) -> Variant:
        batch, _, cap = text.partition("@")
        return cls(int(batch), int(cap) if cap else None)

    @property
    def label(self) -> str:
        return f"{self.batch_size}" if self.prompt_cap is None else f"{self.batch_size}@{self.prompt_cap}"


def capped_copy(checkpoint: Path, target: Path, cap: int) -> Path:
    """The same checkpoint (weights hard-linked) with ``max_position_embeddings`` = ``cap``."""
    target.mkdir(parents=True)
    for source in checkpoint.iterdir():
        if source.name == "model.safetensors":
            os.link(source, target / source.name)
        elif source.name != "config.json":
            shutil.copyfile(source, target / source.name)
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = cap
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return target


def prompt_lengths(checkpoint: Path, problems: list[Any]) -> list[int]:
    from transformers import AutoTokenizer

    from autorl.tasks import get_task
    from autorl_evaluator.backends.hf.backend import prompt_texts
    from autorl_evaluator.model_settings import DEFAULT

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    texts = prompt_texts(tokenizer, get_task("gsm8k"), [p.question for p in problems], DEFAULT)
    return [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]


def run_variant(
    checkpoint: Path, problems: list[Any], batch_size: int, max_new_tokens: int, home: Path
) -> dict[str, Any]:
    """One ``HFBackend.evaluate`` call; its wall and generation seconds and peak GPU memory."""
    import torch

    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends.hf.backend import HFBackend
    from autorl_evaluator.settings import WorkerSettings

    settings = WorkerSettings(
        home=home,
        eval_batch_size=batch_size,
        eval_max_new_tokens=max_new_tokens,
        eval_device="cuda",
    )
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    record: dict[str, Any] = {"n_problems": len(problems), "batch_size": batch_size}
    try:
        result = HFBackend().evaluate(
            checkpoint, get_task("gsm8k"), problems, EvalConfig.record("gsm8k", settings), settings
        )
    except Exception as exc:  # an OOM is a result too: the batch does not fit
        record.update(status="failed", error=f"{type(exc).__name__}: {str(exc)[:400]}")
        result = None
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    record.update(
        wall_s=round(wall, 2),
        peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
        peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2),
    )
    if result is None:
        return record
    details = result.details
    new_tokens = cast(int, details["new_tokens"])
    rate = cast(float, details["new_tokens_per_s"])
    generation = new_tokens / rate
    batches = math.ceil(len(problems) / batch_size)
    per_batch = generation / batches
    split_batches = math.ceil(GSM8K_TEST_PROBLEMS / batch_size)
    overhead = wall - generation  # view, load, prompt rendering, scoring: paid once
    record.update(
        status="ok",
        generation_s=round(generation, 2),
        overhead_s=round(overhead, 2),
        new_tokens=new_tokens,
        new_tokens_per_row=round(new_tokens / len(problems), 1),
        new_tokens_per_s=round(rate, 1),
        ms_per_decode_step=round(1000 * per_batch / max_new_tokens, 2),
        truncated_prompts=details["truncated_prompts"],
        # Every batch of the split costs as much as a full one: an upper bound for the last batch.
        split_batches=split_batches,
        split_estimate_s=round(overhead + split_batches * per_batch, 1),
        scores=result.scores,
    )
    return record


def environment() -> dict[str, Any]:
    import torch
    import transformers

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "attention": "sdpa (transformers default)",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="BATCH or BATCH@PROMPT_CAP")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=540.0, help="start no variant after this")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args()
    # The backend logs one line per batch (event=hf_batch): progress on long variants.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s %(message)s")

    import torch

    from autorl.tasks import get_task

    if not torch.cuda.is_available():
        common.log("no CUDA device: this benchmark measures the GPU path")
        return 2
    began = time.perf_counter()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hf-eval-gpu-"))
    variants = [Variant.parse(text) for text in args.variants]
    report: dict[str, Any] = {
        "benchmark": "hf_eval_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "environment": environment(),
        "model": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed})",
        "max_new_tokens": args.max_new_tokens,
        "variants": {},
    }

    def write() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")

    try:
        common.log(f"building the checkpoint in {workdir}")
        t0 = time.perf_counter()
        checkpoint, parameters = common.build_checkpoint(workdir / "qwen2.5-1.5b-random", seed=args.seed)
        report["parameters"] = parameters
        report["build_s"] = round(time.perf_counter() - t0, 1)
        common.log(f"{parameters / 1e9:.3f} B parameters in {report['build_s']} s")
        base = get_task("gsm8k").load_test_problems(workdir / "data", source_dir=SOURCE_DIR)
        lengths = prompt_lengths(checkpoint, base)
        report["prompt_ids"] = {
            "min": min(lengths),
            "mean": round(sum(lengths) / len(lengths)),
            "max": max(lengths),
        }
        common.log(f"prompt ids: {report['prompt_ids']}")
        home = workdir / "home"
        common.log("warm-up: 8 problems, 16 new tokens")
        report["warmup"] = run_variant(checkpoint, base[:8], 8, 16, home)
        common.log(f"warm-up: {report['warmup']}")
        capped: dict[int, Path] = {}
        for variant in variants:
            if time.perf_counter() - began > args.deadline_s:
                common.log(f"skipped {variant.label}: past the {args.deadline_s:.0f} s deadline")
                report["variants"][variant.label] = {"status": "skipped (deadline)"}
                continue
            model = checkpoint
            if variant.prompt_cap is not None:
                if variant.prompt_cap not in capped:
                    capped[variant.prompt_cap] = capped_copy(
                        checkpoint, workdir / f"capped-{variant.prompt_cap}", variant.prompt_cap
                    )
                model = capped[variant.prompt_cap]
            problems = [base[i % len(base)] for i in range(variant.batch_size)]
            common.log(f"variant {variant.label}: {len(problems)} problems, batch {variant.batch_size}")
            record = run_variant(model, problems, variant.batch_size, args.max_new_tokens, home)
            record["prompt_cap"] = variant.prompt_cap
            report["variants"][variant.label] = record
            common.log(f"variant {variant.label}: {record}")
            write()
    finally:
        report["total_s"] = round(time.perf_counter() - began, 1)
        write()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{'variant':>10} {'status':>7} {'wall s':>7} {'gen s':>7} {'tok/s':>8} {'ms/step':>8} "
        f"{'peak GiB':>9} {'1319 est s':>10}"
    )
    for label, record in report["variants"].items():
        print(
            f"{label:>10} {str(record.get('status'))[:7]:>7} {record.get('wall_s', '-'):>7} "
            f"{record.get('generation_s', '-'):>7} {record.get('new_tokens_per_s', '-'):>8} "
            f"{record.get('ms_per_decode_step', '-'):>8} {record.get('peak_allocated_gib', '-'):>9} "
            f"{record.get('split_estimate_s', '-'):>10}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
