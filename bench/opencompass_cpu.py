"""Wall time of one CPU OpenCompass evaluation and where it goes.

Runs the ``opencompass`` backend once on the builtin tiny Qwen2 (the real 4-shot GSM8K prompts,
``--problems`` of them, ``--max-new-tokens`` each) and splits the wall time with the timestamps
OpenCompass leaves behind: the copy of the config its CLI writes once it has imported itself and
loaded the config, the first and last lines of each task's log, the predictions, results and
summary files. Separately it measures the CPU seconds of the imports each OpenCompass process
pays, and the CPU seconds of the whole process tree (stable on a busy machine, where wall time is
not). Writes ``bench/results/opencompass_cpu.json``.

    .venv/bin/python bench/opencompass_cpu.py [--problems 4] [--max-new-tokens 512]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "opencompass_cpu.json"
OC_PYTHON = REPO_ROOT / ".venv-opencompass" / "bin" / "python"
OC_BIN = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
PROBLEMS = REPO_ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"
#: OpenCompass's log timestamp: ``11/29 23:35:03`` (no year, whole seconds).
LOG_TIME = re.compile(r"^(\d\d/\d\d \d\d:\d\d:\d\d) - OpenCompass")


def _log_times(path: Path, year: int) -> dict[str, float]:
    """Epoch seconds of the first and last timestamped lines of an OpenCompass log, and of the
    lines that mark phases of an inference task."""
    marks: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = LOG_TIME.match(line)
        if not match:
            continue
        stamp = (
            datetime.strptime(f"{year}/{match.group(1)}", "%Y/%m/%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        )
        marks.setdefault("first", stamp)
        marks["last"] = stamp
        if "using stop words" in line:
            marks["model_loaded"] = stamp
        if "Start inferencing" in line:
            marks["inference_started"] = stamp
        elapsed = re.search(r"time elapsed:\s*([\d.]+)s", line)
        if elapsed:
            marks["task_elapsed_s"] = float(elapsed.group(1))
    return marks


def _import_cpu_seconds(statement: str) -> dict[str, float]:
    """Wall and CPU (user + system) seconds of a fresh ``.venv-opencompass`` python running ``statement``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([str(OC_PYTHON), "-c", statement], check=True, capture_output=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def run(problems: int, max_new_tokens: int) -> dict[str, Any]:
    from autorl.eval_config import EvalConfig
    from autorl.models.sources import resolve_model
    from autorl.tasks import get_task
    from autorl.tasks.base import read_problems
    from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
    from autorl_evaluator.settings import WorkerSettings

    with tempfile.TemporaryDirectory(prefix="oc-bench-") as tmp:
        home = Path(tmp)
        model = resolve_model("builtin:tiny-qwen2", home / "models")
        settings = WorkerSettings(
            home=home,
            eval_device="cpu",
            eval_max_new_tokens=max_new_tokens,
            opencompass_bin=OC_BIN,
            opencompass_keep_runs=True,
        )
        selected = read_problems(PROBLEMS)[:problems]
        started_at = time.time()
        started = time.monotonic()
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = OpenCompassBackend().evaluate(
            model, get_task("gsm8k"), selected, EvalConfig.record("gsm8k", settings), settings
        )
        total = time.monotonic() - started
        usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # Every process of the tree was waited for, so its CPU time is counted here: a figure that
        # holds on a busy machine, where wall time stretches with the load.
        tree_cpu = (usage_after.ru_utime - usage_before.ru_utime) + (
            usage_after.ru_stime - usage_before.ru_stime
        )
        finished_at = started_at + total

        run_dir = Path(str(result.details["run_dir"]))
        [oc_run] = [p for p in (run_dir / "work").iterdir() if p.is_dir()]
        year = datetime.fromtimestamp(started_at, UTC).year
        cli_ready = min(p.stat().st_mtime for p in (oc_run / "configs").iterdir())
        infer = _log_times(next((oc_run / "logs" / "infer").rglob("*.out")), year)
        evaluation = _log_times(next((oc_run / "logs" / "eval").rglob("*.out")), year)
        predictions = next((oc_run / "predictions").rglob("*.json")).stat().st_mtime
        results = next((oc_run / "results").rglob("*.json")).stat().st_mtime
        summary = next((oc_run / "summary").glob("*.csv")).stat().st_mtime
        launched = (run_dir / "config.py").stat().st_mtime
        # Log stamps are whole seconds: phases measured from them are good to about a second.
        phases = {
            "prepare_view_data_config_s": launched - started_at,
            "cli_import_and_config_s": cli_ready - launched,
            "infer_process_start_and_imports_s": infer["first"] - cli_ready,
            "infer_model_and_tokenizer_load_s": infer["model_loaded"] - infer["first"],
            "infer_dataset_and_prompts_s": infer["inference_started"] - infer["model_loaded"],
            "infer_generation_s": predictions - infer["inference_started"],
            "eval_process_start_and_imports_s": (results - predictions) - evaluation["task_elapsed_s"],
            "eval_scoring_s": evaluation["task_elapsed_s"],
            "summary_and_exit_s": summary - results,
            "parse_and_cleanup_s": finished_at - summary,
        }
    imports = {
        "opencompass_cli": _import_cpu_seconds("import opencompass.cli.main"),
        "torch_transformers": _import_cpu_seconds("import torch, transformers"),
    }
    return {
        "benchmark": "opencompass_cpu",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "model": "builtin:tiny-qwen2 (2 layers, hidden 64, float32)",
        "problems": problems,
        "max_new_tokens": max_new_tokens,
        "wall_s": round(total, 2),
        "opencompass_process_s": result.details["opencompass_seconds"],
        "process_tree_cpu_s": round(tree_cpu, 2),
        "phases_s": {name: round(value, 2) for name, value in phases.items()},
        "imports_per_process": imports,
        "score": result.scores,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=4, help="GSM8K-format problems to evaluate")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="generation limit per problem")
    args = parser.parse_args()
    report = run(args.problems, args.max_new_tokens)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
