"""The in-process greedy engine against vLLM 0.25 on one GPU: one run, one model, one workload.

The ``hf`` backend and the example agent decode with ``autorl/decoding/greedy_engine.py``; the
``opencompass`` backend's resident engine is vLLM. This measures both in the same call on the same
checkpoint (the Qwen2.5-1.5B architecture with random bf16 weights, seed 0, the view's locally
built Qwen2-format tokenizer: bench/opencompass_vllm_gpu.py's ``build_model``) and the same prompts:

- ``ids_stop``: bench/hf_generation_gpu.py's 1,319 random-id prompts (1,441 shared prefix ids, each
  problem's own suffix length under Qwen2.5's tokenizer), each row stopped at a length drawn from
  the GSM8K train answers' token counts (random weights never choose to stop; end-of-text ignored);
- ``ids_full``: the same prompts, 512 new tokens each;
- ``opencompass_prompts``: OpenCompass's 1,319 rendered prompts (as text), its sampling parameters
  (greedy, up to 512 new tokens, its stop strings).

The in-process engine runs each workload twice in this process (the first includes capturing its
CUDA graphs). Each vLLM configuration runs in a process of its own (``opencompass_vllm_gpu.py
offline``: engine start, then each workload once): the worker's engine arguments (eager), then
CUDA graphs with prefix caching at vLLM's default ``max_num_seqs`` and at 512 and 256.

    # on the GPU machine, vLLM 0.25 and bench/data/vllm-0.25-serve-wheels.txt in /root/site,
    # .vllm-parts/oc/carry (bench/opencompass_vllm_gpu.py record) carried:
    PYTHONPATH=/root/site:.:bench VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/engine_race_gpu.py \\
        --inputs .vllm-parts/oc/carry --output $OUT/engine_race_gpu.json

Writes ``bench/results/engine_race_gpu.json`` (or ``--output``) after every variant.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "engine_race_gpu.json"
#: vLLM configurations over the worker's recorded engine arguments.
VLLM_VARIANTS: dict[str, dict[str, Any]] = {
    "vllm_worker_eager": {},
    "vllm_graphs": {"enforce_eager": False, "enable_prefix_caching": True},
    "vllm_graphs_seqs512": {"enforce_eager": False, "enable_prefix_caching": True, "max_num_seqs": 512},
    "vllm_graphs_seqs256": {"enforce_eager": False, "enable_prefix_caching": True, "max_num_seqs": 256},
}
WORKLOADS = ("ids_stop", "ids_full", "opencompass_prompts")


def in_process(
    model_dir: Path,
    recorded: dict[str, Any],
    prompts: list[list[int]],
    stops: list[int],
    settings: list[str] | None = None,
) -> dict[str, Any]:
    """Each workload twice through :func:`generate_greedy`, CUDA synchronised around each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.decoding.greedy_engine import generate_greedy

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    result: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 2), "runs": {}}
    text_prompts = tokenizer(recorded["prompts"]).input_ids
    vocab = tokenizer.get_vocab()
    stop_ids = sorted({vocab[s] for s in recorded["sampling_kwargs"]["stop"] if s in vocab})
    cases: dict[str, tuple[list[list[int]], int | list[int], list[int]]] = {
        # End-of-text ignored, as vLLM's ignore_eos: no end id that could stop a row.
        "ids_stop": (prompts, stops, []),
        "ids_full": (prompts, 512, []),
        "opencompass_prompts": (text_prompts, int(recorded["sampling_kwargs"]["max_tokens"]), stop_ids),
    }
    for name, (rows, limits, eos_ids) in cases.items():
        for attempt in ("first", "second"):
            torch.cuda.synchronize()
            began = time.perf_counter()
            output = generate_greedy(model, rows, max_new_tokens=limits, eos_ids=eos_ids, pad_id=0)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - began
            result["runs"].setdefault(name, {})[attempt] = {
                "seconds": round(seconds, 2),
                "new_tokens": sum(len(t) for t in output.tokens),
            }
            common.log(f"in-process {name} {attempt}: {result['runs'][name][attempt]}")
    if settings:
        result["ids_stop_settings"] = {}
        try:
            engine_settings(model, prompts, stops, settings, result["ids_stop_settings"])
            result["ids_stop_profile"] = engine_profile(model, prompts, stops)
        except Exception as exc:  # what was timed is kept whatever the extras do
            result["settings_error"] = f"{type(exc).__name__}: {exc}"
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return result


#: Row-dropping and attention-span settings tried on ``ids_stop`` (``--settings``) besides the
#: engine's own: (CHECK_EVERY_STEPS, KEEP_AT_MOST, SPAN_SLOTS).
ENGINE_SETTINGS: list[tuple[int, float, int]] = [
    (8, 0.5, 128),
    (8, 0.75, 128),
    (8, 0.9, 128),
    (4, 0.75, 128),
    (16, 0.75, 128),
    (8, 0.75, 64),
]


def setting_name(setting: tuple[int, float, int]) -> str:
    check, keep, span = setting
    return f"check{check}_keep{keep:g}_span{span}"


def engine_settings(
    model: Any, prompts: list[list[int]], stops: list[int], names: list[str], found: dict[str, Any]
) -> None:
    """``ids_stop`` once under the engine's own settings, then under each of ``names``
    (:data:`ENGINE_SETTINGS`), into ``found`` as each ends (the first is the engine's default); the
    engine's module settings patched for each call and put back after."""
    from autorl.decoding import greedy_engine

    default = (greedy_engine.CHECK_EVERY_STEPS, greedy_engine.KEEP_AT_MOST, greedy_engine.SPAN_SLOTS)
    tried = {setting_name(setting): setting for setting in ENGINE_SETTINGS}
    order = [setting_name(default), *(name for name in names if name != setting_name(default))]
    try:
        for name in order:
            check, keep, span = tried.get(name, default)
            greedy_engine.CHECK_EVERY_STEPS = check
            greedy_engine.KEEP_AT_MOST = keep
            greedy_engine.SPAN_SLOTS = span
            common.synchronize()
            began = time.perf_counter()
            output = greedy_engine.generate_greedy(model, prompts, max_new_tokens=stops, eos_ids=[], pad_id=0)
            common.synchronize()
            found[name] = {
                "seconds": round(time.perf_counter() - began, 2),
                "new_tokens": sum(len(t) for t in output.tokens),
            }
            common.log(f"in-process ids_stop {name}: {found[name]}")
    finally:
        greedy_engine.CHECK_EVERY_STEPS, greedy_engine.KEEP_AT_MOST, greedy_engine.SPAN_SLOTS = default


def engine_profile(model: Any, prompts: list[list[int]], stops: list[int], top: int = 12) -> dict[str, Any]:
    """One ``ids_stop`` call under torch.profiler (CPU and CUDA activity, the engine's defaults):
    its wall seconds, the GPU's kernel time summed, and the kernels that took most of it."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    from autorl.decoding.greedy_engine import generate_greedy

    common.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        # Timed inside: the profiler's start and its flush at the end are not the call's.
        began = time.perf_counter()
        generate_greedy(model, prompts, max_new_tokens=stops, eos_ids=[], pad_id=0)
        common.synchronize()
        wall = time.perf_counter() - began
    cuda = DeviceType.CUDA
    kernels = [event for event in prof.key_averages() if event.device_type == cuda]
    gpu_us = sum(event.self_device_time_total for event in kernels)
    kernels.sort(key=lambda event: event.self_device_time_total, reverse=True)
    return {
        "wall_s": round(wall, 2),
        "kernel_s": round(gpu_us / 1e6, 2),
        "kernel_share_of_wall": round(gpu_us / 1e6 / wall, 3),
        "top_kernels": [
            {"name": event.key[:120], "calls": event.count, "s": round(event.self_device_time_total / 1e6, 3)}
            for event in kernels[:top]
        ],
    }


def vllm_variant(
    inputs: Path, model_dir: Path, kwargs: dict[str, Any], seed: int, timeout_s: float
) -> dict[str, Any]:
    """One vLLM configuration in a process of its own (bench/opencompass_vllm_gpu.py offline)."""
    folder = Path(tempfile.mkdtemp(prefix="engine-race-"))
    began = time.perf_counter()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    try:
        found, _ = common.offline_child(inputs, model_dir, kwargs, seed, folder, timeout_s=timeout_s, env=env)
    except subprocess.CalledProcessError as exc:
        return {"status": "failed", "returncode": exc.returncode}
    except OSError as exc:  # it exited without writing its result
        return {"status": "failed", "error": str(exc)}
    return {
        "status": "ok",
        "engine_kwargs": kwargs,
        "process_s": round(time.perf_counter() - began, 1),
        **found,
    }


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    """Per workload: the fastest vLLM configuration's seconds over the in-process engine's (its
    first and its second call), both from this run."""
    engine = report.get("in_process", {}).get("runs", {})
    found: dict[str, Any] = {}
    for workload in WORKLOADS:
        timed = {
            name: variant["runs"][workload]["seconds"]
            for name, variant in report["vllm"].items()
            if variant.get("status") == "ok" and workload in variant["runs"]
        }
        if not timed or workload not in engine:
            continue
        best = min(timed, key=lambda name: timed[name])
        found[workload] = {
            "fastest_vllm": best,
            "fastest_vllm_s": timed[best],
            "in_process_first_s": engine[workload]["first"]["seconds"],
            "in_process_second_s": engine[workload]["second"]["seconds"],
            "vllm_over_in_process_first": round(timed[best] / engine[workload]["first"]["seconds"], 2),
            "vllm_over_in_process_second": round(timed[best] / engine[workload]["second"]["seconds"], 2),
        }
    return found


def join(race: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``race`` with the in-process engine's settings and profile from another call's results
    (``--settings``): that call's date, command and unprofiled ``ids_stop`` seconds go under
    ``in_process.settings_call``."""
    tried = settings.get("in_process", {})
    if "ids_stop_settings" not in tried:
        raise ValueError("the settings file holds no --settings run")
    joined: dict[str, Any] = json.loads(json.dumps(race))
    joined["in_process"].update(
        ids_stop_settings=tried["ids_stop_settings"],
        ids_stop_profile=tried.get("ids_stop_profile"),
        settings_call={
            "date": settings["date"],
            "command": settings["command"],
            "ids_stop_second_s": tried["runs"]["ids_stop"]["second"]["seconds"],
        },
    )
    return joined


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, help="bench/opencompass_vllm_gpu.py record's carry")
    parser.add_argument(
        "--join",
        nargs=2,
        type=Path,
        metavar=("RACE", "SETTINGS"),
        help="RACE's results with the settings and profile of SETTINGS (another call), to --output",
    )
    parser.add_argument("--work", type=Path, default=Path("/root/engine-race"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", choices=sorted(VLLM_VARIANTS), help="vLLM variants to run")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="start no variant after this")
    parser.add_argument(
        "--settings",
        nargs="*",
        choices=[setting_name(setting) for setting in ENGINE_SETTINGS],
        help="in-process engine settings tried on ids_stop (no names: all), then one profiled call",
    )
    args = parser.parse_args()
    if args.join:
        race, settings = (json.loads(path.read_text(encoding="utf-8")) for path in args.join)
        try:
            joined = join(race, settings)
        except ValueError as exc:
            parser.error(f"{args.join[1]}: {exc}")
        args.output.write_text(json.dumps(joined, indent=2) + "\n", encoding="utf-8")
        return 0
    if args.inputs is None:
        parser.error("--inputs is required: bench/opencompass_vllm_gpu.py record's carry (or --join)")
    import torch

    began = time.perf_counter()
    inputs = args.inputs.resolve()
    model_dir = args.work / "A"
    built = common.build_view_checkpoint(inputs, model_dir, args.seed)
    torch.cuda.empty_cache()
    recorded, prompts, stops = common.load_workload(inputs, args.seed)
    report: dict[str, Any] = {
        "benchmark": "engine_race_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": common.command_line(args.output),
        "environment": common.environment(),
        "model": {
            "description": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed})",
            **built,
        },
        "workloads": {
            "ids_stop": f"{len(prompts)} random-id prompts ({len(prompts[0])} ids in the first), GSM8K "
            f"answer lengths (mean {sum(stops) / len(stops):.1f} new tokens), end-of-text ignored",
            "ids_full": "the same prompts, 512 new tokens each, end-of-text ignored",
            "opencompass_prompts": f"OpenCompass's {len(recorded['prompts'])} rendered prompts, "
            f"sampling {recorded['sampling_kwargs']}",
        },
        "worker_engine_kwargs": recorded["engine_kwargs"],
        "vllm": {},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        report["ratios"] = ratios(report)
        args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    every = [setting_name(setting) for setting in ENGINE_SETTINGS]
    settings = None if args.settings is None else (args.settings or every)
    report["in_process"] = in_process(model_dir, recorded, prompts, stops, settings)
    write()
    for name, extra in VLLM_VARIANTS.items():
        if args.only is not None and name not in args.only:
            continue
        left = args.deadline_s - (time.perf_counter() - began)
        if left < 60:
            report["vllm"][name] = {"status": "not run: deadline"}
            continue
        try:
            report["vllm"][name] = vllm_variant(
                inputs, model_dir, {**recorded["engine_kwargs"], **extra}, args.seed, left
            )
        except subprocess.TimeoutExpired:
            report["vllm"][name] = {"status": "timed out"}
        common.log(f"{name}: {report['vllm'][name]}")
        write()
    common.log(f"ratios {report['ratios']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
