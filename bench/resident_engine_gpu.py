"""The evaluator's resident engine on one GPU, on a trained checkpoint: warm, fresh and in-process.

``AUTORL_VLLM_PYTHON`` makes the ``opencompass`` backend hand generation to a resident engine
(services/evaluator-worker/.../opencompass/engine_server.py) that OpenCompass reaches through the
worker's ``vllm`` shim (engine_shim/vllm). This runs those two files as they run in production, on
vLLM 0.25 and one H200: the server in its own process (the worker's settings for it:
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), the shim loaded in this process as OpenCompass loads it,
called as ``VLLMwithChatTemplate`` calls it: ``LLM(view, **model_kwargs)`` with the model keyword
arguments of the config the worker writes, then ``generate(prompts, SamplingParams(**kwargs))``
with OpenCompass's own 1,319 rendered prompts and sampling parameters (recorded on the CPU by
``bench/opencompass_vllm_gpu.py record``: 16 GSM8K test problems and 1,303 generated ones in
``gsm8k_gen_1d7fe4``'s 4-shot prompt).

Checkpoints, all of the Qwen2.5-1.5B architecture with the view's config and tokenizer:

- ``A``: random bf16 weights (seed 0); it never stops, so every row runs to 512 tokens;
- ``T1`` and ``T2``: trained here (``prepare``) from ``A`` by supervised fine-tuning on generated
  arithmetic problems that are not among the evaluated ones, each in the evaluated 4-shot prompt,
  answered as the exemplars answer and ended with ``<|im_end|>``: ``T1`` after the first part of
  the steps, ``T2`` at the end. A trained model stops where its answers end, so ``T1``/``T2`` are
  the evaluation at GSM8K answer lengths, and their answers are what agreement is judged on
  (random weights agree on almost nothing between two runs: greedy choices among near-ties).

``serve``: one resident engine (the engine arguments as recorded, those of an engine for one
evaluation: eager) serves ``T1``
(its start, then the split), then ``T2``, ``A`` and ``T1`` again, each loaded into it in place:
seconds from ``LLM(...)`` (the load request) to the last answer, as the warm worker spends them per
submission. Then fresh engines on ``T2``: the same arguments (the engine per evaluation), and CUDA
graphs with prefix caching (``enforce_eager=False``), each asked twice; and the in-process engine
(``autorl.decoding.greedy_engine``, the ``hf`` backend's) on ``T2`` with the prompts tokenized as
vLLM tokenizes them and its text cut at the same stop strings. Agreement: identical completions and
equal final answers (OpenCompass's ``gsm8k_postprocess``) of each against the resident engine's.

``bare`` (another call, after ``prepare``): T2 through the worker's server and shim and through the
engine called directly in this process (``engine_server.py``'s own engine class), the resident
engine's arguments, twice each: what the socket, the JSON and the shim add to a split's generation.
It writes a file of its own (``resident_engine_bare.json``), never the serve phase's.

``replay`` (here, after): every set of completions goes through the worker's real OpenCompass path
(bench/opencompass_vllm_gpu.py's stand-in engine answers each prompt with it); OpenCompass scores
them with its own evaluator and the worker reads its summary.

``prepare`` takes ``--batch`` examples a step (16, as for the committed T1 and T2), through the
model ``--micro-batch`` at a time: by default the whole batch on a card of 120 GiB or more (the
H200), 4 on a smaller one (an 80 GB H100 runs out of memory at 16); the steps are the same.
The checkpoints stay in ``--work`` (outside the call's ``$OUT``) for the later calls.

    .venv/bin/python bench/opencompass_vllm_gpu.py record --work .vllm-parts/oc
    # on the GPU machine, vLLM 0.25 and its wheels (bench/data/vllm-0.25-serve-wheels.txt) in
    # /root/site, .vllm-parts/oc/carry carried; three calls on one warm machine:
    PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/resident_engine_gpu.py \\
        --inputs .vllm-parts/oc/carry --work /root/resident --phase prepare --steps 160
    PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/resident_engine_gpu.py \\
        --work /root/resident --phase serve --output $OUT/resident_engine_gpu.json
    PYTHONPATH=/root/site:. VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/resident_engine_gpu.py \\
        --work /root/resident --phase bare --output $OUT/resident_engine_bare.json
    # here: OpenCompass scores each engine's completions
    .venv/bin/python bench/resident_engine_gpu.py --phase replay --gpu-result DIR/resident_engine_gpu.json
    # here, a check of the whole script on the CPU (the transformers engine, a tiny model):
    .venv/bin/python bench/resident_engine_gpu.py --smoke

Writes ``bench/results/resident_engine_gpu.json`` (or ``--output``) and the completions beside it
(``.texts.json.gz``).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import common

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results" / "resident_engine_gpu.json"
#: The bare phase's results (its default ``--output``).
BARE_RESULTS = REPO_ROOT / "bench" / "results" / "resident_engine_bare.json"


class Server:
    """The worker's engine server, started as the worker starts it."""

    def __init__(self, engine: str, log_path: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="autorl-engine-"))
        self.socket = self.folder / "engine.sock"
        env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.log = log_path.open("ab")
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, str(common.SERVER), "--socket", str(self.socket), "--engine", engine],
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


def serve_once(
    shim: ModuleType, server: Server, view: Path, recorded: dict[str, Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """What one evaluation asks of the engine: ``LLM(view, **kwargs)``, then one ``generate``."""
    os.environ["AUTORL_ENGINE_SOCKET"] = str(server.socket)
    started = time.perf_counter()
    llm = shim.LLM(str(view), **kwargs)
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


# --------------------------------------------------------------------------- checkpoints


def answer_text(problem: Any) -> str:
    """A generated problem's worked answer as the 4-shot exemplars write theirs (no calculator
    annotation, a closing "The answer is N" line)."""
    working, result = problem.answer.rsplit("\n#### ", 1)
    return f"{re.sub(r'<<[^>]*>>', '', working)}\nThe answer is {result}\n"


def training_examples(recorded: dict[str, Any], count: int) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Generated problems that are not among the evaluated ones, each in the evaluated 4-shot prompt
    (the recorded prompt of a generated problem with its question replaced), with their answers."""
    from autorl.tasks.arith import generate_problems

    evaluated = common.evaluated_problems()
    index = len(evaluated) - 1
    template, question = recorded["prompts"][index], evaluated[index].question
    if template.count(question) != 1:
        raise RuntimeError("the recorded prompt does not hold its problem's question once")
    seen = {problem.question for problem in evaluated}
    fresh = [
        p for p in generate_problems(common.TRAIN_PROBLEM_SEED, count + len(seen)) if p.question not in seen
    ]
    examples = [(template.replace(question, p.question), answer_text(p)) for p in fresh[:count]]
    return examples, {
        "problems": len(examples),
        "problem_seed": common.TRAIN_PROBLEM_SEED,
        "overlap_with_evaluated": 0,
    }


def schedule(step: int, warmup: int, last: int) -> float:
    """The learning rate's factor at ``step``: linear warm-up to 1, then a cosine down to 0.1 at
    ``last`` (a trained model's answers settle as the rate falls)."""
    if step <= warmup:
        return step / warmup
    progress = (step - warmup) / max(1, last - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    base: Path,
    saves: list[tuple[int, Path]],
    examples: list[tuple[str, str]],
    *,
    batch: int,
    learning_rate: float,
    seed: int,
    micro_batch: int | None = None,
) -> dict[str, Any]:
    """Supervised fine-tuning of ``base`` on ``examples`` (loss on the answer and its end-of-turn
    only); after each step named in ``saves`` the weights go to that folder (the base's tensor names
    and shapes, so a resident engine can load them in place). A step takes ``batch`` examples, run
    through the model ``micro_batch`` at a time with their gradients summed (the loss is the mean
    over the step's answer tokens whatever ``micro_batch`` is), so a card with less memory trains
    the same steps."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    model = model.to(device)
    model.train()
    with safe_open(str(base / "model.safetensors"), framework="pt") as handle:
        saved_names = list(handle.keys())
    rows = [
        (tokenizer(prompt).input_ids, [*tokenizer(answer, add_special_tokens=False).input_ids, end])
        for prompt, answer in examples
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    micro = max(1, min(batch, micro_batch or batch))
    last = max(step for step, _ in saves)
    warmup = max(1, last // 10)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(1, last + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * schedule(step, warmup, last)
        chosen = [rows[order[(step * batch + i) % len(rows)]] for i in range(batch)]
        answer_tokens = sum(len(answer) for _, answer in chosen)
        loss_sum = 0.0
        for first in range(0, batch, micro):
            part = chosen[first : first + micro]
            width = max(len(p) + len(a) for p, a in part)
            ids = torch.full((len(part), width), tokenizer.pad_token_id or 0, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            targets = torch.full((len(part), width), -100, dtype=torch.long)
            for row, (prompt, answer) in enumerate(part):
                joined = prompt + answer
                ids[row, : len(joined)] = torch.tensor(joined)
                mask[row, : len(joined)] = 1
                # The token at position t is predicted from position t - 1.
                targets[row, len(prompt) - 1 : len(joined) - 1] = torch.tensor(answer)
            ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            where = targets != -100
            # Only where the loss is: not the whole vocabulary per prompt id.
            logits = model.lm_head(hidden[where]).float()
            summed = torch.nn.functional.cross_entropy(logits, targets[where], reduction="sum")
            (summed / answer_tokens).backward()  # type: ignore[no-untyped-call]
            loss_sum += float(summed.detach())
        loss = loss_sum / answer_tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(float(loss), 4))
        if step % 10 == 0 or step == last:
            common.log(f"train step {step}/{last} loss {losses[-1]} ({time.perf_counter() - started:.0f} s)")
        for save_step, folder in saves:
            if step == save_step:
                state = model.state_dict()
                common.copy_view(base, folder)
                save_file(
                    {name: state[name].detach().to(dtype).contiguous().cpu() for name in saved_names},
                    str(folder / "model.safetensors"),
                    metadata={"format": "pt"},
                )
    return {
        "steps": last,
        "saves": {folder.name: step for step, folder in saves},
        "batch": batch,
        "micro_batch": micro,
        "learning_rate": learning_rate,
        "schedule": "linear warm-up over a tenth of the steps, then a cosine down to a tenth",
        "seconds": round(time.perf_counter() - started, 1),
        "card": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device == "cuda" else None,
        "loss_first_last": [losses[0], losses[-1]],
        "loss_every_10": losses[::10],
    }


# --------------------------------------------------------------------------- phases


#: Graphs and prefix caching (vLLM's own defaults) in place of the worker's ``enforce_eager``.
GRAPH_KWARGS = {"enforce_eager": False, "enable_prefix_caching": True}


def smoke_prepare(work: Path) -> dict[str, Any]:
    """A tiny model, a few prompts and a few training steps, for the CPU check of this script."""
    from autorl.models.sources import resolve_model

    base = resolve_model("builtin:tiny-qwen2", work / "models")
    common.copy_view(base, work / "A")
    shutil.copyfile(base / "model.safetensors", work / "A" / "model.safetensors")
    turn = "<|im_start|>user\nWhat is {n} plus {n}?<|im_end|>\n<|im_start|>assistant\n"
    recorded = {
        "engine_kwargs": {"dtype": "bfloat16", "trust_remote_code": False},
        "sampling_kwargs": {"temperature": 0, "max_tokens": 12, "stop": ["<|im_end|>"]},
        "prompts": [turn.format(n=n) for n in range(6)],
    }
    examples = [(turn.format(n=n), f"{2 * n}\n") for n in range(6, 30)]
    trained = train(
        work / "A",
        [(2, work / "T1"), (4, work / "T2")],
        examples,
        batch=4,
        learning_rate=1e-3,
        seed=0,
        micro_batch=2,
    )
    (work / "recorded.json").write_text(json.dumps(recorded), encoding="utf-8")
    return {"model_build": {"A": "builtin:tiny-qwen2"}, "training": trained}


#: Examples per training step (the committed T1 and T2: 16).
BATCH = 16
#: Card memory (GiB) at and above which a step's 16 examples go through the model at once: they
#: did on the H200 (139 GiB); on an 80 GB H100 they ran out of memory.
WHOLE_BATCH_GIB = 120
#: Examples at a time below that: a quarter of the activations, the same steps.
SMALL_CARD_MICRO_BATCH = 4


def default_micro_batch(batch: int) -> int:
    """Examples through the model at once, from the card's memory: the whole batch on a card of
    :data:`WHOLE_BATCH_GIB` or more, :data:`SMALL_CARD_MICRO_BATCH` on a smaller one."""
    import torch

    if not torch.cuda.is_available():
        return batch
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return batch if total_gib >= WHOLE_BATCH_GIB else min(batch, SMALL_CARD_MICRO_BATCH)


def gpu_prepare(
    inputs: Path, work: Path, seed: int, steps: int, batch: int = BATCH, micro_batch: int | None = None
) -> dict[str, Any]:
    with gzip.open(inputs / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    built = common.build_view_checkpoint(inputs, work / "A", seed)
    examples, described = training_examples(recorded, 4096)
    saves = [(steps // 2, work / "T1"), (steps, work / "T2")]
    micro = micro_batch or default_micro_batch(batch)
    trained = train(
        work / "A", saves, examples, batch=batch, learning_rate=3e-4, seed=seed, micro_batch=micro
    )
    shutil.copyfile(inputs / "recorded.json.gz", work / "recorded.json.gz")
    return {"model_build": {"A": built}, "training": {**trained, "examples": described}}


def serve_phase(
    work: Path, engine: str, result: dict[str, Any], save: Callable[[], None]
) -> dict[str, list[str]]:
    recorded = common.read_recorded(work)
    result["workload"] = {
        "prompts": len(recorded["prompts"]),
        "engine_kwargs": recorded["engine_kwargs"],
        "sampling_kwargs": recorded["sampling_kwargs"],
    }
    shim = common.load_file_module("autorl_engine_shim", common.SHIM)
    texts: dict[str, list[str]] = {}
    worker_kwargs = dict(recorded["engine_kwargs"])
    graph_kwargs = {**worker_kwargs, **GRAPH_KWARGS} if engine == "vllm" else worker_kwargs

    server = Server(engine, work / "resident.log")
    result["resident"] = {
        "listening_s": server.listening_s,
        "engine_kwargs": worker_kwargs,
        "evaluations": [],
    }
    try:
        for label in ("T1", "T2", "A", "T1_again"):
            answer = serve_once(shim, server, work / label.removesuffix("_again"), recorded, worker_kwargs)
            texts[f"resident_{label}"] = answer.pop("texts")
            result["resident"]["evaluations"].append({"checkpoint": label, **answer})
            common.log(f"resident {label}: {answer}")
            save()
    finally:
        server.stop()
    result["fresh"] = {}
    for name, kwargs in (("eager", worker_kwargs), ("graphs", graph_kwargs)):
        fresh = Server(engine, work / f"fresh-{name}.log")
        try:
            first = serve_once(shim, fresh, work / "T2", recorded, kwargs)
            texts[f"fresh_{name}_T2"] = first.pop("texts")
            again = serve_once(shim, fresh, work / "T2", recorded, kwargs)
            texts[f"fresh_{name}_T2_again"] = again.pop("texts")
            result["fresh"][name] = {
                "listening_s": fresh.listening_s,
                "engine_kwargs": kwargs,
                "first": first,
                "again": again,
            }
            common.log(f"fresh {name} T2: {result['fresh'][name]}")
            save()
        finally:
            fresh.stop()
    answer = common.hf_engine_answers(work / "T2", recorded)
    texts["in_process_T2"] = answer.pop("texts")
    result["in_process"] = {"checkpoint": "T2", **answer}
    common.log(f"in-process T2: {answer}")
    reference = texts["resident_T2"]
    result["agreement_with_resident_T2"] = {
        name: common.agreement(reference, other)
        for name, other in texts.items()
        if name.endswith(("T2", "T2_again")) and name != "resident_T2"
    }
    result["agreement_resident_T1_first_vs_after_T2_and_A"] = common.agreement(
        texts["resident_T1"], texts["resident_T1_again"]
    )
    result["completion_tokens"] = {
        name: common.completion_tokens(other, work / "T2") for name, other in texts.items()
    }
    save()
    return texts


def bare_phase(work: Path, engine: str, result: dict[str, Any]) -> None:
    """The worker's path (server and shim) against the engine called directly in this process, on T2
    with the resident engine's arguments, each asked twice: what the socket, the JSON and the shim
    add to a split's generation."""
    recorded = common.read_recorded(work)
    kwargs = {**recorded["engine_kwargs"], **GRAPH_KWARGS} if engine == "vllm" else recorded["engine_kwargs"]
    shim = common.load_file_module("autorl_engine_shim", common.SHIM)
    server = Server(engine, work / "bare-shim.log")
    shimmed: list[dict[str, Any]] = []
    try:
        for _ in range(2):
            shimmed.append(serve_once(shim, server, work / "T2", recorded, kwargs))
    finally:
        server.stop()
    engines = common.load_file_module("autorl_engine_server", common.SERVER).ENGINES
    started = time.perf_counter()
    direct = engines[engine](work / "T2", kwargs)
    start_s = round(time.perf_counter() - started, 2)
    bare: list[dict[str, Any]] = []
    for _ in range(2):
        began = time.perf_counter()
        texts = direct.generate(recorded["prompts"], dict(recorded["sampling_kwargs"]))
        bare.append({"generate_s": round(time.perf_counter() - began, 2), "texts": texts})
    bare[0] = {"start_s": start_s, **bare[0]}
    result["engine_kwargs"] = kwargs
    result["through_the_worker"] = [{k: v for k, v in run.items() if k != "texts"} for run in shimmed]
    result["direct"] = [{k: v for k, v in run.items() if k != "texts"} for run in bare]
    result["agreement_direct_vs_worker"] = common.agreement(bare[1]["texts"], shimmed[1]["texts"])
    result["worker_over_direct"] = round(shimmed[1]["generate_s"] / bare[1]["generate_s"], 2)
    common.log(f"through the worker {result['through_the_worker']}, direct {result['direct']}")


def replay_phase(gpu_result: Path, output: Path) -> int:
    """OpenCompass (the worker's real path, its evaluator and summary) scores every set of
    completions the GPU run returned."""
    from autorl.tasks import get_task

    result = json.loads(gpu_result.read_text(encoding="utf-8"))
    with gzip.open(gpu_result.with_suffix(".texts.json.gz"), "rt", encoding="utf-8") as handle:
        texts: dict[str, list[str]] = json.load(handle)
    work = Path(tempfile.mkdtemp(prefix="resident-replay-"))
    carry = REPO_ROOT / ".vllm-parts" / "oc" / "carry"
    with gzip.open(carry / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        prompts = json.load(handle)["prompts"]
    answers = [problem.answer for problem in common.evaluated_problems()]
    task = get_task("gsm8k")
    scored: dict[str, Any] = {}
    for name, completions in texts.items():
        replay_file = work / f"replay-{name}.json"
        replay_file.write_text(
            json.dumps({"completions": dict(zip(prompts, completions, strict=True))}), encoding="utf-8"
        )
        evaluated, seconds = common.evaluate_with_stand_in(work, "replay", replay_file)
        scored[name] = {
            "summary_accuracy": float(evaluated.details["summary_accuracy"]),
            "completions_equal_gpu": evaluated.completions == completions,
            "recomputed_here": round(task.score(completions, answers)["opencompass"], 4),
            "worker_seconds": round(seconds, 1),
        }
        common.log(f"replay {name}: {scored[name]}")
    result["replay"] = {
        "command": ".venv/bin/python bench/resident_engine_gpu.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scores": scored,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if output.with_suffix(".texts.json.gz") != gpu_result.with_suffix(".texts.json.gz"):
        shutil.copyfile(gpu_result.with_suffix(".texts.json.gz"), output.with_suffix(".texts.json.gz"))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, help="bench/opencompass_vllm_gpu.py record's carry folder")
    parser.add_argument("--work", type=Path, help="where the checkpoints are kept between phases")
    parser.add_argument("--phase", choices=("all", "prepare", "serve", "bare", "replay"), default="all")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--gpu-result", type=Path, help="replay: the serve phase's JSON (its texts beside it)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=480, help="training steps (T1 after half)")
    parser.add_argument("--batch", type=int, default=BATCH, help="prepare: examples per training step")
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="prepare: examples through the model at once (by default the whole batch on a card of "
        f"{WHOLE_BATCH_GIB} GiB or more, {SMALL_CARD_MICRO_BATCH} on a smaller one); the same steps",
    )
    parser.add_argument("--smoke", action="store_true", help="the transformers engine on a tiny model (CPU)")
    args = parser.parse_args()
    if args.phase == "replay":
        if args.gpu_result is None:
            parser.error("--phase replay needs --gpu-result (the serve phase's JSON)")
        return replay_phase(args.gpu_result, args.output)
    if not args.smoke and args.inputs is None and args.phase not in ("serve", "bare"):
        parser.error("--inputs is required (bench/opencompass_vllm_gpu.py record's carry folder), or --smoke")
    if args.phase in ("serve", "bare") and args.work is None:
        parser.error(f"--phase {args.phase} needs the --work folder of --phase prepare")
    work = args.work or Path(tempfile.mkdtemp(prefix="resident-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    engine = "transformers" if args.smoke else "vllm"
    # Each phase its own file: bare's beside serve's, never over it.
    output = args.output if args.phase != "bare" or args.output != RESULTS else BARE_RESULTS
    if (
        args.phase == "bare"
        and output.exists()
        and "resident" in json.loads(output.read_text(encoding="utf-8"))
    ):
        parser.error(f"{output} holds the serve phase's results: give --phase bare an --output of its own")
    output.parent.mkdir(parents=True, exist_ok=True)
    if args.phase in ("all", "prepare"):
        prepared = (
            smoke_prepare(work)
            if args.smoke
            else gpu_prepare(args.inputs, work, args.seed, args.steps, args.batch, args.micro_batch)
        )
        (work / "prepare.json").write_text(json.dumps(prepared, indent=1), encoding="utf-8")
        common.log(
            f"prepared: loss {prepared['training']['loss_first_last']} in {prepared['training']['seconds']} s"
        )
    if args.phase == "prepare":
        return 0
    result: dict[str, Any] = {
        "benchmark": "resident_engine_gpu",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python3", "bench/resident_engine_gpu.py", *sys.argv[1:]]),
        "engine": engine,
        "smoke": args.smoke,
        "environment": common.environment(),  # the GPU benchmarks' one description of the machine
        **json.loads((work / "prepare.json").read_text(encoding="utf-8")),
    }

    def save() -> None:
        output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")

    if args.phase == "bare":
        bare_phase(work, engine, result)
        save()
        return 0
    texts = serve_phase(work, engine, result, save)
    with gzip.open(output.with_suffix(".texts.json.gz"), "wt", encoding="utf-8") as handle:
        json.dump(texts, handle)
    common.log(f"agreement {result['agreement_with_resident_T2']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
