"""The ``opencompass`` backend's GPU path with vLLM 0.25 on one H200: prompts, engine, scores, time.

OpenCompass 0.5 pins ``numpy<2`` and needs ``transformers<5``; vLLM 0.25 (the release built for the
GPU machine's torch 2.11 + CUDA 13) needs neither, so the two cannot share one environment, and
OpenCompass's whole environment is more than the GPU machine can be sent. The run is therefore
cut where OpenCompass hands its prompts to vLLM (``VLLMwithChatTemplate`` calls ``LLM.generate``),
and each side runs where it can:

1. ``record`` (here, CPU): the worker's real ``OpenCompassBackend.evaluate`` (the view of the
   submission, the placement on GPU 0, the config it writes with ``VLLMwithChatTemplate``) runs
   OpenCompass from ``.venv-opencompass``; a stand-in ``vllm`` module (``bench/vllm_replay``)
   records what OpenCompass passes to the engine: the engine arguments from the config, the
   sampling parameters (greedy, 512 tokens, OpenCompass's stop words) and every prompt as
   OpenCompass rendered it with the checkpoint's chat template. Problems: the 16 GSM8K test
   problems of ``tests/data/gsm8k`` and 1,303 generated GSM8K-format problems
   (``autorl.tasks.arith``) — 1,319 in all, each in ``gsm8k_gen_1d7fe4``'s 4-shot prompt.
2. ``gpu`` (the H200, system python3 + vLLM 0.25 installed beside it): a Qwen2.5-1.5B-architecture
   checkpoint (random bf16 weights drawn from a seed; the view's config and locally built
   Qwen2-format tokenizer) is served by ``vllm serve`` with the recorded engine arguments (the
   issue's design B: the engine in its own environment, prompts over its OpenAI-compatible API),
   and the recorded prompts are sent all at once; bare offline ``LLM.generate`` on the same
   prompts is the reference in the same run. Also bench/hf_generation_gpu.py's workload (1,319
   random-id prompts, 1,441 shared prefix ids; 512 new tokens per row or GSM8K answer lengths).
3. ``replay`` (here): the worker's ``evaluate`` runs again and the stand-in answers each prompt
   with the completion the GPU server gave for it: OpenCompass writes its predictions, scores them
   with its own ``gsm8k_postprocess`` + ``Gsm8kEvaluator``, writes its summary, and the worker
   parses it as after any run.

    .venv/bin/python bench/opencompass_vllm_gpu.py record --work .vllm-parts/oc
    # on the GPU machine, with .vllm-parts/oc/carry carried and vLLM 0.25 with
    # bench/data/vllm-0.25-serve-wheels.txt installed in /root/site (pip --no-deps --target):
    PYTHONPATH=/root/site:.:bench VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/opencompass_vllm_gpu.py gpu \\
        --inputs .vllm-parts/oc/carry --out OUT
    .venv/bin/python bench/opencompass_vllm_gpu.py replay --gpu OUT [OUT ...]

``gpu`` writes ``OUT/result.json`` after every variant and ``OUT/completions.json.gz`` at the end;
its variants (``--only``) can run in consecutive calls on one warm machine, each with its own
``OUT``. ``replay`` merges those folders (a variant met twice becomes ``NAME_run2``), adds the
answer agreement and the worker's reading of each variant's completions, and writes
``bench/results/opencompass_vllm_gpu.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "opencompass_vllm_gpu.json"
PORT = 8765


# --------------------------------------------------------------------------- here (CPU)


def merge(folders: list[Path]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """One report from the ``gpu`` step's folders (consecutive calls on one warm machine): each
    variant once, a repeated one as ``NAME_run2``; the completions of the recorded prompts by variant."""
    report: dict[str, Any] = {"calls": [], "variants": {}}
    completions: dict[str, list[str]] = {}
    for folder in folders:
        result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
        with gzip.open(folder / "completions.json.gz", "rt", encoding="utf-8") as handle:
            texts = json.load(handle)
        for key in ("benchmark", "environment", "model", "workloads", "model_build"):
            report.setdefault(key, result[key])
        names = []
        for name, variant in result["variants"].items():
            if variant.get("status") != "ok":
                continue
            label = name if name not in report["variants"] else f"{name}_run2"
            report["variants"][label] = variant
            if name in texts:
                completions[label] = texts[name]
            names.append(label)
        report["calls"].append({"date": result["date"], "command": result["command"], "variants": names})
    return report, completions


def agreement(reference: list[str], other: list[str]) -> dict[str, Any]:
    """Identical completions, equal extracted final answers, and the mean identical leading characters."""
    from autorl.tasks.gsm8k import opencompass_postprocess

    pairs = list(zip(reference, other, strict=True))
    leading = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for a, b in pairs
    ]
    finals = [(opencompass_postprocess(a), opencompass_postprocess(b)) for a, b in pairs]
    return {
        "rows": len(pairs),
        "identical_completions": sum(a == b for a, b in pairs),
        "equal_final_answers": sum(a == b for a, b in finals),
        # Garbage text often holds no number at all: equal because both are "NULL".
        "equal_final_answers_both_empty": sum(a == b == "NULL" for a, b in finals),
        "mean_identical_leading_chars": round(sum(leading) / len(leading), 1),
    }


def replay(work: Path, folders: list[Path], output: Path) -> int:
    from autorl.tasks import get_task

    work = work.resolve()
    report, completions = merge(folders)
    with gzip.open(work / "carry" / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    prompts = recorded["prompts"]
    task = get_task("gsm8k")
    answers = [problem.answer for problem in common.evaluated_problems()]
    real = sum(1 for _ in common.REAL_PROBLEMS.open(encoding="utf-8"))
    report["recorded"] = {
        "prompts": len(prompts),
        "problems": f"{real} GSM8K test problems (tests/data/gsm8k) + {common.SPLIT_SIZE - real} generated "
        "GSM8K-format problems (autorl.tasks.arith), in gsm8k_gen_1d7fe4's 4-shot prompt",
        "engine_kwargs": recorded["engine_kwargs"],
        "sampling_kwargs": recorded["sampling_kwargs"],
        "worker_details": recorded["worker_details"],
        "record_seconds": recorded["record_seconds"],
        "config_py": recorded["config_py"],
        "command": ".venv/bin/python bench/opencompass_vllm_gpu.py record",
    }
    report["replay"] = {}
    for name, texts in completions.items():
        replay_file = work / f"replay-{name}.json"
        replay_file.write_text(
            json.dumps({"completions": dict(zip(prompts, texts, strict=True))}), encoding="utf-8"
        )
        result, seconds = common.evaluate_with_stand_in(work, "replay", replay_file)
        replay_file.unlink()
        summary = float(result.details["summary_accuracy"])
        report["replay"][name] = {
            "worker_seconds": round(seconds, 1),
            "completions_equal_gpu": result.completions == texts,
            "summary_accuracy": summary,
            "scores": result.scores,
            # OpenCompass's summary holds the accuracy rounded to 2 decimals.
            "recomputed_here": task.score(texts, answers)["opencompass"],
            "summary_equals_recomputed": summary == round(task.score(texts, answers)["opencompass"], 2),
        }
        common.log(f"replay {name}: {report['replay'][name]}")
    reference = completions.get("bare_llm_graphs")
    report["agreement_with_bare"] = {
        name: agreement(reference, texts)
        for name, texts in completions.items()
        if reference is not None and name != "bare_llm_graphs"
    }
    if "serve_graphs" in completions and "serve_graphs_run2" in completions:
        report["agreement_serve_graphs_runs"] = agreement(
            completions["serve_graphs"], completions["serve_graphs_run2"]
        )
    report["replay_command"] = ".venv/bin/python bench/opencompass_vllm_gpu.py " + " ".join(sys.argv[1:])
    report["date"] = f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


# --------------------------------------------------------------------------- on the GPU machine


def offline(args: argparse.Namespace) -> int:
    """Bare vLLM in this process: ``LLM.generate`` on the recorded prompts and the id workload."""
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    recorded, prompts, stops = common.load_workload(Path(args.inputs), spec["seed"])
    began = time.perf_counter()
    llm = LLM(spec["model"], **spec["engine_kwargs"])
    result: dict[str, Any] = {"startup_s": round(time.perf_counter() - began, 2), "runs": {}}
    outputs: dict[str, Any] = {}
    sampling = SamplingParams(**recorded["sampling_kwargs"])
    calls: tuple[tuple[str, Callable[[], list[Any]]], ...] = (
        ("opencompass_prompts", lambda: llm.generate(recorded["prompts"], sampling, use_tqdm=False)),
        (
            "ids_stop",
            lambda: llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                [SamplingParams(temperature=0.0, max_tokens=s, ignore_eos=True) for s in stops],
                use_tqdm=False,
            ),
        ),
        (
            "ids_full",
            lambda: llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True),
                use_tqdm=False,
            ),
        ),
    )
    for name, call in calls:
        started = time.perf_counter()
        out = call()
        seconds = time.perf_counter() - started
        result["runs"][name] = {
            "seconds": round(seconds, 2),
            "new_tokens": sum(len(o.outputs[0].token_ids) for o in out),
        }
        outputs[name] = [
            o.outputs[0].text if name == "opencompass_prompts" else list(o.outputs[0].token_ids) for o in out
        ]
        common.log(f"offline {name}: {result['runs'][name]}")
    Path(args.result).write_text(json.dumps({"result": result, "outputs": outputs}), encoding="utf-8")
    return 0


#: A vLLM log line's process and time: ``(EngineCore pid=1675) INFO 12-04 03:27:10 [core.py:114] ...``.
LOG_LINE = re.compile(r"^\((?P<process>\w+) pid=\d+\) \w+ \d\d-\d\d (?P<time>\d\d:\d\d:\d\d) ")


def startup_phases(log_text: str, startup_s: float) -> dict[str, float]:
    """Where ``vllm serve``'s start went, from its log's whole-second stamps: the API server's
    process until its first line (its imports; from the launch, ``startup_s`` minus the rest), the
    engine core's process start, the worker's, the engine's initialisation (weights, compilation,
    graphs, warm-up) and the API server's last steps until it serves."""
    first: dict[str, float] = {}
    engine_ready = serving = None
    for line in log_text.splitlines():
        match = LOG_LINE.match(line)
        if not match:
            continue
        hours, minutes, seconds = (int(part) for part in match["time"].split(":"))
        stamp = float(hours * 3600 + minutes * 60 + seconds)
        first.setdefault(match["process"], stamp)
        if engine_ready is None and "init engine (profile" in line:
            engine_ready = stamp
        if serving is None and "Starting vLLM server" in line:
            serving = stamp
    api, core, worker = first["APIServer"], first["EngineCore"], first["Worker"]
    assert engine_ready is not None and serving is not None
    return {
        "api_server_process_until_first_log": round(startup_s - (serving - api), 1),
        "engine_core_process_start": core - api,
        "worker_process_start": worker - core,
        "engine_initialisation": engine_ready - worker,
        "api_server_until_serving": serving - engine_ready,
    }


def _server_flags(engine: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for the engine arguments OpenCompass's config gives ``LLM``."""
    flags: list[str] = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                flags.append(flag)
        else:
            flags += [flag, str(value)]
    return flags


async def _send(requests: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with session.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body) as answer:
                answer.raise_for_status()
                return dict(await answer.json())

        started = time.perf_counter()
        answers = await asyncio.gather(*(one(body) for body in requests))
        return list(answers), time.perf_counter() - started


def serve(
    name: str,
    model: Path,
    engine: dict[str, Any],
    recorded: dict[str, Any],
    prompts: list[list[int]],
    stops: list[int],
    runs: list[str],
    logs: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model),
        "--port",
        str(PORT),
        "--served-model-name",
        "submission",
        "--disable-uvicorn-access-log",
        *_server_flags(engine),
    ]
    common.log(f"server {name}: {' '.join(command)}")
    began = time.perf_counter()
    with (logs / f"server-{name}.log").open("w") as handle:
        server = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    result: dict[str, Any] = {"command": " ".join(["vllm", *command[3:]]), "runs": {}}
    outputs: dict[str, Any] = {}
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - began > 300:
                raise RuntimeError("vllm serve did not answer /health within 300 s")
            time.sleep(0.25)
        result["startup_s"] = round(time.perf_counter() - began, 2)
        result["startup_phases_s"] = startup_phases(
            (logs / f"server-{name}.log").read_text(encoding="utf-8", errors="replace"), result["startup_s"]
        )
        common.log(f"server {name} up in {result['startup_s']} s: {result['startup_phases_s']}")
        sampling = dict(recorded["sampling_kwargs"])
        requests = {
            "opencompass_prompts": [
                {"model": "submission", "prompt": p, **sampling} for p in recorded["prompts"]
            ],
            "ids_stop": [
                {"model": "submission", "prompt": p, "max_tokens": s, "temperature": 0.0, "ignore_eos": True}
                for p, s in zip(prompts, stops, strict=True)
            ],
            "ids_full": [
                {
                    "model": "submission",
                    "prompt": p,
                    "max_tokens": 512,
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
                for p in prompts
            ],
        }
        for run in runs:
            answers, seconds = asyncio.run(_send(requests[run]))
            result["runs"][run] = {
                "seconds": round(seconds, 2),
                "new_tokens": sum(a["usage"]["completion_tokens"] for a in answers),
                "requests": len(answers),
            }
            outputs[run] = [a["choices"][0]["text"] for a in answers]
            common.log(f"server {name} {run}: {result['runs'][run]}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return result, outputs


def gpu(args: argparse.Namespace) -> int:
    import torch
    import vllm

    began = time.perf_counter()
    inputs, out = Path(args.inputs).resolve(), Path(args.out)
    model = Path(args.model)
    recorded, prompts, stops = common.load_workload(inputs, args.seed)
    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "benchmark": "opencompass_vllm_gpu",
        "date": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "command": f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} "
        f"VLLM_USE_FLASHINFER_SAMPLER={os.environ.get('VLLM_USE_FLASHINFER_SAMPLER', '')} "
        f"python3 bench/opencompass_vllm_gpu.py {' '.join(sys.argv[1:])}".replace(str(out), "$OUT"),
        "environment": {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__,
            "vllm": vllm.__version__,
            "python": platform.python_version(),
        },
        "model": f"Qwen2.5-1.5B architecture, random bf16 weights (seed {args.seed}), "
        "Qwen2-format tokenizer built locally",
        "workloads": {
            "opencompass_prompts": f"the {len(recorded['prompts'])} prompts OpenCompass rendered, "
            f"its sampling parameters {recorded['sampling_kwargs']}",
            "ids_stop": "bench/hf_generation_gpu.py's 1,319 random-id prompts (1,441 shared prefix ids), "
            f"GSM8K answer lengths (mean {sum(stops) / len(stops):.1f} new tokens), end-of-text ignored",
            "ids_full": "the same prompts, 512 new tokens each",
        },
        "variants": {},
    }

    def write() -> None:
        (out / "result.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    common.log("building the model")
    started = time.perf_counter()
    report["model_build"] = common.build_view_checkpoint(inputs, model, args.seed)
    report["model_build"]["seconds"] = round(time.perf_counter() - started, 1)
    completions: dict[str, list[str]] = {}
    worker_engine = dict(recorded["engine_kwargs"])
    fast = {**worker_engine, "enforce_eager": False, "enable_prefix_caching": True, "max_num_seqs": 512}
    plan: list[tuple[str, str, dict[str, Any], list[str]]] = [
        ("bare_llm_graphs", "offline", fast, ["opencompass_prompts", "ids_stop", "ids_full"]),
        ("serve_graphs", "serve", fast, ["opencompass_prompts", "ids_stop", "ids_full"]),
        ("serve_worker_config", "serve", worker_engine, ["opencompass_prompts", "ids_stop", "ids_full"]),
        # What VLLMwithChatTemplate does with the worker's config: LLM(path, **model_kwargs), one
        # generate call with every prompt.
        ("bare_llm_worker_config", "offline", worker_engine, ["opencompass_prompts", "ids_stop", "ids_full"]),
    ]
    for name, kind, engine, runs in plan:
        if args.only and name not in args.only:
            continue
        if time.perf_counter() - began > args.deadline_s:
            report["variants"][name] = {"status": "skipped (deadline)"}
            continue
        try:
            if kind == "offline":
                started = time.perf_counter()
                found, outs = common.offline_child(inputs, model, engine, args.seed, out, timeout_s=420)
                record_ = {
                    "status": "ok",
                    "engine_kwargs": engine,
                    **found,
                    "process_s": round(time.perf_counter() - started, 2),
                }
            else:
                record_, outs = serve(name, model, engine, recorded, prompts, stops, runs, out)
                record_ = {"status": "ok", "engine_kwargs": engine, **record_}
        except Exception as exc:  # a failed variant is a result too
            record_, outs = {"status": "failed", "error": f"{type(exc).__name__}: {str(exc)[:500]}"}, {}
        report["variants"][name] = record_
        if "opencompass_prompts" in outs:
            completions[name] = outs["opencompass_prompts"]
        for run in ("ids_stop", "ids_full"):
            if run in outs:
                completions[f"{name}:{run}"] = outs[run]
        common.log(f"{name}: {record_}")
        write()

    # Answer agreement: every variant's texts against bare vLLM's on the same prompts.
    agreement: dict[str, Any] = {}
    reference = completions.get("bare_llm_graphs")
    for name, texts in completions.items():
        if ":" in name or reference is None or name == "bare_llm_graphs":
            continue
        agreement[name] = {
            "rows": len(texts),
            "identical_to_bare": sum(a == b for a, b in zip(reference, texts, strict=True)),
        }
    report["agreement_opencompass_prompts"] = agreement
    report["total_s"] = round(time.perf_counter() - began, 1)
    write()
    texts_only = {name: texts for name, texts in completions.items() if ":" not in name}
    with gzip.open(out / "completions.json.gz", "wt", encoding="utf-8") as handle:
        json.dump(texts_only, handle)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("record")
    p.add_argument("--work", type=Path, default=REPO_ROOT / ".vllm-parts" / "oc")
    p = sub.add_parser("replay")
    p.add_argument("--work", type=Path, default=REPO_ROOT / ".vllm-parts" / "oc")
    p.add_argument("--gpu", type=Path, nargs="+", required=True, help="the gpu step's output folders")
    p.add_argument("--output", type=Path, default=RESULTS)
    p = sub.add_parser("gpu")
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="/root/model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=420.0)
    p.add_argument("--only", nargs="*", default=None)
    p = sub.add_parser("offline")
    p.add_argument("--inputs", required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--result", required=True)
    args = parser.parse_args()
    if args.step == "record":
        return common.record_prompts(args.work)
    if args.step == "replay":
        return replay(args.work, args.gpu, args.output)
    if args.step == "gpu":
        return gpu(args)
    return offline(args)


if __name__ == "__main__":
    raise SystemExit(main())
