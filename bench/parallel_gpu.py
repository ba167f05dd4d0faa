"""Two GPUs of one host for the hf backend's workload: two data-parallel replicas against tensor
parallelism over both, and one GPU alone, in one run.

Same model and prompts as bench/hf_generation_gpu.py (Qwen2.5-1.5B architecture, random bf16
weights; 1,319 GSM8K-shaped prompts with the real split's lengths; stopping distribution from the
GSM8K train answers). Variants, each timed from the first rank's start to the last rank's end:

- ``one_gpu_engine_stop`` / ``one_gpu_engine_full``: the greedy engine on one GPU, all prompts;
- ``dp2_engine_stop`` / ``dp2_engine_full``: one replica per GPU, each the engine on half the
  prompts (every other one, so both halves have the same length mix);
- ``one_gpu_generate_ref`` / ``dp2_generate_ref`` / ``tp2_generate_ref``: transformers
  ``generate`` on the first 256 prompts x 128 new tokens: one GPU, a replica per GPU with 128
  prompts each, and the model split over both GPUs with transformers' tensor-parallel plan
  (``tp_plan="auto"``);
- ``tp2_engine_stop``: the engine on the tensor-parallel model (recorded as an error where the
  engine cannot run a sharded model).

    python3 -m torch.distributed.run --nproc-per-node 2 bench/parallel_gpu.py   # PYTHONPATH=.:bench

Rank 0 writes ``bench/results/parallel_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "parallel_gpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--collective-timeout-s", type=float, default=180.0)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    import transformers
    from transformers import AutoModelForCausalLM

    from autorl.decoding.greedy_engine import generate_greedy

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    # A variant that fails on one rank alone leaves the other in a collective: give up after
    # --collective-timeout-s rather than NCCL's default ten minutes (results so far are written).
    dist.init_process_group("nccl", timeout=timedelta(seconds=args.collective_timeout_s))
    lengths = json.loads(common.LENGTHS.read_text(encoding="utf-8"))
    rng = random.Random(0)
    prefix = [rng.randrange(common.PROMPT_ID_RANGE) for _ in range(lengths["prefix_ids"])]
    prompts = [
        prefix + [rng.randrange(common.PROMPT_ID_RANGE) for _ in range(n)] for n in lengths["suffix_ids"]
    ]
    stops = [min(args.max_new_tokens, rng.choice(lengths["answer_ids"])) for _ in prompts]
    full = [args.max_new_tokens] * len(prompts)
    pad_id = common.QWEN25_1_5B["vocab_size"] - 1
    ref = prompts[:256]
    report: dict[str, Any] = {
        "benchmark": "parallel_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": "PYTHONPATH=.:bench python3 -m torch.distributed.run --nproc-per-node 2 "
        "bench/parallel_gpu.py",
        "environment": {
            "gpus": f"{world} x {torch.cuda.get_device_name()}",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model": "Qwen2.5-1.5B architecture, random bf16 weights (seed 0)",
        "rows": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "stop_mean_new_tokens": round(sum(stops) / len(stops), 1),
        "ref_rows": len(ref),
        "ref_new_tokens": 128,
        "variants": {},
    }

    def timed(name: str, work: Callable[[], Any] | None) -> None:
        """``work`` on the ranks that have some, the wall time over all ranks."""
        error = None
        dist.barrier()
        torch.cuda.synchronize()
        started = time.perf_counter()
        try:
            if work is not None:
                work()
            torch.cuda.synchronize()
        except Exception as exc:  # recorded; the other variants still run
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"[:1000]
        mine = torch.tensor([time.perf_counter() - started], device="cuda")
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        failed = torch.tensor([1.0 if error else 0.0], device="cuda")
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        record = (
            {"status": "error", "error": error}
            if failed.item()
            else {"status": "ok", "seconds": round(mine.item(), 2)}
        )
        report["variants"][name] = record
        if rank == 0:
            common.log(f"{name}: {record}")
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    root = Path(tempfile.gettempdir()) / "parallel-gpu"
    checkpoint = root / "qwen25-1.5b"
    if rank == 0 and not (checkpoint / "model.safetensors").exists():
        common.build_checkpoint(checkpoint, seed=0)
    dist.barrier()
    # PreTrainedModel.cuda is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    model = model.cuda().eval()

    def engine(rows: list[list[int]], limits: list[int]) -> Callable[[], Any]:
        return lambda: generate_greedy(model, rows, max_new_tokens=limits, eos_ids=[], pad_id=pad_id)

    mine = slice(rank, None, world)
    # Warm-up: library state and a first capture on every rank.
    engine(prompts[:8], [8] * 8)()
    common.run_generate(model, ref[:8], 8, pad_id)
    timed("one_gpu_engine_stop", engine(prompts, stops) if rank == 0 else None)
    timed("dp2_engine_stop", engine(prompts[mine], stops[mine]))
    timed("one_gpu_engine_full", engine(prompts, full) if rank == 0 else None)
    timed("dp2_engine_full", engine(prompts[mine], full[mine]))
    timed(
        "one_gpu_generate_ref", (lambda: common.run_generate(model, ref, 128, pad_id)) if rank == 0 else None
    )
    timed("dp2_generate_ref", lambda: common.run_generate(model, ref[mine], 128, pad_id))
    del model
    torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16, tp_plan="auto")
    model.eval()
    common.run_generate(model, ref[:8], 8, pad_id)
    timed("tp2_generate_ref", lambda: common.run_generate(model, ref, 128, pad_id))
    timed("tp2_engine_stop", engine(prompts, stops))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
