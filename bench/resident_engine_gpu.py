"""The evaluator's resident engine on one GPU: the worker's own server and OpenCompass's side of it.

``AUTORL_VLLM_PYTHON`` makes the ``opencompass`` backend hand generation to a resident engine
(services/evaluator-worker/.../opencompass/engine_server.py) that OpenCompass reaches through the
worker's ``vllm`` shim (engine_shim/vllm). This runs those two files as they run in production, on
vLLM 0.25 and one H200: the server in its own process (the worker's settings for it:
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), the shim loaded in this process as OpenCompass loads it,
called as ``VLLMwithChatTemplate`` calls it: ``LLM(view, **model_kwargs)`` with the model keyword
arguments of the config the worker writes, then ``generate(prompts, SamplingParams(**kwargs))``
with OpenCompass's own 1,319 rendered prompts and sampling parameters (recorded on the CPU by
``bench/opencompass_vllm_gpu.py record``: 16 GSM8K test problems and 1,303 generated ones in
``gsm8k_gen_1d7fe4``'s 4-shot prompt). Checkpoints: the Qwen2.5-1.5B architecture with the view's
config and tokenizer, random bf16 weights drawn from seed 0 (``A``) and seed 1 (``B``).

One engine serves ``A`` (its start, then the split), then ``B`` and ``A`` again, each loaded into it
in place: seconds from ``LLM(...)`` (the load request) to the last answer, as the warm worker spends
them per submission. Then a second, fresh engine serves ``B``: its answers against the resident
engine's answers for ``B``, and, as the floor of what two runs agree on, the resident engine's first
answers for ``A`` against its answers for ``A`` after ``B``.

    # on the GPU machine, vLLM 0.25 and its wheels (../shared/gpu) in /root/site,
    # .vllm-parts/oc/carry (bench/opencompass_vllm_gpu.py record) carried:
    PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/resident_engine_gpu.py \\
        --inputs .vllm-parts/oc/carry --output $OUT/resident_engine_gpu.json
    # here, a check of the script on the CPU (the transformers engine, a tiny model):
    .venv/bin/python bench/resident_engine_gpu.py --smoke

Writes ``bench/results/resident_engine_gpu.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIR = REPO_ROOT / "services/evaluator-worker/autorl_evaluator/backends/opencompass"
SERVER = ENGINE_DIR / "engine_server.py"
SHIM = ENGINE_DIR / "engine_shim" / "vllm" / "__init__.py"
RESULTS = REPO_ROOT / "bench" / "results" / "resident_engine_gpu.json"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def environment() -> dict[str, Any]:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from grpo_trl_vllm_gpu import environment as described

    found: dict[str, Any] = described()
    return found


def load_shim() -> ModuleType:
    """The shim as OpenCompass imports it (here under another name: the real vllm is beside it)."""
    spec = importlib.util.spec_from_file_location("autorl_engine_shim", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Server:
    """The worker's engine server, started as the worker starts it."""

    def __init__(self, engine: str, log_path: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="autorl-engine-"))
        self.socket = self.folder / "engine.sock"
        env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.log = log_path.open("ab")
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "--socket", str(self.socket), "--engine", engine],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while not self.socket.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)
        self.listening_s = round(time.perf_counter() - started, 2)

    def stop(self) -> None:
        """As the worker stops it: the whole group (the engine's own processes too), SIGKILL after a
        grace period, and then a moment for the GPU memory to be given back."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        time.sleep(3)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def serve_once(shim: ModuleType, server: Server, view: Path, recorded: dict[str, Any]) -> dict[str, Any]:
    """What one evaluation asks of the engine: ``LLM(view, **kwargs)``, then one ``generate``."""
    os.environ["AUTORL_ENGINE_SOCKET"] = str(server.socket)
    started = time.perf_counter()
    llm = shim.LLM(str(view), **recorded["engine_kwargs"])
    loaded = time.perf_counter()
    outputs = llm.generate(recorded["prompts"], shim.SamplingParams(**recorded["sampling_kwargs"]))
    done = time.perf_counter()
    return {
        "reused": bool(llm.loaded["reused"]),
        "load_s": round(loaded - started, 2),
        "generate_s": round(done - loaded, 2),
        "checkpoint_to_answers_s": round(done - started, 2),
        "texts": [output.outputs[0].text for output in outputs],
    }


def agreement(first: list[str], second: list[str]) -> dict[str, Any]:
    identical = sum(a == b for a, b in zip(first, second, strict=True))
    return {"rows": len(first), "identical": identical, "identical_share": round(identical / len(first), 4)}


def smoke_inputs(work: Path) -> tuple[dict[str, Any], Path, Path]:
    """A tiny model (two weight draws) and a few prompts, for the CPU check of this script."""
    import torch
    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(REPO_ROOT))
    from autorl.models.sources import resolve_model

    base = resolve_model("builtin:tiny-qwen2", work / "models")
    a, b = work / "A", work / "B"
    for seed, target in ((0, a), (1, b)):
        shutil.copytree(base, target, dirs_exist_ok=True)
        state = load_file(str(base / "model.safetensors"))
        generator = torch.Generator().manual_seed(seed)
        state = {
            name: value + 0.02 * torch.randn(value.shape, generator=generator).to(value.dtype)
            for name, value in state.items()
        }
        save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    turn = "<|im_start|>user\nWhat is {n} plus {n}?<|im_end|>\n<|im_start|>assistant\n"
    prompts = [turn.format(n=n) for n in range(6)]
    recorded = {
        "engine_kwargs": {"dtype": "bfloat16", "trust_remote_code": False},
        "sampling_kwargs": {"temperature": 0, "max_tokens": 12, "stop": ["<|im_end|>"]},
        "prompts": prompts,
    }
    return recorded, a, b


def gpu_inputs(inputs: Path, work: Path, seed: int) -> tuple[dict[str, Any], Path, Path, dict[str, Any]]:
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from opencompass_vllm_gpu import build_model

    with gzip.open(inputs / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    a, b = work / "A", work / "B"
    built = {"A": build_model(inputs, a, seed), "B": build_model(inputs, b, seed + 1)}
    return recorded, a, b, built


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, help="bench/opencompass_vllm_gpu.py record's carry folder")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="the transformers engine on a tiny model (CPU)")
    args = parser.parse_args()
    if not args.smoke and args.inputs is None:
        parser.error("--inputs is required (bench/opencompass_vllm_gpu.py record's carry folder), or --smoke")
    work = Path(tempfile.mkdtemp(prefix="resident-engine-"))
    engine = "transformers" if args.smoke else "vllm"
    result: dict[str, Any] = {
        "benchmark": "resident_engine_gpu",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python3", "bench/resident_engine_gpu.py", *sys.argv[1:]]),
        "engine": engine,
        "smoke": args.smoke,
        "environment": environment(),  # the GPU benchmarks' one description of the machine
    }
    if args.smoke:
        recorded, a, b = smoke_inputs(work)
    else:
        recorded, a, b, built = gpu_inputs(args.inputs, work, args.seed)
        result["model_build"] = built
    result["workload"] = {
        "prompts": len(recorded["prompts"]),
        "engine_kwargs": recorded["engine_kwargs"],
        "sampling_kwargs": recorded["sampling_kwargs"],
    }
    shim = load_shim()
    output = args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    texts: dict[str, list[str]] = {}

    def save() -> None:
        output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

    server = Server(engine, work / "resident.log")
    result["resident"] = {"listening_s": server.listening_s, "evaluations": []}
    try:
        for label, view in (("A", a), ("B", b), ("A_again", a)):
            answer = serve_once(shim, server, view, recorded)
            texts[label] = answer.pop("texts")
            result["resident"]["evaluations"].append({"checkpoint": label, **answer})
            log(f"resident {label}: {answer}")
            save()
    finally:
        server.stop()
    fresh = Server(engine, work / "fresh.log")
    try:
        answer = serve_once(shim, fresh, b, recorded)
        texts["B_fresh"] = answer.pop("texts")
        result["fresh"] = {"listening_s": fresh.listening_s, "checkpoint": "B", **answer}
        log(f"fresh B: {answer}")
    finally:
        fresh.stop()
    result["agreement"] = {
        "resident_B_vs_fresh_B": agreement(texts["B"], texts["B_fresh"]),
        "resident_A_first_vs_after_B": agreement(texts["A"], texts["A_again"]),
    }
    result["mean_completion_chars"] = {k: round(sum(map(len, v)) / len(v), 1) for k, v in texts.items()}
    save()
    with gzip.open(output.with_suffix(".texts.json.gz"), "wt", encoding="utf-8") as handle:
        json.dump(texts, handle)
    log(f"agreement {result['agreement']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
