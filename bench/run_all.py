"""``make bench``: every CPU benchmark, then docs/PERFORMANCE.md's figures rewritten from the results.

CPU benchmarks run here, one after another, each writing its ``bench/results/*.json``. GPU
benchmarks need a CUDA machine: their exact commands are printed, to be run there and their
results files copied back (this machine's numbers would not be theirs). Last,
``tools/performance_doc.py`` rewrites the document's generated blocks from whatever results are committed.

    .venv/bin/python bench/run_all.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Name → arguments after the Python interpreter.
CPU_BENCHMARKS: dict[str, list[str]] = {
    "opencompass_cpu": ["bench/opencompass_cpu.py", "--problems", "4", "--max-new-tokens", "512"],
    "warm_opencompass_cpu": ["bench/warm_opencompass_cpu.py", "--problems", "4", "--max-new-tokens", "24"],
    "grader_fuzz": ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_grader_fuzz.py"],
    "grader_load": ["bench/grader_load.py", "--agents", "500", "--waiters", "500", "--duration", "10"],
    "soak": ["bench/soak.py", "--duration", "1200", "--interval", "3"],
    # The grader's snapshot copy of a 1 GB checkpoint: hashing beside the copy against after each write.
    "snapshot_copy": ["bench/snapshot_copy.py", "--rounds", "6"],
    # The embedded demo under each agent setting, one after another on two cores (about 35 minutes).
    "demo_cpu": ["bench/demo_cpu.py", "--parallel", "1"],
}
#: Name → environment variables a benchmark needs beside this process's.
BENCHMARK_ENV: dict[str, dict[str, str]] = {
    "grader_fuzz": {"AUTORL_FUZZ_REPORT": str(REPO_ROOT / "bench" / "results" / "grader_fuzz.json")},
}
#: Name → the command to run on a GPU machine, from the repository root.
GPU_BENCHMARKS: dict[str, str] = {
    "hf_generation_gpu": "PYTHONPATH=.:bench python3 bench/hf_generation_gpu.py",
    "grpo_gpu": "PYTHONPATH=.:bench:services/agents python3 bench/grpo_gpu.py",
    # The learning-rate sweep; the fast path beside TRL with colocated vLLM from the same checkpoint
    # takes two more calls (vLLM and TRL in /root/site), joined with --merge (bench/README.md).
    "grpo_learning_gpu": "PYTHONPATH=.:bench:services/agents python3 bench/grpo_learning_gpu.py --grpo-s 80",
    "parallel_gpu": "PYTHONPATH=.:bench python3 -m torch.distributed.run --nproc-per-node 2 "
    "bench/parallel_gpu.py",
    "hf_eval_gpu": "PYTHONPATH=.:services/evaluator-worker python3 bench/hf_eval_gpu.py "
    "--variants 64@700 256@700 512@700 1319@700 64 256 512 1319 --max-new-tokens 512",
    # The wheelhouse of tools/gpu_wheelhouse.py carried as .whl (the image lacks our services' needs).
    "autorl_run_gpu": "python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl && "
    "python3 bench/autorl_run_gpu.py",
    # The middle of three steps: `record` here before, `replay` here after (the script's docstring);
    # vLLM 0.25 and bench/data/vllm-0.25-serve-wheels.txt installed in /root/site there.
    "opencompass_vllm_gpu": "PYTHONPATH=/root/site:.:bench VLLM_USE_FLASHINFER_SAMPLER=0 "
    "python3 bench/opencompass_vllm_gpu.py gpu --inputs .vllm-parts/oc/carry --out OUT",
    # vLLM 0.25 as above, with bench/data/trl-1.16-wheels.txt beside it. The 64x8 pair ran in a
    # second call (--steps 2); the learning comparison (--checkpoint /root/resident/T2, after
    # resident_engine_gpu's prepare) in another; each joined with --merge (docs/PERFORMANCE.md).
    "grpo_trl_vllm_gpu": "PYTHONPATH=/root/site:.:bench:services/agents VLLM_USE_FLASHINFER_SAMPLER=0 "
    "python3 bench/grpo_trl_vllm_gpu.py",
    "vllm_warm_reload_gpu": "PYTHONPATH=/root/site:.:bench VLLM_USE_FLASHINFER_SAMPLER=0 "
    "VLLM_ALLOW_INSECURE_SERIALIZATION=1 python3 bench/vllm_warm_reload_gpu.py",
    # vLLM 0.25 as above; .vllm-parts/oc/carry from `bench/opencompass_vllm_gpu.py record` here. It
    # trains its checkpoints first (this call), then serve and bare in two more calls on one warm
    # machine, and replay here (bench/README.md, "The GPU figures, call by call").
    "resident_engine_gpu": "PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 "
    "python3 bench/resident_engine_gpu.py --inputs .vllm-parts/oc/carry --work /root/resident "
    "--phase prepare --steps 160",
    "engine_race_gpu": "PYTHONPATH=/root/site:.:bench VLLM_USE_FLASHINFER_SAMPLER=0 "
    "python3 bench/engine_race_gpu.py --inputs .vllm-parts/oc/carry --output $OUT/engine_race_gpu.json "
    "--deadline-s 520",
    # Both environments from tools/gpu_evaluator_parts.py installed there (its install.sh), and
    # /root/resident from resident_engine_gpu's --phase prepare; then `in-process` and `bare` in
    # python3, each in a call of its own (each phase keeps its file in /root/resident/results).
    "opencompass_worker_gpu": "PYTHONPATH=.:services/evaluator-worker /root/oc/bin/python "
    "bench/opencompass_worker_gpu.py run --work /root/resident --opencompass-bin /root/oc/bin/opencompass "
    "--vllm-python /root/vllm-python --output $OUT/opencompass_worker_gpu.json",
}

#: GPU benchmarks whose results are not committed yet, with why (printed by ``make bench``).
NOT_YET_MEASURED: dict[str, str] = {
    "parallel_gpu": "needs two GPUs of one host; written, not run yet (docs/PERFORMANCE.md)",
}

#: Scripts in bench/ that are not benchmarks of their own: this runner, the benchmarks' shared
#: helpers, the script that made ``bench/data`` once (it needs inputs from outside the repository),
#: the load benchmark's bare yardstick app and the soak's agent. Tooling (document generators,
#: mutation testing, test-order and suite-time records, the GPU wheelhouse) is in tools/.
NOT_BENCHMARKS = frozenset({"run_all", "common", "gsm8k_lengths", "bare_time_app", "soak_agent"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CPU_BENCHMARKS), help="CPU benchmarks to run")
    args = parser.parse_args()
    failed = []
    for name, arguments in CPU_BENCHMARKS.items():
        if args.only is not None and name not in args.only:
            continue
        print(f"== {name}: {' '.join(arguments)}", flush=True)
        started = time.monotonic()
        env = {**os.environ, **BENCHMARK_ENV.get(name, {})}
        code = subprocess.run([sys.executable, *arguments], cwd=REPO_ROOT, env=env, check=False).returncode
        print(f"== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code:
            failed.append(name)
    print(
        "\nGPU benchmarks (run on a CUDA machine from the repository root, "
        "then copy bench/results/NAME.json here):"
    )
    for name, command in GPU_BENCHMARKS.items():
        print(f"  {name}: {command}")
        if name in NOT_YET_MEASURED:
            print(f"    (no results yet: {NOT_YET_MEASURED[name]})")
    for document in ("tools.performance_doc", "tools.reliability_doc"):
        subprocess.run([sys.executable, "-m", document], cwd=REPO_ROOT, check=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
