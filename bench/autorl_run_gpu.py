"""``autorl run`` end to end on a GPU machine: embedded SQLite, local worker, the example agent.

One ``autorl run`` per layout, each in a home of its own (so each measures its own baseline):

- ``shared``: one GPU (``CUDA_VISIBLE_DEVICES=0``) and no ``--agent-gpus``/``--eval-gpus``: agent
  and evaluator share it, and the local worker waits for a free share of its memory before each
  evaluation;
- ``split``: ``--agent-gpus 0 --eval-gpus 1`` (needs two GPUs).

Task ``gsm8k`` from ``tests/data`` (``AUTORL_DATA_SOURCE_DIR``; the hub is out of reach there),
model: the Qwen2.5-1.5B architecture with random bf16 weights (bench/hf_eval_gpu.py's checkpoint)
or ``--model builtin:tiny-qwen2``; ``--task arith`` with the builtin model shows real learning.
The agent runs with ``--sandbox none`` (the GPU image has no bubblewrap). For each run the JSON
holds the phases as the run's own terminal printed them (seconds from the start of ``autorl run``: services
up, baseline started and scored, agent started, first submission, first score, agent exited,
results row), every submission's evaluation time, the results row, what the agent logged about
its device, and each GPU's peak memory in use while the run lasted (``nvidia-smi``).

On the GPU machine, with the wheelhouse of tools/gpu_wheelhouse.py carried as ``.whl``, installed
into the interpreter's own environment (not ``--target`` with ``PYTHONPATH``: the chat template's
renderer runs as ``python -I``, which ignores ``PYTHONPATH``):

    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    python3 bench/autorl_run_gpu.py --output $OUT/autorl_run_gpu.json

``--smoke`` checks the script on a CPU (builtin model, four problems, eight new tokens).
Writes ``bench/results/autorl_run_gpu.json`` (or ``--output``) after every run, each under
``TASK/LAYOUT``; ``--append`` keeps the runs another command wrote there (the ``arith`` run in a
call of its own:
``--append --task arith --model builtin:tiny-qwen2 --layouts split --timeout 240``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "autorl_run_gpu.json"
COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl && "
    "python3 bench/autorl_run_gpu.py"
)
#: Layout → the GPU flags of ``autorl run``.
LAYOUTS: dict[str, list[str]] = {
    "shared": [],
    "split": ["--agent-gpus", "0", "--eval-gpus", "1"],
}
#: Layout → variables ``autorl run`` starts with (what it sees of the machine).
LAYOUT_ENV: dict[str, dict[str, str]] = {"shared": {"CUDA_VISIBLE_DEVICES": "0"}, "split": {}}
#: Lines of ``autorl run``'s terminal that mark a phase, by the phase's name (first match counts).
PHASES: dict[str, re.Pattern[str]] = {
    "services_started": re.compile(r"phase=starting services"),
    "baseline_started": re.compile(r"phase=baseline"),
    "baseline_scored": re.compile(r"baseline score"),
    "agent_started": re.compile(r"phase=agent "),
    "first_submission": re.compile(r"submission \d+ \S+ status=queued"),
    "first_evaluation_started": re.compile(r"submission \d+ \S+ status=running"),
    "first_score": re.compile(r"submission \d+ \S+ status=scored"),
    "agent_exited": re.compile(r"agent exited|agent reached its deadline"),
    "finishing": re.compile(r"phase=finishing"),
    "results_row": re.compile(r"^Run \S+ (completed|interrupted|failed)"),
}
CHECKPOINT_NAME = "qwen25-1.5b-random"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--append", action="store_true", help="keep the runs already in --output (another call's)"
    )
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["shared", "split"])
    parser.add_argument("--task", default="gsm8k")
    parser.add_argument(
        "--model", default=CHECKPOINT_NAME, help=f"{CHECKPOINT_NAME} (built here) or any autorl run model"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="the agent's budget, seconds")
    parser.add_argument("--finish-wait", type=float, default=60.0)
    parser.add_argument("--eval-limit", type=int, default=None, help="AUTORL_EVAL_LIMIT (default all)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="AUTORL_EVAL_MAX_NEW_TOKENS")
    parser.add_argument(
        "--agent-args",
        default=None,
        help="AUTORL_AGENT_ARGS for example_grpo (default: --sft-epochs 2 --reserve-s 30; with --smoke "
        "--sft-epochs 1 --max-train-problems 8 --reserve-s 15)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script)")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.eval_limit, args.max_new_tokens = "builtin:tiny-qwen2", 4, 8
        args.timeout, args.finish_wait = min(args.timeout, 40.0), min(args.finish_wait, 60.0)
        args.agent_args = args.agent_args or "--sft-epochs 1 --max-train-problems 8 --reserve-s 15"
    args.agent_args = args.agent_args or "--sft-epochs 2 --reserve-s 30"
    isolated = subprocess.run(
        [sys.executable, "-I", "-c", "import autorl_local, autorl_evaluator, autorl_grader, fastapi"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if isolated.returncode:
        raise SystemExit(
            f"{sys.executable} -I cannot import the platform ({isolated.stderr.strip().splitlines()[-1]}): "
            "install its wheels into this interpreter's environment (pip install --no-deps .whl/*.whl), "
            "not with --target and PYTHONPATH, which isolated child processes ignore"
        )
    gpus = gpu_names()
    if not args.smoke and "split" in args.layouts and len(gpus) < 2:
        raise SystemExit(
            f"the split layout needs two GPUs; this machine has {len(gpus)}: pass --layouts shared"
        )
    results: dict[str, Any] = {"benchmark": "autorl_run_gpu", "command": COMMAND, "runs": {}}
    if args.append and args.output.is_file():
        results["runs"] = json.loads(args.output.read_text(encoding="utf-8"))["runs"]
    every_run: dict[str, Any] = {
        "arguments": sys.argv[1:],
        "smoke": args.smoke,
        "environment": environment(gpus),
        "settings": {
            "task": args.task,
            "timeout_s": args.timeout,
            "finish_wait_s": args.finish_wait,
            "eval_limit": args.eval_limit,
            "eval_max_new_tokens": args.max_new_tokens,
            "agent_args": args.agent_args,
        },
    }
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autorl-run-gpu-") as scratch:
        root = Path(scratch)
        model, every_run["model"] = prepare_model(args.model, root)
        for index, layout in enumerate(args.layouts):
            name = f"{args.task}/{layout}"
            common.log(f"autorl run {name}")
            record = {"date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}", **every_run}
            record.update(run_once(args, root / layout, model, layout, port=8100 + index))
            results["runs"][name] = record
            done.append(name)
            write(args.output, results)
    failed = [
        name
        for name in done
        if results["runs"][name].get("exit_code") != 0
        or results["runs"][name].get("results_row", {}).get("status") != "completed"
    ]
    if failed:
        common.log(
            f"not completed: {', '.join(failed)} (the results file holds each run's terminal and agent log)"
        )
    return 1 if failed else 0


def prepare_model(model: str, root: Path) -> tuple[str, dict[str, Any]]:
    """What ``autorl run --model`` gets, and how the results describe it."""
    if model != CHECKPOINT_NAME:
        return model, {"name": model}
    started = time.monotonic()
    checkpoint, parameters = common.build_checkpoint(root / "models" / CHECKPOINT_NAME, seed=0)
    # Readable by whatever user the agent ends up as.
    for path in [checkpoint.parent, checkpoint, *checkpoint.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(checkpoint), {
        "name": "Qwen2.5-1.5B architecture, random bf16 weights (seed 0), builtin tokenizer",
        "parameters": parameters,
        "build_s": round(time.monotonic() - started, 1),
    }


def run_once(args: argparse.Namespace, home: Path, model: str, layout: str, *, port: int) -> dict[str, Any]:
    """One ``autorl run``; its phases, evaluations, results row and GPU memory."""
    home.mkdir(parents=True)
    env = {
        **os.environ,
        "AUTORL_HOME": str(home),
        "AUTORL_DATA_SOURCE_DIR": str(REPO_ROOT / "tests" / "data"),
        "AUTORL_EVAL_MAX_NEW_TOKENS": str(args.max_new_tokens),
        "PYTHONUNBUFFERED": "1",
    }
    if args.eval_limit is not None:
        env["AUTORL_EVAL_LIMIT"] = str(args.eval_limit)
    if args.smoke:
        env["AUTORL_EVAL_DEVICE"] = "cpu"
    flags = [] if args.smoke else LAYOUTS[layout]
    overrides = {} if args.smoke else LAYOUT_ENV[layout]
    env.update(overrides)
    command = [
        *common.autorl_command(),
        "run",
        "--task", args.task,
        "--model", model,
        "--agent", "example_grpo",
        "--timeout", f"{args.timeout:g}",
        "--finish-wait", f"{args.finish_wait:g}",
        "--port", str(port),
        "--sandbox", "none",
        "--env", f"AUTORL_AGENT_ARGS={args.agent_args}",
        *flags,
    ]  # fmt: skip
    record: dict[str, Any] = {"flags": flags, "env": overrides, "phases_s": {}}
    sampler = GpuSampler()
    sampler.start()
    started = time.monotonic()
    lines: list[str] = []
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        elapsed = round(time.monotonic() - started, 1)
        text = line.rstrip("\n")
        lines.append(f"{elapsed:7.1f} {text}")
        print(f"  {elapsed:7.1f} {text}", flush=True)
        stripped = re.sub(r"^\[\d+:\d\d\] ", "", text)
        for name, pattern in PHASES.items():
            if name not in record["phases_s"] and pattern.search(stripped):
                record["phases_s"][name] = elapsed
    record["exit_code"] = process.wait()
    record["wall_s"] = round(time.monotonic() - started, 1)
    record["gpu_peak_used_mib"] = sampler.stop()
    record["terminal_tail"] = lines[-12:]
    row = common.last_results_row(home, env)
    if row is None:
        record["error"] = "no results row"
        return record
    record["results_row"] = row
    workspace = Path(str(row["workspace"]))
    record["submissions"] = common.submissions(workspace / "scores.json")
    agent_log = read_lines(workspace / "agent.log")
    record["agent_log"] = [line for line in agent_log if " event=" in line and "example_grpo" in line][:40]
    record["agent_log_tail"] = agent_log[-15:]
    return record


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []


def gpu_names() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def environment(gpus: list[str]) -> dict[str, Any]:
    import torch
    import transformers

    manifest = REPO_ROOT / ".whl" / "manifest.json"
    return {
        "gpus": gpus or [platform.processor() or platform.machine()],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "setpriv": shutil.which("setpriv") is not None,
        "bwrap": shutil.which("bwrap") is not None,
        "wheelhouse": json.loads(manifest.read_text(encoding="utf-8"))["added"]
        if manifest.is_file()
        else None,
    }


class GpuSampler:
    """Each GPU's largest memory in use (MiB) while it runs, read with ``nvidia-smi`` every second."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        if shutil.which("nvidia-smi") is not None:
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            for line in done.stdout.splitlines():
                index, _, used = line.partition(",")
                if used.strip().isdigit():
                    self.peaks[index.strip()] = max(self.peaks.get(index.strip(), 0), int(used))

    def stop(self) -> dict[str, int]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return dict(self.peaks)


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
