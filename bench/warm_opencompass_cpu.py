"""The warm worker's OpenCompass against the ``opencompass`` command, side by side on the CPU.

One call, one model, one workload: the ``opencompass`` backend's ``evaluate`` on the builtin tiny
Qwen2 (``--problems`` GSM8K test problems in the real 4-shot prompt, ``--max-new-tokens`` each),
``--rounds`` evaluations of each variant one after another, as one worker process takes them:

- ``command``: the ``opencompass`` command (its tasks in its own process), OpenCompass's own transformers
  model in its inference process;
- ``warm``: the warm worker (``AUTORL_EVAL_WARM_WORKER``), each evaluation forked from the warm
  OpenCompass;
- ``command_resident`` / ``warm_resident``: the same two with the resident engine
  (``AUTORL_VLLM_PYTHON``, the transformers engine on the CPU): outside the warm worker each
  evaluation starts its own engine, in it the engine stays and takes each checkpoint in place.

A warm variant's first evaluation starts its server (and engine) and is reported apart. Short
answers keep generation small, as it is on a GPU, so the figures are the fixed cost around it.

Then the whole split (``split`` in the results): the 1,319 prompts OpenCompass renders for
bench/opencompass_vllm_gpu.py's problems, answered by a stand-in engine with the completions the
resident engine gave for the trained T2 on the H200, through the command, the warm OpenCompass,
and the warm OpenCompass as it was before its runs bounded the prompts' length check and copied
role tables plainly (``warm_counted``: every prompt tokenized, every copy by ``copy.deepcopy``)
and, further back, before they dumped their config unformatted (``warm_formatted``: mmengine's
yapf layout of each dump too): OpenCompass's own work around the engine (rendering, scoring,
summary) at the split's size, every variant's completions and score compared.
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
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "warm_opencompass_cpu.json"
DATA = REPO_ROOT / "tests" / "data"
VARIANTS = ("command", "warm", "command_resident", "warm_resident")


def time_variants(
    model: Path,
    problems: list[Any],
    settings: dict[str, Any],
    rounds: int,
    servers: dict[str, Path] | None = None,
) -> tuple[dict[str, list[float]], dict[str, float], dict[str, list[str]], dict[str, Any]]:
    """Each variant's evaluations one after another, as one worker process takes them (an evaluation
    outside the warm worker stops whatever a warm one kept): seconds per evaluation, a warm
    variant's first apart, each variant's completions and last result."""
    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends.opencompass import warm_opencompass
    from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
    from autorl_evaluator.backends.opencompass.resident_engine import ENGINES
    from autorl_evaluator.backends.opencompass.warm_opencompass import SERVERS

    task = get_task("gsm8k")
    backend = OpenCompassBackend()
    program = warm_opencompass.SERVER
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    first: dict[str, float] = {}
    completions: dict[str, list[str]] = {}
    last: dict[str, Any] = {}
    try:
        for name, worker in settings.items():
            # An earlier variant: the warm server's program as it was (``servers``), for it only.
            warm_opencompass.SERVER = (servers or {}).get(name, program)
            config = EvalConfig.record(task.name, worker)
            warm = worker.eval_warm_worker
            for index in range(rounds + (1 if warm else 0)):
                began = time.perf_counter()
                result = backend.evaluate(model, task, problems, config, worker)
                took = round(time.perf_counter() - began, 2)
                completions.setdefault(name, result.completions)
                last[name] = result
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
        warm_opencompass.SERVER = program
    return seconds, first, completions, last


SPLIT_TEXTS = REPO_ROOT / "bench" / "results" / "resident_engine_gpu.texts.json.gz"
#: On the split: the command, the warm OpenCompass, and the warm OpenCompass as it was before
#: (each its server's program with some of its changes to OpenCompass left out).
SPLIT_VARIANTS = ("command", "warm", "warm_counted", "warm_formatted")
#: The warm server's changes to OpenCompass each earlier variant leaves out: ``warm_counted``
#: tokenizes every prompt for its length check and deep-copies the role table as OpenCompass does;
#: ``warm_formatted`` also lays each config dump out with yapf (mmengine's own dump).
LEFT_OUT = {
    "warm_counted": ("length_checks_within_bounds", "plain_role_copies"),
    "warm_formatted": ("length_checks_within_bounds", "plain_role_copies", "unformatted_config_dumps"),
}
EARLIER_SERVER = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("compass_server", {server!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
for name in {left_out!r}:
    setattr(module, name, lambda: None)  # OpenCompass's own way
sys.exit(module.main())
"""


def earlier_servers(work: Path) -> dict[str, Path]:
    """The warm OpenCompass's program without the changes :data:`LEFT_OUT` names, per variant."""
    from autorl_evaluator.backends.opencompass import warm_opencompass

    servers = {}
    for name, left_out in LEFT_OUT.items():
        path = work / f"{name}_server" / "compass_server.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = EARLIER_SERVER.format(server=str(warm_opencompass.SERVER), left_out=left_out)
        path.write_text(text, encoding="utf-8")
        servers[name] = path
    return servers


def split_replay(root: Path, rounds: int) -> dict[str, Any]:
    """OpenCompass's own work around the engine on the whole split: the recorded 1,319 prompts of
    bench/opencompass_vllm_gpu.py, answered by the stand-in engine (``bench/vllm_replay``) with the
    completions the resident engine gave on the H200 for T2 (bench/resident_engine_gpu.py), through
    the command and through the warm OpenCompass; OpenCompass renders every prompt and scores every
    answer as in a real run."""
    import gzip
    from unittest import mock

    from autorl_evaluator.backends.opencompass import backend as backend_module
    from autorl_evaluator.backends.opencompass.resident_engine import ResidentEngine
    from autorl_evaluator.settings import WorkerSettings

    work = root / "split"
    common.record_prompts(work)
    with gzip.open(work / "carry" / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        prompts = json.load(handle)["prompts"]
    with gzip.open(SPLIT_TEXTS, "rt", encoding="utf-8") as handle:
        texts = json.load(handle)["resident_T2"]
    replay = work / "replay.json"
    replay.write_text(json.dumps({"completions": dict(zip(prompts, texts, strict=True))}), encoding="utf-8")

    def stand_in_environment(engine: ResidentEngine, env: Mapping[str, str]) -> dict[str, str]:
        # The stand-in takes the shim's place; the resident engine is started but never asked.
        del engine
        replaying = {"AUTORL_VLLM_REPLAY_MODE": "replay", "AUTORL_VLLM_REPLAY_FILE": str(replay)}
        return {**env, "PYTHONPATH": str(common.STAND_IN), **replaying}

    # The backend calls the shim_environment it imported from resident_engine: replaced in the backend module.
    with mock.patch.object(backend_module, "shim_environment", stand_in_environment):
        settings = {
            name: WorkerSettings(
                home=work / name,
                eval_device="cpu",
                opencompass_bin=common.OC_BIN,
                vllm_python=Path(sys.executable),
                eval_warm_worker=name.startswith("warm"),
            )
            for name in SPLIT_VARIANTS
        }
        seconds, first, completions, last = time_variants(
            common.stand_in_submission(work),
            common.evaluated_problems(),
            settings,
            rounds,
            earlier_servers(work),
        )
    medians = {name: round(statistics.median(values), 2) for name, values in seconds.items()}
    return {
        "prompts": len(prompts),
        "completions": "resident_T2 of bench/results/resident_engine_gpu.texts.json.gz (the H200's for T2)",
        "seconds": seconds,
        "median_s": medians,
        "first_evaluation_s": first,
        "command_over_warm": round(medians["command"] / medians["warm"], 2),
        "warm_counted_over_warm": round(medians["warm_counted"] / medians["warm"], 2),
        "warm_formatted_over_warm": round(medians["warm_formatted"] / medians["warm"], 2),
        "completions_are_the_gpus": all(completions[name] == texts for name in completions),
        "summary_accuracy": {name: result.details["summary_accuracy"] for name, result in last.items()},
        "same_scores": len({json.dumps(result.scores, sort_keys=True) for result in last.values()}) == 1,
        "opencompass_s": {name: result.details["opencompass_seconds"] for name, result in last.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    from autorl.models.sources import resolve_model
    from autorl.tasks import get_task
    from autorl_evaluator.settings import WorkerSettings

    root = Path(tempfile.mkdtemp(prefix="warm-opencompass-"))
    model = resolve_model("builtin:tiny-qwen2", root / "models")
    task = get_task("gsm8k")
    problems = task.load_test_problems(root / "data", source_dir=DATA, limit=args.problems)
    settings = {
        name: WorkerSettings(
            home=root / name,
            eval_device="cpu",
            opencompass_bin=common.OC_BIN,
            eval_max_new_tokens=args.max_new_tokens,
            eval_batch_size=args.problems,
            eval_warm_worker=name.startswith("warm"),
            vllm_python=Path(sys.executable) if name.endswith("resident") else None,
        )
        for name in VARIANTS
    }
    started_all = time.perf_counter()
    seconds, first, completions, _ = time_variants(model, problems, settings, args.rounds)
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
        "split": split_replay(root, args.rounds),
        "total_s": round(time.perf_counter() - started_all, 1),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report["median_s"]), json.dumps(report["ratios"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
