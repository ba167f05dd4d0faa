"""GPU time of the hf backend's greedy engine on a GSM8K-sized evaluation, beside plain ``generate``.

The model has the Qwen2.5-1.5B architecture (bench/hf_eval_gpu.py's ``QWEN25_1_5B``) with random
bf16 weights drawn on the GPU from a fixed seed. The prompts have the shape of the real split under
Qwen2.5's tokenizer (``bench/data/gsm8k_qwen25_lengths.json``, made by bench/gsm8k_lengths.py):
one shared prefix of 1,441 ids (system turn and the four exemplars) and, per problem, that
problem's own suffix length; the ids themselves are random (seeded), since the weights are.
Random weights never choose to stop, so the stopping point of each row is set by a per-row token
limit: either ``--max-new-tokens`` for every row (the worst case), or a length drawn (seeded, with
replacement) from the 7,473 GSM8K train answers' token counts, which is where a model that writes
GSM8K-style answers stops.

Variants, in one process with one model, each timed end to end (prompt ids to completion ids on
the host, CUDA synchronised):

- ``engine_full``: :func:`generate_greedy` on all 1,319 prompts, ``--max-new-tokens`` each;
- ``engine_stop``: the same with the stopping distribution;
- ``engine_stop_keep_rows`` / ``engine_stop_no_graphs`` / ``engine_full_no_prefix``: ablations
  (finished rows not dropped; no CUDA graphs; no shared prefix, made by giving each prompt a
  different first id);
- ``attention_step``: one layer's decode attention alone, transformers' SDPA over a cache that
  holds the prefix in every row (expanding the key/value heads under the padding mask) against the
  grouped attention over one shared prefix copy;
- ``generate_ref`` and ``engine_ref``: transformers ``generate`` (SDPA, dynamic cache, left
  padding: what the backend ran before) on the first ``--ref-rows`` prompts as one batch (the
  former GPU default), ``--ref-new-tokens`` each, and the engine on the same prompts; their ratio,
  and how many rows' ids are identical.

Floors: the measured device copy bandwidth over the bytes a step must read (the weights once, and
every live row's keys and values).

    PYTHONPATH=.:bench python3 bench/hf_generation_gpu.py [--output PATH]

Writes ``bench/results/hf_generation_gpu.json`` after every variant.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "hf_generation_gpu.json"


def build_model(seed: int) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        **{k: v for k, v in common.QWEN25_1_5B.items() if k not in ("architectures",)}
    )
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    return model.eval()


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, bytes read plus written (median of 10 copies of 4 GiB)."""
    import torch

    source = torch.empty(2**31, dtype=torch.int16, device="cuda").random_()
    target = torch.empty_like(source)
    times: list[float] = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        target.copy_(source)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del source, target
    return 2 * 2**32 / sorted(times[2:])[len(times[2:]) // 2]


def floor_seconds(
    weights: int, slot_bytes: int, prompt_lengths: list[int], limits: list[int], bw: float
) -> float:
    """Lower bound: every decode step reads the weights and each live row's cache once."""
    steps = max(limits)
    total = 0.0
    for step in range(steps):
        live = [p + step for p, limit in zip(prompt_lengths, limits, strict=True) if limit > step]
        total += weights + slot_bytes * sum(live)
    return total / bw


def attention_step(rows: int, prefix: int, own: int) -> dict[str, float]:
    """Milliseconds of one layer's decode attention (median of 20) for ``rows`` rows that share
    ``prefix`` keys and hold ``own`` keys each: transformers' SDPA over a cache holding the prefix
    in every row (it expands the 2 key/value heads to 12 under a padding mask) against the grouped
    attention over one shared prefix copy."""
    from types import SimpleNamespace

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from autorl.decoding.grouped_attention import AttentionWindow, grouped_attention

    module: Any = SimpleNamespace(num_key_value_groups=6, is_causal=True, layer_idx=0, training=False)
    bf16: dict[str, Any] = {"dtype": torch.bfloat16, "device": "cuda"}
    query = torch.randn(rows, 12, 1, 128, **bf16)
    prefix_kv = [torch.randn(2, prefix, 128, **bf16) for _ in range(2)]
    own_kv = [torch.randn(rows, 2, own, 128, **bf16) for _ in range(2)]
    full_kv = [
        torch.cat([p.expand(rows, 2, prefix, 128), o], dim=2) for p, o in zip(prefix_kv, own_kv, strict=True)
    ]
    mask = torch.rand(rows, 1, 1, own, device="cuda") > 0.1
    full_mask = torch.cat([torch.ones(rows, 1, 1, prefix, dtype=torch.bool, device="cuda"), mask], dim=3)
    window = AttentionWindow(mask, ((prefix_kv[0], prefix_kv[1]),))

    def median_ms(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        times: list[float] = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return round(sorted(times)[10], 3)

    ours = grouped_attention(module, query, own_kv[0], own_kv[1], None, autorl_window=window)[0]
    theirs = sdpa_attention_forward(module, query, full_kv[0], full_kv[1], full_mask)[0]
    error = float((ours.float() - theirs.float()).norm() / theirs.float().norm())
    result = {
        "rows": rows,
        "prefix_keys": prefix,
        "own_keys": own,
        "sdpa_repeat_kv_ms": median_ms(
            lambda: sdpa_attention_forward(module, query, full_kv[0], full_kv[1], full_mask)
        ),
        "grouped_shared_prefix_ms": median_ms(
            lambda: grouped_attention(module, query, own_kv[0], own_kv[1], None, autorl_window=window)
        ),
        "relative_difference": round(error, 5),
        "kv_read_floor_ms": round((sum(t.numel() for t in full_kv) * 2) / copy_bandwidth_cached[0] * 1000, 3),
    }
    return result


copy_bandwidth_cached: list[float] = []


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """How many rows of ``other`` equal ``reference``'s, and how many leading ids agree on average."""
    same = sum(a == b for a, b in zip(reference, other, strict=True))
    leading = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        for a, b in zip(reference, other, strict=True)
    ]
    return {
        "rows": len(reference),
        "identical_rows": same,
        "identical_share": round(same / len(reference), 4),
        "mean_identical_leading_ids": round(sum(leading) / len(leading), 1),
    }


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    started = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--ref-rows", type=int, default=256)
    parser.add_argument("--ref-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=420.0, help="start no variant after this")
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch
    import transformers

    from autorl.decoding import greedy_engine
    from autorl.decoding.greedy_engine import generate_greedy, model_shape

    began = time.perf_counter()
    lengths = json.loads(common.LENGTHS.read_text(encoding="utf-8"))
    rng = random.Random(args.seed)
    prefix = [rng.randrange(common.PROMPT_ID_RANGE) for _ in range(lengths["prefix_ids"])]
    prompts = [
        prefix + [rng.randrange(common.PROMPT_ID_RANGE) for _ in range(n)] for n in lengths["suffix_ids"]
    ]
    stops = [min(args.max_new_tokens, rng.choice(lengths["answer_ids"])) for _ in prompts]
    pad_id = common.QWEN25_1_5B["vocab_size"] - 1
    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "benchmark": "hf_generation_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": common.command_line(args.output),
        "environment": {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "model": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed})",
        "prompts": {
            "rows": len(prompts),
            "shared_prefix_ids": lengths["prefix_ids"],
            "prompt_ids": lengths["prompt_ids"],
            "source": lengths["source"],
        },
        "max_new_tokens": args.max_new_tokens,
        "stop_distribution": {
            "source": "GSM8K train answers, Qwen2.5 token counts + 1 end-of-turn id, drawn with replacement",
            "mean_new_tokens": round(sum(stops) / len(stops), 1),
            "max_new_tokens": max(stops),
        },
        "variants": {},
        "agreement_with_generate": {},
    }

    def write() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")

    common.log("building the model")
    model = build_model(args.seed)
    shape = model_shape(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    report["parameters"] = sum(p.numel() for p in model.parameters())
    bandwidth = copy_bandwidth()
    copy_bandwidth_cached.append(bandwidth)
    report["copy_bandwidth_tb_s"] = round(bandwidth / 1e12, 2)
    common.log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    prompt_lengths = [len(p) for p in prompts]
    report["attention_step"] = attention_step(len(prompts), lengths["prefix_ids"], 330)
    common.log(f"one layer's decode attention: {report['attention_step']}")

    def engine(rows: list[list[int]], limits: int | list[int]) -> Callable[[], Any]:
        return lambda: generate_greedy(model, rows, max_new_tokens=limits, eos_ids=[], pad_id=pad_id)

    common.log("warm-up")
    timed(engine(prompts[:8], 8))
    timed(lambda: common.run_generate(model, prompts[:8], 8, pad_id))

    full = [args.max_new_tokens] * len(prompts)
    no_prefix = [[common.PROMPT_ID_RANGE + i % 500, *p[1:]] for i, p in enumerate(prompts)]
    ref_rows = prompts[: args.ref_rows]

    def keep_rows() -> Any:
        keep = greedy_engine.KEEP_AT_MOST
        greedy_engine.KEEP_AT_MOST = 0.0
        try:
            return engine(prompts, stops)()
        finally:
            greedy_engine.KEEP_AT_MOST = keep

    def no_graphs() -> Any:
        greedy_engine.CUDA_GRAPHS = False
        try:
            return engine(prompts, stops)()
        finally:
            greedy_engine.CUDA_GRAPHS = True

    variants: dict[str, tuple[Callable[[], Any], list[int], list[int]]] = {
        "engine_full": (engine(prompts, args.max_new_tokens), prompt_lengths, full),
        "engine_stop": (engine(prompts, stops), prompt_lengths, stops),
        "generate_ref": (
            lambda: common.run_generate(model, ref_rows, args.ref_new_tokens, pad_id),
            prompt_lengths[: args.ref_rows],
            [args.ref_new_tokens] * args.ref_rows,
        ),
        "generate_ref_split": (
            lambda: [
                row
                for half in (ref_rows[: args.ref_rows // 2], ref_rows[args.ref_rows // 2 :])
                for row in common.run_generate(model, half, args.ref_new_tokens, pad_id)
            ],
            prompt_lengths[: args.ref_rows],
            [args.ref_new_tokens] * args.ref_rows,
        ),
        "engine_ref": (
            engine(ref_rows, args.ref_new_tokens),
            prompt_lengths[: args.ref_rows],
            [args.ref_new_tokens] * args.ref_rows,
        ),
        "engine_stop_keep_rows": (keep_rows, prompt_lengths, stops),
        "engine_stop_no_graphs": (no_graphs, prompt_lengths, stops),
        "engine_full_no_prefix": (engine(no_prefix, args.max_new_tokens), prompt_lengths, full),
    }
    outputs: dict[str, list[list[int]]] = {}
    for name, (fn, rows_lengths, limits) in variants.items():
        if args.only is not None and name not in args.only:
            continue
        if time.perf_counter() - began > args.deadline_s:
            report["variants"][name] = {"status": "skipped (deadline)"}
            continue
        common.log(f"variant {name}")
        try:
            result, seconds = timed(fn)
        except Exception as exc:  # an out-of-memory is a result too
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            report["variants"][name] = {"status": "failed", "error": error}
            common.log(f"variant {name}: {report['variants'][name]}")
            write()
            continue
        tokens = result if isinstance(result, list) else result.tokens
        outputs[name] = tokens
        new_tokens = sum(len(t) for t in tokens)
        floor = floor_seconds(weights, shape.slot_bytes, rows_lengths, limits, bandwidth)
        record: dict[str, Any] = {
            "status": "ok",
            "rows": len(tokens),
            "seconds": round(seconds, 2),
            "new_tokens": new_tokens,
            "new_tokens_per_s": round(new_tokens / seconds),
            "floor_s": round(floor, 2),
            "over_floor": round(seconds / floor, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        }
        if not isinstance(result, list):
            record["batch_sizes"] = result.batch_sizes
            record["shared_prefix_ids"] = result.shared_prefix
        report["variants"][name] = record
        common.log(f"variant {name}: {record}")
        write()

    for other in ("engine_ref", "generate_ref_split"):
        if "generate_ref" in outputs and other in outputs:
            report["agreement_with_generate"][other] = agreement(outputs["generate_ref"], outputs[other])
    if "engine_ref" in report["agreement_with_generate"]:
        report["agreement_with_generate"]["engine_ref"]["speedup"] = round(
            report["variants"]["generate_ref"]["seconds"] / report["variants"]["engine_ref"]["seconds"], 2
        )
    for name in ("engine_full", "engine_stop"):
        for other in ("engine_full_no_prefix", "engine_stop_keep_rows", "engine_stop_no_graphs"):
            if name in outputs and other in outputs and other.startswith(name):
                report["variants"][other]["identical_rows_vs_" + name] = sum(
                    a == b for a, b in zip(outputs[name], outputs[other], strict=True)
                )
    report["total_s"] = round(time.perf_counter() - began, 1)
    write()
    print(f"{'variant':>24} {'rows':>5} {'s':>7} {'tok/s':>8} {'floor s':>8} {'x floor':>7} {'GiB':>6}")
    for name, record in report["variants"].items():
        print(
            f"{name:>24} {record.get('rows', '-'):>5} {record.get('seconds', '-'):>7} "
            f"{record.get('new_tokens_per_s', '-'):>8} {record.get('floor_s', '-'):>8} "
            f"{record.get('over_floor', '-'):>7} {record.get('peak_allocated_gib', '-'):>6}"
        )
    print(json.dumps(report.get("agreement_with_generate"), indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    raise SystemExit(main())
