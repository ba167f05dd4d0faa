"""The warm worker's OpenCompass against the ``opencompass`` command, side by side on the CPU.

One call, one model, one workload: the ``opencompass`` backend's ``evaluate`` on the builtin tiny
Qwen2 (``--problems`` GSM8K test problems in the real 4-shot prompt, ``--max-new-tokens`` each),
``--rounds`` evaluations of each variant one after another, as one worker process takes them:

- ``command``: the ``opencompass`` command (its three processes), OpenCompass's own transformers
  model in its inference process;
- ``warm``: the warm worker (``AUTORL_EVAL_WARM_WORKER``), each evaluation forked from the warm
  OpenCompass;
- ``command_resident`` / ``warm_resident``: the same two with the resident engine
  (``AUTORL_VLLM_PYTHON``, the transformers engine on the CPU): outside the warm worker each
  evaluation starts its own engine, in it the engine stays and takes each checkpoint in place.

A warm variant's first evaluation starts its server (and engine) and is reported apart. Short
answers keep generation small, as it is on a GPU, so the figures are the fixed cost around it.
Writes ``bench/results/warm_opencompass_cpu.json``.

    .venv/bin/python bench/warm_opencompass_cpu.py [--problems 4] [--max-new-tokens 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "warm_opencompass_cpu.json"
OC_BIN = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
DATA = REPO_ROOT / "tests" / "data"
VARIANTS = ("command", "warm", "command_resident", "warm_resident")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO_ROOT))
    from autorl.eval_config import EvalConfig
    from autorl.models.sources import resolve_model
    from autorl.tasks import get_task
    from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
    from autorl_evaluator.backends.opencompass.resident_engine import ENGINES
    from autorl_evaluator.backends.opencompass.warm_opencompass import SERVERS
    from autorl_evaluator.settings import WorkerSettings

    root = Path(tempfile.mkdtemp(prefix="warm-opencompass-"))
    model = resolve_model("builtin:tiny-qwen2", root / "models")
    task = get_task("gsm8k")
    problems = task.load_test_problems(root / "data", source_dir=DATA, limit=args.problems)
    settings = {
        name: WorkerSettings(
            home=root / name,
            eval_device="cpu",
            opencompass_bin=OC_BIN,
            eval_max_new_tokens=args.max_new_tokens,
            eval_batch_size=args.problems,
            eval_warm_worker=name.startswith("warm"),
            vllm_python=Path(sys.executable) if name.endswith("resident") else None,
        )
        for name in VARIANTS
    }
    backend = OpenCompassBackend()
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    first: dict[str, float] = {}
    completions: dict[str, list[str]] = {}
    started_all = time.perf_counter()
    try:
        # Each variant's evaluations one after another, as one worker process takes them: an
        # evaluation outside the warm worker stops whatever a warm one kept.
        for name in VARIANTS:
            config = EvalConfig.record(task.name, settings[name])
            warm = name.startswith("warm")
            for index in range(args.rounds + (1 if warm else 0)):
                began = time.perf_counter()
                result = backend.evaluate(model, task, problems, config, settings[name])
                took = round(time.perf_counter() - began, 2)
                completions.setdefault(name, result.completions)
                assert result.details["opencompass_process"] == ("warm" if warm else "command")
                if warm and index == 0:
                    first[name] = took  # the server (and engine) start
                else:
                    seconds[name].append(took)
                print(f"{name} {index}: {took:.1f} s", flush=True)
            SERVERS.stop()
            ENGINES.stop()
    finally:
        SERVERS.stop()
        ENGINES.stop()
    medians = {name: round(statistics.median(values), 2) for name, values in seconds.items()}
    report: dict[str, Any] = {
        "benchmark": "warm_opencompass_cpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": " ".join([".venv/bin/python", "bench/warm_opencompass_cpu.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "model": "builtin:tiny-qwen2",
        "problems": args.problems,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "seconds": seconds,
        "median_s": medians,
        "first_evaluation_s": first,
        "ratios": {
            "command_over_warm": round(medians["command"] / medians["warm"], 2),
            "command_resident_over_warm_resident": round(
                medians["command_resident"] / medians["warm_resident"], 2
            ),
        },
        "same_completions": {
            "warm_vs_command": completions["warm"] == completions["command"],
            "warm_resident_vs_command_resident": completions["warm_resident"]
            == completions["command_resident"],
        },
        "total_s": round(time.perf_counter() - started_all, 1),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report["median_s"]), json.dumps(report["ratios"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
