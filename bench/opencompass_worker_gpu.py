"""The ``opencompass`` backend end to end on one GPU: OpenCompass and vLLM, submit to score.

What a GPU evaluator worker runs, all of it on the GPU machine: OpenCompass 0.5.2 in an environment
of its own (the OpenCompass side of ``docker/evaluator-worker.lock``), the resident vLLM engine in
another (vLLM 0.25, ``AUTORL_VLLM_PYTHON``), and the worker's own code between them. For each
submission: the grader's snapshot (``autorl.checkpoints.snapshot.snapshot_submission``: the checks
and the copy of the weights beside the base model's files), then the worker's
``OpenCompassBackend.evaluate`` on the snapshot (the view, the placement on GPU 0, the config it
writes, OpenCompass's prompts, the engine, OpenCompass's scoring and summary, the worker's parsing).
Checkpoints: ``T1`` and ``T2`` of ``bench/resident_engine_gpu.py --phase prepare`` (the
Qwen2.5-1.5B architecture fine-tuned there so that it answers and stops), base ``A``; problems: the
recorded split of ``bench/opencompass_vllm_gpu.py`` (1,319 in gsm8k_gen_1d7fe4's 4-shot prompt).

``run`` (OpenCompass's Python, our packages on ``PYTHONPATH``), in one process as the warm worker's
child evaluates:

1. the warm worker (``AUTORL_EVAL_WARM_WORKER``): T2 (the warm OpenCompass and the engine start),
   T1 and T2 again (each forked from the warm OpenCompass, weights loaded into the engine in place);
2. the worker outside the warm worker: T2 through the ``opencompass`` command (its tasks in its own process)
   and an engine started for that evaluation.

``in-process`` (the engine's Python): the ``hf`` backend's engine on the same prompts and T2.
``bare`` (the engine's Python, after ``run``): vLLM called directly with the resident engine's
arguments (from its log) on T2 and the same prompts: what OpenCompass and the worker add to the
engine's generation, measured on the same machine in the same call. Every run also records the
engine's own generation time (its log's ``engine generate`` line). Each phase keeps its results in
a file of its own (``--keep``, by default ``WORK/results``: outside the device call's output folder,
which each call starts empty) and writes ``--output`` anew from every phase kept there, with the
answer agreement between every T2 run; a phase run again replaces only its own file.

    # on the GPU machine: OpenCompass's wheels in a venv of the machine's python3
    # (tools/gpu_evaluator_parts.py: its install.sh), vLLM 0.25 in /root/site, /root/resident prepared
    PYTHONPATH=.:services/evaluator-worker /root/oc/bin/python bench/opencompass_worker_gpu.py run \\
        --work /root/resident --opencompass-bin /root/oc/bin/opencompass --vllm-python /root/vllm-python \\
        --output $OUT/opencompass_worker_gpu.json
    PYTHONPATH=/root/site:. python3 bench/opencompass_worker_gpu.py in-process --work /root/resident \\
        --output $OUT/opencompass_worker_gpu.json
    PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/opencompass_worker_gpu.py bare \\
        --work /root/resident --output $OUT/opencompass_worker_gpu.json
    .venv/bin/python bench/opencompass_worker_gpu.py --smoke run ...   # the CPU check, here
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "opencompass_worker_gpu.json"
#: Packages of OpenCompass's environment the run reports (what it imported them as).
OPENCOMPASS_PACKAGES = ("opencompass", "transformers", "numpy", "torch", "datasets", "tokenizers", "pandas")


def texts_path(output: Path) -> Path:
    return output.with_name(output.name.removesuffix(".json") + ".texts.json.gz")


#: The phases, in the order their results are joined.
PHASES = ("run", "in-process", "bare")


def phase_path(keep: Path, phase: str) -> Path:
    """Where ``phase`` keeps its own results (no other phase writes there)."""
    return keep / f"opencompass_worker_gpu.{phase}.json"


def load_output(output: Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    result: dict[str, Any] = json.loads(output.read_text(encoding="utf-8")) if output.exists() else {}
    texts: dict[str, list[str]] = {}
    if texts_path(output).exists():
        with gzip.open(texts_path(output), "rt", encoding="utf-8") as handle:
            texts = json.load(handle)
    return result, texts


def save_output(output: Path, result: dict[str, Any], texts: dict[str, list[str]]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    with gzip.open(texts_path(output), "wt", encoding="utf-8") as handle:
        json.dump(texts, handle)


def joined(keep: Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Every phase's results kept in ``keep`` as one results file: ``run``'s, then the runs of the
    others added, and the agreement of all T2 runs."""
    result: dict[str, Any] = {}
    texts: dict[str, list[str]] = {}
    for phase in PHASES:
        part, part_texts = load_output(phase_path(keep, phase))
        if not part:
            continue
        runs = {**result.get("runs", {}), **part.pop("runs", {})}
        result = {**part, **result, "runs": runs} if result else {**part, "runs": runs}
        texts.update(part_texts)
    result["agreement"] = agreements(texts)
    return result, texts


def save_phase(
    args: argparse.Namespace, phase: str, result: dict[str, Any], texts: dict[str, list[str]]
) -> None:
    """``phase``'s own file in ``--keep``, then ``--output`` written anew from every phase kept."""
    save_output(phase_path(args.keep, phase), result, texts)
    save_output(args.output, *joined(args.keep))


def engine_versions(python: Path) -> dict[str, Any]:
    script = (
        "import json, importlib.metadata as m\n"
        "print(json.dumps({n: m.version(n) for n in ('vllm', 'torch', 'transformers', 'numpy')}))"
    )
    try:
        found: dict[str, Any] = json.loads(
            subprocess.run(
                [str(python), "-c", script], capture_output=True, text=True, check=True, timeout=120
            ).stdout
        )
    except (subprocess.SubprocessError, ValueError) as exc:
        found = {"error": str(exc)[-500:]}
    return found


def submit_folder(workspace: Path, checkpoint: Path, name: str) -> str:
    """The agent's output folder holding ``checkpoint`` as ``output/<name>`` (weights hard-linked)."""
    target = workspace / "output" / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file():
            if path.suffix == ".safetensors":
                os.link(path, target / path.name)
            else:
                shutil.copyfile(path, target / path.name)
    return f"output/{name}"


def engine_log(log_path: Path, kind: str) -> list[str]:
    """The engine log's ``engine <kind> ...`` lines (load, start, generate), oldest first."""
    if not log_path.exists():
        return []
    return re.findall(rf"engine {kind} .*", log_path.read_text(encoding="utf-8", errors="replace"))


def engine_generate_s(lines: list[str]) -> float | None:
    """The seconds of the last ``engine generate`` line: the engine's share of an evaluation."""
    found = re.search(r"seconds=([\d.]+)", lines[-1]) if lines else None
    return float(found.group(1)) if found else None


def run(args: argparse.Namespace) -> int:
    from autorl.checkpoints.snapshot import remove_snapshot, snapshot_submission
    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
    from autorl_evaluator.backends.opencompass.resident_engine import ENGINES
    from autorl_evaluator.backends.opencompass.warm_opencompass import SERVERS
    from autorl_evaluator.settings import WorkerSettings
    from autorl_evaluator.versions import installed_versions

    work = args.work.resolve()
    task = get_task("gsm8k")
    split = split_problems(args)
    base = work / "A"
    root = work / "worker"
    shutil.rmtree(root, ignore_errors=True)
    workspace = root / "workspace"
    snapshots = root / "snapshots"
    if not args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    shared = {
        "home": root / "home",
        "eval_device": "cpu" if args.smoke else "cuda",
        "opencompass_bin": args.opencompass_bin,
        "vllm_python": args.vllm_python,
    }
    warm = WorkerSettings(**shared, eval_warm_worker=True)
    cold = WorkerSettings(**shared, eval_warm_worker=False)
    texts: dict[str, list[str]] = {}
    result: dict[str, Any] = {}
    result.update(
        {
            "benchmark": "opencompass_worker_gpu",
            "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
            "command": " ".join(sys.argv),
            "environment": {
                "python": platform.python_version(),
                "machine": gpu_name(),
                "opencompass_environment": installed_versions(OPENCOMPASS_PACKAGES, None),
                "engine_environment": engine_versions(args.vllm_python),
            },
            "problems": len(split),
            "runs": {},
        }
    )
    backend = OpenCompassBackend()
    log_path = root / "home" / "eval" / "opencompass" / "engine.log"
    plan = [
        ("warm_T2_first", warm, "T2"),
        ("warm_T1", warm, "T1"),
        ("warm_T2", warm, "T2"),
        ("command_T2", cold, "T2"),
    ]
    try:
        for label, settings, checkpoint in plan:
            if not settings.eval_warm_worker:
                # Outside the warm worker nothing is kept: the evaluation starts its own engine.
                SERVERS.stop()
                ENGINES.stop()
            submitted = submit_folder(workspace, work / checkpoint, checkpoint)
            started = time.perf_counter()
            snapshot = snapshot_submission(
                submitted,
                workspace=workspace,
                output_dir=workspace / "output",
                base_model_dir=base,
                snapshot_root=snapshots,
            )
            snapshotted = time.perf_counter()
            config = EvalConfig.record(task.name, settings)
            evaluated = backend.evaluate(snapshot.path, task, split, config, settings)
            done = time.perf_counter()
            remove_snapshot(snapshot.path)
            texts[label] = evaluated.completions
            result["runs"][label] = {
                "checkpoint": checkpoint,
                "warm_worker": settings.eval_warm_worker,
                "opencompass_process": evaluated.details["opencompass_process"],
                "snapshot_s": round(snapshotted - started, 2),
                "evaluate_s": round(done - snapshotted, 2),
                "submit_to_score_s": round(done - started, 2),
                "opencompass_s": evaluated.details["opencompass_seconds"],
                "summary_accuracy": evaluated.details["summary_accuracy"],
                "scores": evaluated.scores,
                "engine_loads": engine_log(log_path, "load")[-1:],
                "engine_generate_s": engine_generate_s(engine_log(log_path, "generate")),
            }
            if settings.eval_warm_worker and engine_log(log_path, "start"):
                result["engine_kwargs"] = json.loads(engine_log(log_path, "start")[-1].split("=", 1)[1])
            common.log(f"{label}: {result['runs'][label]}")
            save_phase(args, "run", result, texts)
    finally:
        SERVERS.stop()
        ENGINES.stop()
    save_phase(args, "run", result, texts)
    return 0


def split_problems(args: argparse.Namespace) -> list[Any]:
    if not args.smoke:
        return common.evaluated_problems()
    from autorl.tasks import get_task

    source = REPO_ROOT / "tests" / "data"
    return list(get_task("gsm8k").load_test_problems(args.work / "data", source_dir=source, limit=4))


def gpu_name() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "cpu"


def in_process(args: argparse.Namespace) -> int:
    """The ``hf`` backend's engine on the recorded prompts and T2 (bench/resident_engine_gpu.py's)."""
    work = args.work.resolve()
    view = work / "in-process-view"
    common.copy_view(work / "T2", view)
    if not (view / "model.safetensors").exists():
        os.link(work / "T2" / "model.safetensors", view / "model.safetensors")
    recorded = common.read_recorded(work)
    answered = common.hf_engine_answers(view, recorded)
    texts = {"in_process_T2": answered.pop("texts")}
    result = {
        "in_process_command": " ".join(sys.argv),
        "runs": {"in_process_T2": {"checkpoint": "T2", **answered}},
    }
    common.log(f"in-process T2: {answered}")
    save_phase(args, "in-process", result, texts)
    return 0


def bare(args: argparse.Namespace) -> int:
    """vLLM called directly in this process, with the engine arguments the warm worker's resident
    engine was started with (``run``'s record of its log), on T2 and the same prompts and sampling:
    its start and two generations of the split, beside the warm worker's OpenCompass time."""
    work = args.work.resolve()
    ran, _ = load_output(phase_path(args.keep, "run"))
    kwargs = ran.get("engine_kwargs")
    if not kwargs:
        raise SystemExit(
            f"no {phase_path(args.keep, 'run')} with the resident engine's arguments: run the `run` phase "
            "first with the same --keep"
        )
    recorded = common.read_recorded(work)
    engines = common.load_file_module("autorl_engine_server", common.SERVER).ENGINES
    started = time.perf_counter()
    engine = engines["transformers" if args.smoke else "vllm"](work / "T2", kwargs)
    start_s = round(time.perf_counter() - started, 2)
    generated: list[float] = []
    for _ in range(2):
        began = time.perf_counter()
        answered = engine.generate(recorded["prompts"], dict(recorded["sampling_kwargs"]))
        generated.append(round(time.perf_counter() - began, 2))
    run: dict[str, Any] = {"checkpoint": "T2", "start_s": start_s, "generate_s": generated}
    warm = ran.get("runs", {}).get("warm_T2")
    if warm is not None:
        run["opencompass_over_bare"] = round(warm["opencompass_s"] / generated[-1], 2)
    result = {"bare_command": " ".join(sys.argv), "runs": {"bare_vllm_T2": run}}
    common.log(f"bare vLLM T2: {run}")
    save_phase(args, "bare", result, {"bare_vllm_T2": answered})
    return 0


def agreements(texts: dict[str, list[str]]) -> dict[str, Any]:
    """Every T2 run against the warm worker's T2 (identical text, equal final answers)."""
    reference = texts.get("warm_T2")
    if reference is None:
        return {}
    return {
        name: common.agreement(reference, other)
        for name, other in texts.items()
        if name != "warm_T2" and name.endswith("T2") and len(other) == len(reference)
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("run", "in-process", "bare"))
    parser.add_argument(
        "--work", type=Path, required=True, help="resident_engine_gpu.py's --work (A, T1, T2)"
    )
    parser.add_argument(
        "--opencompass-bin", type=Path, default=REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"
    )
    parser.add_argument("--vllm-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--output", type=Path, default=RESULTS, help="every kept phase's results, joined")
    parser.add_argument(
        "--keep",
        type=Path,
        help="where each phase keeps its own file (opencompass_worker_gpu.PHASE.json) across calls; "
        "by default WORK/results",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="the CPU check: the transformers engine, 4 problems"
    )
    args = parser.parse_args()
    args.keep = args.keep or args.work / "results"
    return {"run": run, "in-process": in_process, "bare": bare}[args.phase](args)


if __name__ == "__main__":
    sys.exit(main())
