"""The embedded demo (``make run``) under several settings of the example agent, side by side.

Each variant is one ``autorl run -t arith -m builtin:tiny-qwen2 -a example_grpo --timeout T`` with
its own ``AUTORL_AGENT_ARGS``, home and port, pinned to a pair of cores of its own (``taskset``;
``OMP_NUM_THREADS=2``): the agent, the grader and the evaluator share those two cores, as on a
2-core machine. With ``--parallel N`` N variants run at once on disjoint core pairs (a machine with
2N idle cores measures N demos as if each had its machine to itself); ``--parallel 1`` runs them
one after another on cores 0-1. CUDA is hidden, so every run is the CPU demo.

``default_loaded`` is the default with two CPU-bound processes pinned to the same two cores, as on a
2-core machine that is busy with something else (``bench/results/demo_cpu_loaded.json``).

For each variant: the results row (baseline, best, improvement), the best score of the SFT
checkpoints and of the GRPO checkpoints (by their names, ``sft-*`` / ``grpo-*``), every submission,
and the run's wall time.

    .venv/bin/python bench/demo_cpu.py [--variants NAME ...] [--parallel 1] [--timeout 300]

Writes ``bench/results/demo_cpu.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "demo_cpu.json"
#: Variant → the example agent's extra arguments (``AUTORL_AGENT_ARGS``).
VARIANTS: dict[str, str] = {
    "default": "",
    "sft_only": "--rl none",
    "reference_sizes_trl": "--rollouts trl --grpo-learning-rate 5e-4 --grpo-prompts-per-step 2 "
    "--num-generations 4",
    "fast_lr5e-4": "--grpo-learning-rate 5e-4",
    "trl": "--rollouts trl",
    "fast_lr2e-5_32x8_sft60": "--grpo-learning-rate 2e-5 --grpo-prompts-per-step 32 --sft-time-fraction 0.6",
    "default_loaded": "",
}
#: Variant → CPU-bound processes (``while True: pass``) pinned beside the run on its cores: a
#: machine whose cores something else keeps busy.
BUSY: dict[str, int] = {"default_loaded": 2}
CORES_PER_RUN = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--parallel", type=int, default=1, help="variants at once, each on its own 2 cores")
    parser.add_argument("--timeout", type=float, default=300.0, help="the agent's budget (make run: 300)")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.parallel * CORES_PER_RUN > len(cores):
        raise SystemExit(
            f"--parallel {args.parallel} needs {args.parallel * CORES_PER_RUN} cores; {len(cores)} here"
        )
    results: dict[str, Any] = {
        "benchmark": "demo_cpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": "python bench/demo_cpu.py " + " ".join(sys.argv[1:]),
        "machine": {"cores": len(cores), "processor": platform.processor() or platform.machine()},
        "timeout_s": args.timeout,
        "cores_per_run": CORES_PER_RUN,
        "parallel": args.parallel,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="autorl-demo-") as scratch:
        pairs = [cores[i : i + CORES_PER_RUN] for i in range(0, args.parallel * CORES_PER_RUN, CORES_PER_RUN)]
        free = list(range(args.parallel))

        def one(index_name: tuple[int, str]) -> None:
            index, name = index_name
            slot = free.pop()
            try:
                results["variants"][name] = run_variant(
                    name, Path(scratch) / name, pairs[slot], port=8300 + index, timeout=args.timeout
                )
            finally:
                free.append(slot)
            write(args.output, results)

        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            list(pool.map(one, enumerate(args.variants)))
    for name, record in results["variants"].items():
        print(
            f"{name:28} baseline {record.get('baseline')} best {record.get('best_score')} "
            f"sft {record.get('best_sft')} grpo {record.get('best_grpo')} wall {record.get('wall_s')} s"
        )
    return 0


def run_variant(name: str, home: Path, cores: list[int], *, port: int, timeout: float) -> dict[str, Any]:
    home.mkdir(parents=True)
    threads = str(len(cores))
    env = {
        **os.environ,
        "AUTORL_HOME": str(home),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONUNBUFFERED": "1",
    }
    command = [
        "taskset", "-c", ",".join(map(str, cores)),
        *common.autorl_command(),
        "run", "-t", "arith", "-m", "builtin:tiny-qwen2", "-a", "example_grpo",
        "--timeout", f"{timeout:g}", "--port", str(port), "--sandbox", "none",
        "--env", f"AUTORL_AGENT_ARGS={VARIANTS[name]}",
    ]  # fmt: skip
    busy = [
        subprocess.Popen(["taskset", "-c", pinned, sys.executable, "-c", "while True: pass"])
        for pinned in [",".join(map(str, cores))] * BUSY.get(name, 0)
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    record: dict[str, Any] = {
        "agent_args": VARIANTS[name],
        "busy_processes": len(busy),
        "cores": cores,
        "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "terminal_tail": done.stdout.splitlines()[-12:] + done.stderr.splitlines()[-5:],
    }
    row = common.last_results_row(home, env)
    if row is None:
        record["error"] = "no results row"
        return record
    scored = common.submissions(Path(str(row["workspace"])) / "scores.json")
    record.update(
        baseline=row["baseline"],
        best_score=row["best_score"],
        improvement=row["improvement"],
        status=row["status"],
        best_sft=_best(scored, "output/sft"),
        best_grpo=_best(scored, "output/grpo"),
        submissions=scored,
        # How far each phase got: a loaded machine shows here first.
        phase_steps=dict(
            re.findall(r"event=phase_end phase=(\w+) steps=(\d+)", _agent_log(Path(str(row["workspace"]))))
        ),
    )
    return record


def _agent_log(workspace: Path) -> str:
    log = workspace / "agent.log"
    return log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""


def _best(scored: list[dict[str, Any]], prefix: str) -> float | None:
    scores = [
        s["score"] for s in scored if str(s["model_path"]).startswith(prefix) and s["score"] is not None
    ]
    return max(scores) if scores else None


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
