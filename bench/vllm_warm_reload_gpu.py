"""A resident vLLM engine that loads each new checkpoint in place, against a fresh engine per checkpoint.

An evaluator worker that keeps one vLLM engine per architecture can take a submission's weights
into it (each parameter's own weight loader copies the checkpoint's tensors into the memory the
engine already holds, so its CUDA graphs stay valid) instead of starting an engine per
submission. Measured here on one GPU, vLLM 0.25, the Qwen2.5-1.5B architecture (random bf16
weights, bench/grpo_trl_vllm_gpu.py's checkpoint: the builtin Qwen2-format tokenizer padded to the
model's vocabulary), two checkpoints ``A`` and ``B`` of that architecture drawn from two seeds:

- **warm**: one process starts an engine on ``A`` and answers the workload; then, for each of
  ``B`` and ``A`` again, the seconds from "checkpoint on disk" to "every prompt answered": the
  safetensors file read, its tensors loaded into the resident model through
  ``LLM.collective_rpc`` (the model's ``load_weights``), the prefix cache emptied (its blocks hold
  the old weights' keys and values), the workload generated.
- **fresh**: for ``A`` and then ``B``, a new process that imports vLLM, starts an engine on the
  checkpoint (vLLM's compile cache already warm from the warm process) and answers the workload:
  seconds from the process's launch to the last answer, and the engine's own start and generation.

The workload: bench/hf_generation_gpu.py's 1,319 random-id prompts (1,441 shared prefix ids), each
row stopping at a GSM8K answer length (bench/data/gsm8k_qwen25_lengths.json), greedy. Answers are
compared as token ids: warm ``B`` against fresh ``B``, warm ``A`` (after ``B``) against fresh
``A``, and, as the floor of what two engines agree on, the warm process's first answers on ``A``
(a freshly started engine too) against the fresh process's.

    PYTHONPATH=.:bench VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \\
        python3 bench/vllm_warm_reload_gpu.py [--output PATH]

Writes ``bench/results/vllm_warm_reload_gpu.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "vllm_warm_reload_gpu.json"
#: The engine settings measured fastest for the whole split (bench/opencompass_vllm_gpu.py).
ENGINE = {"enforce_eager": False, "enable_prefix_caching": True, "max_num_seqs": 512, "seed": 0}
VARIABLES = ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ALLOW_INSECURE_SERIALIZATION")


def command_line(output: Path) -> str:
    """This process's command as run (its environment variables named, ``--output`` under $OUT)."""
    variables = " ".join(f"{name}={os.environ[name]}" for name in VARIABLES if name in os.environ)
    arguments = " ".join(sys.argv[1:]).replace(str(output), f"$OUT/{output.name}")
    return f"{variables} python3 bench/{Path(sys.argv[0]).name} {arguments}".strip()


def compare(first: list[list[int]], second: list[list[int]]) -> dict[str, Any]:
    """Identical rows of token ids, and the mean number of leading ids two rows share."""
    if len(first) != len(second):
        raise ValueError(f"{len(first)} rows against {len(second)}")
    leading = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for a, b in zip(first, second, strict=True)
    ]
    return {
        "rows": len(first),
        "identical": sum(a == b for a, b in zip(first, second, strict=True)),
        "mean_identical_leading_ids": round(sum(leading) / max(1, len(leading)), 1),
    }


def _generate(llm: Any, prompts: list[list[int]], stops: list[int]) -> list[list[int]]:
    from vllm import SamplingParams

    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        [SamplingParams(temperature=0.0, max_tokens=s, ignore_eos=True) for s in stops],
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def _load_in_place(worker: Any, path: str) -> int:
    """Runs in the engine's worker: the checkpoint's tensors into the resident model."""
    from safetensors.torch import load_file

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    state = load_file(path, device="cuda")
    loaded = model.load_weights(iter(state.items()))
    return len(loaded) if loaded is not None else len(state)


def _checksum(worker: Any) -> dict[str, str]:
    """Runs in the engine's worker: a digest of every parameter's bytes."""
    import hashlib

    import torch

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    digests = {}
    for name, parameter in model.named_parameters():
        data = parameter.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
        digests[name] = hashlib.sha256(data).hexdigest()[:16]
    return digests


def warm(args: argparse.Namespace) -> dict[str, Any]:
    """The warm process: start on A, then reload B and A in place, timing each to the last answer."""
    from vllm import LLM

    prompts, stops = common.id_workload(args.seed, args.id_range)
    began = time.perf_counter()
    llm = LLM(str(args.checkpoints[0]), **ENGINE)
    result: dict[str, Any] = {"engine_start_s": round(time.perf_counter() - began, 2), "reloads": []}
    started = time.perf_counter()
    answers = {"A_start": _generate(llm, prompts, stops)}
    result["first_generate_s"] = round(time.perf_counter() - started, 2)
    common.log(f"warm: engine {result['engine_start_s']} s, first generate {result['first_generate_s']} s")
    # Controls: the same engine on the same weights again (no reload), and the weights' checksums.
    llm.reset_prefix_cache()
    answers["A_repeat"] = _generate(llm, prompts, stops)
    checksums = {"A_start": llm.collective_rpc(_checksum)[0]}
    for label, checkpoint in (("A_onto_A", args.checkpoints[0]),):
        llm.collective_rpc(_load_in_place, args=(str(checkpoint / "model.safetensors"),))
        llm.reset_prefix_cache()
        answers[label] = _generate(llm, prompts, stops)
        checksums[label] = llm.collective_rpc(_checksum)[0]
    for label, checkpoint in (("B", args.checkpoints[1]), ("A", args.checkpoints[0])):
        path = str(checkpoint / "model.safetensors")
        started = time.perf_counter()
        loaded = llm.collective_rpc(_load_in_place, args=(path,))
        weights_s = time.perf_counter() - started
        llm.reset_prefix_cache()
        answers[label] = _generate(llm, prompts, stops)
        seconds = time.perf_counter() - started
        result["reloads"].append(
            {
                "checkpoint": label,
                "tensors_loaded": loaded,
                "load_weights_s": round(weights_s, 2),
                "checkpoint_to_answers_s": round(seconds, 2),
            }
        )
        common.log(f"warm reload {label}: {result['reloads'][-1]}")
        checksums[label] = llm.collective_rpc(_checksum)[0]
    result["new_tokens"] = sum(len(a) for a in answers["B"])
    result["parameters_bitwise_equal_after_reloading_A"] = checksums["A"] == checksums["A_start"]
    result["parameters_bitwise_equal_after_loading_A_onto_A"] = checksums["A_onto_A"] == checksums["A_start"]
    Path(args.answers).write_text(json.dumps(answers), encoding="utf-8")
    return result


def fresh(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh process's engine on one checkpoint; the launch time comes from the parent."""
    started = time.perf_counter()
    from vllm import LLM

    import_s = time.perf_counter() - started
    prompts, stops = common.id_workload(args.seed, args.id_range)
    started = time.perf_counter()
    llm = LLM(str(args.checkpoints[0]), **ENGINE)
    engine_s = time.perf_counter() - started
    started = time.perf_counter()
    answers = _generate(llm, prompts, stops)
    generate_s = time.perf_counter() - started
    Path(args.answers).write_text(json.dumps(answers), encoding="utf-8")
    return {
        "import_s": round(import_s, 2),
        "engine_start_s": round(engine_s, 2),
        "generate_s": round(generate_s, 2),
    }


def _child(step: str, checkpoints: list[Path], answers: Path, result: Path, args: Any) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--step",
        step,
        "--checkpoints",
        *map(str, checkpoints),
        "--answers",
        str(answers),
        "--result",
        str(result),
        "--seed",
        str(args.seed),
        "--id-range",
        str(args.id_range),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, timeout=args.child_timeout_s)
    record: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
    record["process_s"] = round(time.perf_counter() - started, 2)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--seed", type=int, default=0, help="the workload's seed; the checkpoints' are 0 and 1"
    )
    parser.add_argument("--child-timeout-s", type=float, default=300.0)
    parser.add_argument("--warm-only", action="store_true", help="leave out the fresh processes")
    parser.add_argument("--step", choices=["warm", "fresh"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoints", type=Path, nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--answers", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--id-range", type=int, default=151_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        record = {"status": "ok", **(warm(args) if args.step == "warm" else fresh(args))}
        args.result.write_text(json.dumps(record), encoding="utf-8")
        return 0
    import torch

    began = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "benchmark": "vllm_warm_reload_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": command_line(args.output),
        "environment": {**common.environment(), "gpu": props.name},
        "engine_kwargs": ENGINE,
        "workload": "bench/hf_generation_gpu.py's 1,319 random-id prompts (1,441 shared prefix ids), "
        "GSM8K answer lengths (bench/data/gsm8k_qwen25_lengths.json), greedy, end-of-text ignored",
    }

    def save() -> None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        checkpoints = [root / "A", root / "B"]
        started = time.perf_counter()
        model = common.build_padded_checkpoint(checkpoints[0], 0, smoke=False)
        common.build_padded_checkpoint(checkpoints[1], 1, smoke=False)
        report["model"] = {
            "description": "Qwen2.5-1.5B architecture, random bf16 weights (A: seed 0, B: seed 1), the "
            "builtin Qwen2-format tokenizer padded to the model's vocabulary",
            **model,
            "checkpoint_bytes": (checkpoints[0] / "model.safetensors").stat().st_size,
            "build_s": round(time.perf_counter() - started, 1),
        }
        answers: dict[str, Any] = {}
        try:
            common.log("warm process")
            report["warm"] = _child("warm", checkpoints, root / "warm.json", root / "warm-result.json", args)
            answers.update({f"warm_{k}": v for k, v in json.loads((root / "warm.json").read_text()).items()})
            save()
            report["fresh"] = {}
            for label, checkpoint in (("A", checkpoints[0]), ("B", checkpoints[1])):
                if args.warm_only:
                    break
                common.log(f"fresh process {label}")
                record = _child(
                    "fresh",
                    [checkpoint],
                    root / f"fresh-{label}.json",
                    root / f"fresh-{label}-result.json",
                    args,
                )
                report["fresh"][label] = record
                answers[f"fresh_{label}"] = json.loads((root / f"fresh-{label}.json").read_text())
                save()
        except Exception as exc:
            traceback.print_exc()
            report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        pairs = {
            "warm_B_vs_fresh_B": ("warm_B", "fresh_B"),
            "warm_A_after_B_vs_fresh_A": ("warm_A", "fresh_A"),
            "warm_A_after_B_vs_warm_A_at_start": ("warm_A", "warm_A_start"),
            "control_same_engine_same_weights_again": ("warm_A_repeat", "warm_A_start"),
            "warm_A_loaded_onto_A_vs_warm_A_at_start": ("warm_A_onto_A", "warm_A_start"),
            "warm_A_after_B_vs_warm_A_repeat": ("warm_A", "warm_A_repeat"),
            "control_two_fresh_engines_on_A": ("warm_A_start", "fresh_A"),
            "control_A_vs_B_differ": ("warm_A_start", "fresh_B"),
        }
        report["agreement"] = {
            name: compare(answers[a], answers[b])
            for name, (a, b) in pairs.items()
            if a in answers and b in answers
        }
        report["total_s"] = round(time.perf_counter() - began, 1)
        save()
        shutil.rmtree(root, ignore_errors=True)
    common.log(json.dumps({k: report.get(k) for k in ("warm", "fresh", "agreement")}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
