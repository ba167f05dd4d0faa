"""What the benchmarks share: checkpoints, workloads, the recorded OpenCompass run, engines and
``autorl run``'s records.

Each benchmark runs as a script (``python bench/NAME.py``), whose folder Python puts first on its
path: ``import common`` finds this module. Benchmarks import this module, never one another.
They run in several Pythons (``.venv``, the GPU machine's with vLLM, OpenCompass's), so this
module imports only the standard library when it loads; what a helper needs besides, it imports
when called.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Where the benchmarks write their results files (the documents render them from there).
RESULTS_DIR = REPO_ROOT / "bench" / "results"
#: The evaluator's resident engine, run by the benchmarks as the worker runs it.
ENGINE_DIR = REPO_ROOT / "services/evaluator-worker/autorl_evaluator/backends/opencompass"
SERVER = ENGINE_DIR / "engine_server.py"
SHIM = ENGINE_DIR / "engine_shim" / "vllm" / "__init__.py"
#: GSM8K answer and prompt lengths in Qwen2.5's tokens (bench/gsm8k_lengths.py).
LENGTHS = REPO_ROOT / "bench" / "data" / "gsm8k_qwen25_lengths.json"
#: Ids above this are drawn for prompts: clear of the special ids at the top of Qwen's vocabulary.
PROMPT_ID_RANGE = 151_000


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def load_file_module(name: str, path: Path) -> ModuleType:
    """A module from its file; the shim so, as OpenCompass imports it, under another name (the real
    vllm is beside it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def environment() -> dict[str, Any]:
    """The GPU benchmarks' one description of the machine: its GPU and the packages measured."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found: dict[str, Any] = {"python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        found.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    for name in ("torch", "transformers", "trl", "vllm", "datasets", "accelerate"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- checkpoints


#: Qwen2.5-1.5B(-Instruct)'s architecture; eos and pad ids come from the tokenizer.
QWEN25_1_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "torch_dtype": "bfloat16",
}
#: The shape of QWEN25_1_5B that a CPU's smoke run builds in seconds.
SMOKE_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 16,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
#: The files of the view vLLM is given (the recorded run's carry holds them).
VIEW_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)
#: A filler token of :func:`pad_vocabulary`: its brackets lie outside the byte-level alphabet,
#: so no text's pre-tokenized bytes can spell it, and no merge produces it.
FILLER = "\u27e6{}\u27e7"


def write_config_and_tokenizer(target: Path, shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """The new folder ``target`` with the Qwen2.5-1.5B config (``shape`` over it) and the builtin
    tiny model's tokenizer (built beside it in ``tiny-qwen2``); returns the config."""
    from autorl.models.tiny import build_tiny_qwen2

    tiny = build_tiny_qwen2(target.parent / "tiny-qwen2")
    target.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tiny / name, target / name)
    tiny_config = json.loads((tiny / "config.json").read_text(encoding="utf-8"))
    config = {
        **QWEN25_1_5B,
        **(shape or {}),
        "eos_token_id": tiny_config["eos_token_id"],
        "pad_token_id": tiny_config["pad_token_id"],
    }
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def build_checkpoint(target: Path, *, seed: int, shape: dict[str, Any] | None = None) -> tuple[Path, int]:
    """The Qwen2.5-1.5B-shaped checkpoint (``shape`` over it) in ``target``, random bf16 weights
    drawn from ``seed``; returns it and its parameter count."""
    import torch
    from safetensors.torch import save_file

    from autorl.models.tiny import qwen2_parameter_shapes

    config = write_config_and_tokenizer(target, shape)
    # Drawn on the GPU when there is one (seconds instead of a minute for 1.5 B normals).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, Any] = {}
    count = 0
    for name, dims in qwen2_parameter_shapes(config):
        if name.endswith("norm.weight"):
            tensor = torch.ones(dims, dtype=torch.bfloat16)
        elif name.endswith(".bias"):
            tensor = torch.zeros(dims, dtype=torch.bfloat16)
        else:
            drawn = torch.empty(dims, dtype=torch.float32, device=device)
            drawn.normal_(0.0, config["initializer_range"], generator=generator)
            tensor = drawn.to(torch.bfloat16).cpu()
        tensors[name] = tensor
        count += tensor.numel()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target, count


def pad_vocabulary(checkpoint: Path, size: int) -> int:
    """Give the byte-level BPE tokenizer in ``checkpoint`` every id below ``size`` without moving
    one it has. Returns how many filler tokens it added.

    Every id the tokenizer lacks (past its special tokens, and any gap below them) becomes a filler
    entry of the model's vocabulary (:data:`FILLER`): no merge produces it and no text's bytes spell
    it, so every text encodes to the ids it had, and every id decodes (to the filler's own text).
    The special tokens are written into the model's vocabulary at their own ids as well:
    transformers 5 rebuilds a Qwen2 tokenizer from that vocabulary and the merges and then adds the
    special tokens, which keep an id only where the vocabulary holds it (otherwise they are
    numbered after the vocabulary's entries, which would move them past the fillers).
    ``vocab.json``, where present, is written with the same entries."""
    tokenizer_file = checkpoint / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{tokenizer_file}: a {model.get('type')} model, not byte-level BPE")
    vocab: dict[str, int] = model["vocab"]
    for special in tokenizer["added_tokens"]:
        if vocab.setdefault(special["content"], special["id"]) != special["id"]:
            raise ValueError(f"{special['content']!r} has two ids")
    taken = set(vocab.values())
    if len(taken) != len(vocab):
        raise ValueError(f"{tokenizer_file}: two tokens share an id")
    added = 0
    for token_id in range(size):
        if token_id in taken:
            continue
        filler = FILLER.format(token_id)
        if filler in vocab:
            raise ValueError(f"{filler!r} is already a token")
        vocab[filler] = token_id
        added += 1
    tokenizer_file.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    vocab_file = checkpoint / "vocab.json"
    if vocab_file.exists():
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return added


def build_padded_checkpoint(target: Path, seed: int, smoke: bool) -> dict[str, Any]:
    """:func:`build_checkpoint` (its smoke shape with a 2,048-id vocabulary), the tokenizer padded
    to the model's vocabulary (vLLM detokenizes every id it samples); what it is, for the report."""
    shape = {**SMOKE_SHAPE, "vocab_size": 2048} if smoke else None
    checkpoint, parameters = build_checkpoint(target, seed=seed, shape=shape)
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    added = pad_vocabulary(checkpoint, config["vocab_size"])
    return {"parameters": parameters, "vocab_size": config["vocab_size"], "tokenizer_ids_added": added}


def build_view_checkpoint(inputs: Path, target: Path, seed: int) -> dict[str, Any]:
    """The view's files (:data:`VIEW_FILES` in ``inputs``) and random bf16 weights (drawn on the
    GPU). The embedding rows past the tokenizer's ids are zero (the embeddings are tied, so their
    logits are 0): a random model then only ever picks ids its tokenizer can decode."""
    import torch
    from safetensors.torch import save_file

    from autorl.models.tiny import qwen2_parameter_shapes

    target.mkdir(parents=True, exist_ok=True)
    for name in VIEW_FILES:
        shutil.copyfile(inputs / name, target / name)
    config = json.loads((inputs / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((inputs / "tokenizer.json").read_text(encoding="utf-8"))
    known = max([*tokenizer["model"]["vocab"].values(), *(t["id"] for t in tokenizer["added_tokens"])]) + 1
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors: dict[str, Any] = {}
    for name, shape in qwen2_parameter_shapes(config):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape, dtype=torch.bfloat16)
        else:
            drawn = torch.empty(shape, dtype=torch.float32, device="cuda")
            drawn.normal_(0.0, config["initializer_range"], generator=generator)
            if name == "model.embed_tokens.weight":
                drawn[known:] = 0
            tensors[name] = drawn.to(torch.bfloat16).cpu()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return {"tokenizer_ids": known, "parameters": sum(t.numel() for t in tensors.values())}


def copy_view(source: Path, target: Path) -> None:
    """Every file of ``source`` but its weights into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copyfile(path, target / path.name)


# --------------------------------------------------------------------------- workloads


#: The evaluated split: these GSM8K test problems and generated ones, SPLIT_SIZE in all.
REAL_PROBLEMS = REPO_ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"
SPLIT_SIZE = 1319
#: The seed of the generated problems bench/resident_engine_gpu.py trains T1 and T2 on.
TRAIN_PROBLEM_SEED = 7


def evaluated_problems() -> list[Any]:
    """The split the OpenCompass benchmarks evaluate: the GSM8K test problems of ``tests/data`` and
    generated GSM8K-format problems (``autorl.tasks.arith``) up to :data:`SPLIT_SIZE`."""
    from autorl.tasks.arith import generate_problems
    from autorl.tasks.base import read_problems

    real = read_problems(REAL_PROBLEMS)
    return real + generate_problems(20_261_204, SPLIT_SIZE - len(real))


def gsm8k_records(tokenizer: Any, count: int) -> list[dict[str, str]]:
    """GSM8K-shaped prompts (the gsm8k task's 4-shot turns) around arith questions."""
    from autorl.tasks import get_task
    from autorl.tasks.arith import generate_problems

    task = get_task("gsm8k")
    return [
        {"prompt": task.render_prompt(tokenizer, p.question), "answer": p.answer}
        for p in generate_problems(0, count)
    ]


def id_workload(seed: int, id_range: int) -> tuple[list[list[int]], list[int]]:
    """bench/hf_generation_gpu.py's prompts and stopping lengths, drawn the same way, with ids
    below ``id_range`` (the tokenizer's ordinary ids: vLLM's detokenizer reads the prompt's last
    ids too, and ids its tokenizer does not know would stop it)."""
    lengths = json.loads(LENGTHS.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    prefix = [rng.randrange(id_range) for _ in range(lengths["prefix_ids"])]
    prompts = [prefix + [rng.randrange(id_range) for _ in range(n)] for n in lengths["suffix_ids"]]
    stops = [min(512, rng.choice(lengths["answer_ids"])) for _ in prompts]
    return prompts, stops


def load_workload(inputs: Path, seed: int) -> tuple[dict[str, Any], list[list[int]], list[int]]:
    """The recorded run in ``inputs`` (its prompts, engine and sampling arguments) and the id
    workload within its tokenizer's ids."""
    with gzip.open(inputs / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    vocab = json.loads((inputs / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    prompts, stops = id_workload(seed, min(PROMPT_ID_RANGE, len(vocab)))
    return recorded, prompts, stops


def read_recorded(work: Path) -> dict[str, Any]:
    """The recorded run bench/resident_engine_gpu.py's prepare phase left in ``work``."""
    if (work / "recorded.json").exists():
        recorded: dict[str, Any] = json.loads((work / "recorded.json").read_text(encoding="utf-8"))
        return recorded
    with gzip.open(work / "recorded.json.gz", "rt", encoding="utf-8") as handle:
        recorded = json.load(handle)
    return recorded


# --------------------------------------------------------------------------- the recorded OpenCompass run


#: The stand-in ``vllm`` module that records or replays what OpenCompass asks of the engine.
STAND_IN = REPO_ROOT / "bench" / "vllm_replay"
OC_BIN = REPO_ROOT / ".venv-opencompass" / "bin" / "opencompass"


def stand_in_submission(work: Path) -> Path:
    """A Qwen2.5-1.5B-architecture submission folder with the builtin tiny model's tokenizer. Its
    weights file is an empty safetensors file: the stand-in engine reads none (the GPU side draws
    the weights)."""
    target = work / "submission"
    if target.exists():
        return target
    write_config_and_tokenizer(target)
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (target / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return target


def evaluate_with_stand_in(work: Path, mode: str, replay_file: Path) -> tuple[Any, float]:
    """The worker's ``OpenCompassBackend.evaluate`` of :func:`evaluated_problems` with the stand-in
    engine in ``mode`` (``record`` or ``replay``); the result and its seconds."""
    from autorl.eval_config import EvalConfig
    from autorl.tasks import get_task
    from autorl_evaluator.backends.opencompass.backend import OpenCompassBackend
    from autorl_evaluator.settings import WorkerSettings

    wrapper = work / f"opencompass-{mode}"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={STAND_IN} AUTORL_VLLM_REPLAY_MODE={mode} AUTORL_VLLM_REPLAY_FILE={replay_file}\n"
        f'exec {OC_BIN} "$@"\n',
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    # The worker plans GPU 0 from CUDA_VISIBLE_DEVICES alone (no GPU library is asked here).
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    settings = WorkerSettings(
        home=work / f"home-{mode}", eval_device="cuda", opencompass_bin=wrapper, opencompass_keep_runs=True
    )
    started = time.monotonic()
    result = OpenCompassBackend().evaluate(
        stand_in_submission(work),
        get_task("gsm8k"),
        evaluated_problems(),
        EvalConfig.record("gsm8k", settings),
        settings,
    )
    return result, time.monotonic() - started


def record_prompts(work: Path) -> int:
    """The worker's evaluation with the stand-in engine recording: ``work/carry`` gets the view's
    files and ``recorded.json.gz`` (every prompt as OpenCompass rendered it, the engine and sampling
    arguments, the config and the worker's details)."""
    from autorl_evaluator.backends.opencompass.model_view import build_view

    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    recording = work / "recorded.json"
    recording.unlink(missing_ok=True)
    result, seconds = evaluate_with_stand_in(work, "record", recording)
    recorded = json.loads(recording.read_text(encoding="utf-8"))
    run_dir = Path(str(result.details["run_dir"]))
    carry = work / "carry"
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir()
    # The view vLLM is given (the worker removes its own after the run; the same function again).
    view = (
        build_view(work / "submission", work / "view-copy")
        if not (work / "view-copy").exists()
        else work / "view-copy"
    )
    for name in VIEW_FILES:
        shutil.copyfile(view / name, carry / name)
    recorded["config_py"] = (run_dir / "config.py").read_text(encoding="utf-8")
    recorded["worker_details"] = {k: v for k, v in result.details.items() if k != "run_dir"}
    recorded["record_seconds"] = round(seconds, 1)
    with gzip.open(carry / "recorded.json.gz", "wt", encoding="utf-8") as handle:
        json.dump(recorded, handle)
    log(
        f"recorded {len(recorded['prompts'])} prompts, engine {recorded['engine_kwargs']}, "
        f"sampling {recorded['sampling_kwargs']} in {seconds:.1f} s"
    )
    return 0


# --------------------------------------------------------------------------- engines


def offline_child(
    inputs: Path,
    model: Path,
    engine_kwargs: dict[str, Any],
    seed: int,
    folder: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """bench/opencompass_vllm_gpu.py's ``offline`` (bare vLLM on the recorded prompts and the id
    workload) in a process of its own (a vLLM engine cannot be started twice in one process): its
    result and its outputs. Raises ``CalledProcessError`` when it fails."""
    spec, child = folder / "spec.json", folder / "offline.json"
    spec.write_text(json.dumps({"model": str(model), "engine_kwargs": engine_kwargs, "seed": seed}))
    script = REPO_ROOT / "bench" / "opencompass_vllm_gpu.py"
    command = [sys.executable, str(script), "offline", "--inputs", str(inputs), "--spec", str(spec)]
    subprocess.run([*command, "--result", str(child)], check=True, timeout=timeout_s, env=env)
    data = json.loads(child.read_text(encoding="utf-8"))
    child.unlink()
    spec.unlink()
    return data["result"], data["outputs"]


def hf_engine_answers(view: Path, recorded: dict[str, Any]) -> dict[str, Any]:
    """The ``hf`` backend's engine on the recorded prompts with vLLM's text semantics: each prompt
    tokenized as vLLM tokenizes a text prompt, greedy up to ``max_tokens`` or an end id, decoded
    without special tokens and cut before the first stop string."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autorl.decoding.greedy_engine import generate_greedy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(view)
    # PreTrainedModel.to is wrapped by functools.wraps, which mypy does not bind to the instance.
    model: Any = AutoModelForCausalLM.from_pretrained(view, dtype=dtype)
    model = model.to(device).eval()
    loaded = time.perf_counter()
    sampling = recorded["sampling_kwargs"]
    stops = [str(stop) for stop in sampling.get("stop") or []]
    # Stop strings that are one special token each stop as that id: the same text, cut there.
    vocab = tokenizer.get_vocab()
    stop_ids = {vocab[stop] for stop in stops if stop in vocab}
    eos = model.generation_config.eos_token_id
    eos_ids = sorted(stop_ids | set(eos if isinstance(eos, list) else [eos]))
    prompts = tokenizer(recorded["prompts"]).input_ids  # one call: the fast tokenizer's batch
    if device == "cuda":
        torch.cuda.synchronize()
    tokenized = time.perf_counter()
    output = generate_greedy(
        model,
        prompts,
        max_new_tokens=int(sampling["max_tokens"]),
        eos_ids=eos_ids,
        pad_id=int(tokenizer.pad_token_id or 0),
    )
    if device == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    cut_at_stop = load_file_module("autorl_engine_server", SERVER).cut_at_stop
    texts = [cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), stops) for ids in output.tokens]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "engine": output.engine,
        "load_s": round(loaded - started, 2),
        "tokenize_s": round(tokenized - loaded, 2),
        "generate_s": round(done - tokenized, 2),
        "eos_ids": eos_ids,
        "texts": texts,
    }


def run_generate(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    """transformers ``generate`` as the ``hf`` backend called it: one left-padded batch, greedy."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.cuda(),
            attention_mask=mask.cuda(),
            do_sample=False,
            num_beams=1,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=pad_id,
        )
    return [row[width:] for row in out.cpu().tolist()]


#: The small Qwen2 shape the learning benchmarks train from random init on a GPU (31M parameters).
SMALL_MODEL: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
}


def small_model(root: Path, device: str, smoke: bool) -> tuple[Any, Any]:
    """The builtin tokenizer and a random-init Qwen2 model of :data:`SMALL_MODEL`'s shape (the
    builtin tiny model's own shape for a smoke run), in bf16 on a GPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from autorl.models.tiny import build_tiny_qwen2

    tiny = build_tiny_qwen2(root / "tiny-qwen2")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = json.loads((tiny / "config.json").read_text(encoding="utf-8"))
    if not smoke:
        config.update(SMALL_MODEL, head_dim=SMALL_MODEL["hidden_size"] // SMALL_MODEL["num_attention_heads"])
    config.pop("architectures")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).to(device)  # type: ignore[no-untyped-call]
    if device == "cuda":
        model = model.to(torch.bfloat16)
    return tokenizer, model


def fast_trainer(
    model: Any,
    tokenizer: Any,
    task: Any,
    records: list[dict[str, Any]],
    settings: Any,
    eos_ids: list[int] | None = None,
) -> Any:
    """The example agent's fast GRPO path on ``records`` (prompt and answer each), rewarded by
    ``task``; rollouts end at ``eos_ids`` (the tokenizer's end token by default)."""
    from autorl_agents.fast_grpo import FastGRPO

    return FastGRPO(
        model=model,
        tokenizer=tokenizer,
        prompts=[tokenizer(r["prompt"]).input_ids for r in records],
        answers=[r["answer"] for r in records],
        reward=lambda completions, answers: task.reward(completions, answers),
        settings=settings,
        eos_ids=eos_ids or [tokenizer.eos_token_id],
    )


def agreement(first: list[str], second: list[str]) -> dict[str, Any]:
    """Identical completions and equal final answers (OpenCompass's GSM8K postprocessing)."""
    from autorl.tasks.gsm8k import opencompass_postprocess

    pairs = list(zip(first, second, strict=True))
    finals = [(opencompass_postprocess(a), opencompass_postprocess(b)) for a, b in pairs]
    identical = sum(a == b for a, b in pairs)
    equal = sum(a == b for a, b in finals)
    return {
        "rows": len(pairs),
        "identical": identical,
        "identical_share": round(identical / len(pairs), 4),
        "equal_final_answers": equal,
        "equal_final_answers_share": round(equal / len(pairs), 4),
    }


def completion_tokens(texts: list[str], view: Path) -> dict[str, float]:
    """The completions' lengths in ``view``'s tokens: mean, max and total."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(view)
    counts = [len(tokenizer(text, add_special_tokens=False).input_ids) for text in texts]
    return {"mean": round(sum(counts) / len(counts), 1), "max": max(counts), "total": sum(counts)}


# --------------------------------------------------------------------------- autorl run


def autorl_command() -> list[str]:
    """The installed ``autorl`` beside this interpreter, else the CLI through this interpreter."""
    script = Path(sys.executable).parent / "autorl"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from autorl.cli import main; raise SystemExit(main())"]


def last_results_row(home: Path, env: dict[str, str]) -> dict[str, Any] | None:
    """The newest row of ``autorl results --json`` in that home, if any."""
    rows = json.loads(
        subprocess.run(
            [*autorl_command(), "results", "--json", "--home", str(home)],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    return rows[-1] if rows else None


def submissions(path: Path) -> list[dict[str, Any]]:
    """A run's ``scores.json``: each submission's id, path, status, score and timing."""
    if not path.is_file():
        return []
    kept = ("submission_id", "model_path", "status", "score", "eval_seconds", "reused_from", "error")
    rows = []
    for entry in json.loads(path.read_text(encoding="utf-8")):
        row = {key: entry.get(key) for key in kept}
        if entry.get("created_at") is not None and entry.get("finished_at") is not None:
            row["queued_to_scored_s"] = round(entry["finished_at"] - entry["created_at"], 1)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- GRPO, two paths

#: Rows per forward/backward pass of the loss on both paths (FastGRPO's LOSS_MICRO_BATCH) on a card
#: of :data:`LARGE_CARD_GIB` or more.
MICRO_BATCH = 32
#: The same on a smaller card: on an 80 GB H100 the fast path's 16x8 at 256 completion tokens ran
#: out of memory at 32 rows.
SMALL_CARD_MICRO_BATCH = 16
LARGE_CARD_GIB = 120
#: A GRPO variant's engine: TRL's GRPOTrainer with colocated vLLM, TRL alone, the fast path.
ENGINES = ("trl_vllm", "trl", "fast")
#: The environment variables a GPU call's recorded command names.
COMMAND_VARIABLES = ("PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER")


def micro_batch() -> int:
    """Rows per pass of the loss on both GRPO paths, from the card's memory (see :data:`MICRO_BATCH`)."""
    import torch

    if not torch.cuda.is_available():
        return MICRO_BATCH
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return MICRO_BATCH if total_gib >= LARGE_CARD_GIB else SMALL_CARD_MICRO_BATCH


def command_line(output: Path) -> str:
    """This process's command as run (its environment variables named, ``--output`` under $OUT)."""
    variables = " ".join(f"{name}={os.environ[name]}" for name in COMMAND_VARIABLES if name in os.environ)
    arguments = " ".join(sys.argv[1:]).replace(str(output), f"$OUT/{output.name}")
    return f"{variables} python3 bench/{Path(sys.argv[0]).name} {arguments}".strip()


@dataclass(frozen=True)
class Variant:
    """One GRPO path at one size: ``engine``, ``prompts`` x ``generations`` completions a step."""

    engine: str
    prompts: int
    generations: int

    @property
    def name(self) -> str:
        return f"{self.engine}_{self.prompts}x{self.generations}"

    @property
    def completions(self) -> int:
        return self.prompts * self.generations

    def trl_batches(self, rows: int) -> tuple[int, int]:
        """TRL's ``per_device_train_batch_size`` (at most ``rows``) and ``gradient_accumulation_steps``
        that make one generation batch of ``prompts x generations`` completions and one optimizer
        step a batch."""
        micro = min(self.completions, rows)
        return micro, self.completions // micro


def parse_variant(text: str) -> Variant:
    """``ENGINE_PxG`` (e.g. ``trl_vllm_2x4``, ``fast_64x8``) → :class:`Variant`."""
    engine, _, size = text.rpartition("_")
    prompts, x, generations = size.partition("x")
    if engine not in ENGINES or not x or not prompts.isdigit() or not generations.isdigit():
        raise ValueError(f"variant {text!r} is not ENGINE_PxG with ENGINE one of {', '.join(ENGINES)}")
    variant = Variant(engine, int(prompts), int(generations))
    if variant.prompts < 1 or variant.generations < 2:
        raise ValueError(f"variant {text!r}: at least 1 prompt and 2 generations a step")
    # Whole micro-batches on either card: at most the small card's rows, or a multiple of the large one's.
    if variant.completions > SMALL_CARD_MICRO_BATCH and variant.completions % MICRO_BATCH:
        raise ValueError(
            f"variant {text!r}: more than {SMALL_CARD_MICRO_BATCH} completions must be a multiple "
            f"of {MICRO_BATCH}"
        )
    return variant


def summarise(steps: list[dict[str, Any]], completions: int) -> dict[str, Any]:
    """Throughput over whole steps from per-step ``seconds``, ``completion_tokens`` and ``reward``,
    the first step left out as warm-up; every step's reward kept."""
    if len(steps) < 2:
        raise ValueError(f"{len(steps)} steps: at least 2 (the first is warm-up)")
    timed = steps[1:]
    seconds = sum(s["seconds"] for s in timed)
    tokens = sum(s["completion_tokens"] for s in timed)
    return {
        "completions_per_step": completions,
        "steps_timed": len(timed),
        "step_s": round(seconds / len(timed), 2),
        "mean_completion_tokens": round(tokens / (completions * len(timed)), 1),
        "completion_tokens_per_s": round(tokens / seconds, 1),
        "reward_per_step": [round(s["reward"], 4) for s in steps],
        "warmup_step_s": round(steps[0]["seconds"], 2),
    }


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``fast_PxG`` over ``trl_vllm_PxG`` (and over ``trl_PxG``) in completion tokens/s, where both ran."""
    out: dict[str, float] = {}
    for name, record in variants.items():
        if not name.startswith("fast_") or "completion_tokens_per_s" not in record:
            continue
        size = name.removeprefix("fast_")
        for engine in ("trl_vllm", "trl"):
            other = variants.get(f"{engine}_{size}", {})
            if other.get("completion_tokens_per_s"):
                out[f"{name}_over_{engine}_{size}"] = round(
                    record["completion_tokens_per_s"] / other["completion_tokens_per_s"], 2
                )
    return out


def fast_order(count: int, seed: int, epochs: int = 1) -> list[int]:
    """The order in which FastGRPO (seed ``seed``) draws ``count`` problems over its first
    ``epochs`` epochs (a new shuffle of one generator each epoch)."""
    generator = random.Random(seed)
    order: list[int] = []
    for _ in range(epochs):
        epoch = list(range(count))
        generator.shuffle(epoch)
        order += epoch
    return order


#: What TRL's ``GRPOConfig`` is given besides the sizes to run the fast path's algorithm: a constant
#: learning rate, no KL term, the dataset's rows in the order they come (laid out as the fast path draws).
TRL_AS_FAST_PATH: dict[str, Any] = {"lr_scheduler_type": "constant", "beta": 0.0, "shuffle_dataset": False}


@contextmanager
def trl_grpo_trainer(
    variant: Variant,
    model: Any,
    tokenizer: Any,
    reward: Any,
    records: list[dict[str, Any]],
    *,
    completion_tokens: int,
    learning_rate: float,
    seed: int,
    max_steps: int,
    callbacks: list[Any],
) -> Iterator[tuple[Any, float]]:
    """TRL's ``GRPOTrainer`` at the fast path's algorithm settings (``variant``'s prompts x
    generations a step, one policy update per generation batch, no KL term, a constant learning
    rate, temperature 1), with colocated vLLM for a ``trl_vllm`` variant, TRL's printed progress
    removed; and the seconds it took to build (vLLM's start included), for as long as the context
    lasts (its output folder a temporary one, removed after). ``records`` are laid out
    for TRL's unshuffled sampler in the order the fast path (seed ``seed``) draws them, over as
    many epochs as ``max_steps`` take: both paths get the same problems every step."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    with tempfile.TemporaryDirectory() as output_dir:
        started = time.monotonic()
        epochs = -(-max_steps * variant.prompts // len(records))
        ordered = [records[i] for i in fast_order(len(records), seed, epochs)]
        micro, accumulation = variant.trl_batches(micro_batch())
        vllm = variant.engine == "trl_vllm"
        config = GRPOConfig(
            output_dir=output_dir,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=seed,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            num_generations=variant.generations,
            max_completion_length=completion_tokens,
            learning_rate=learning_rate,
            **TRL_AS_FAST_PATH,
            bf16=model.device.type == "cuda",
            use_cpu=model.device.type == "cpu",
            max_steps=max_steps,
            disable_tqdm=True,
            dataloader_num_workers=0,
            use_vllm=vllm,
            vllm_mode="colocate",  # read only with use_vllm
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=config,
            train_dataset=Dataset.from_list(ordered),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        trainer.remove_callback(PrinterCallback)
        start_s = time.monotonic() - started
        log(f"{variant.name}: trainer built in {start_s:.1f} s")
        yield trainer, start_s
