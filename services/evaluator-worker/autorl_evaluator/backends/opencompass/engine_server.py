"""The resident engine: generation for OpenCompass, kept warm between evaluations.

OpenCompass renders every prompt itself (its chat template call, its stop words, its sampling
parameters) and hands them to ``vllm.LLM.generate``. With ``AUTORL_VLLM_PYTHON`` set, the worker
runs this program in that Python (an environment with vLLM; it needs nothing of ours) and gives
OpenCompass a ``vllm`` module of its own (``engine_shim/``) that forwards ``LLM(path, **kwargs)``
and ``generate`` here over a Unix socket. So OpenCompass keeps its prompts and scoring, the engine
can be any vLLM release, and the engine outlives one evaluation: a checkpoint of the architecture
the engine already holds is loaded into it in place (each parameter's own weight loader copies the
tensors into memory the engine holds, so its CUDA graphs stay valid) instead of starting an engine.

Engines: ``vllm`` (GPUs) or ``transformers`` (the CPU: greedy decoding with the same prompt
tokenization, stop strings and output text as vLLM's, so the whole path runs on a machine without
a GPU). Requests, one JSON object per connection, each answered with one JSON line:

- ``{"op": "load", "model": DIR, "engine_kwargs": {...}}``: make DIR's weights the engine's. The
  engine is reused when the resident state key (the engine arguments and every file besides the
  weights: ``config.json``, the generation config, the tokenizer files, the chat template;
  ``resident_key.py`` of the worker's package, the warm ``hf`` child's key too) equals the resident
  one's, else replaced. Answers ``reused`` and ``seconds``.
- ``{"op": "generate", "prompts": [...], "sampling": {...}}``: the completions' texts.
- ``{"op": "ping"}``: ``ok``, the engine, the resident key and whether denormal floats compute as
  zero in this process (the CPU engine's server flushes them from its start: weights scaled into
  the denormal range would take the processor's slow path at every multiplication).

Every checkpoint this program reads is a view the worker built (the platform's config and
tokenizer beside the submission's safetensors weights); nothing in it is run.

    PYTHON engine_server.py --socket PATH --engine vllm|transformers
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

#: Largest safetensors header read (a real checkpoint's is a few hundred kilobytes).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: Largest request accepted (the whole test split's prompts fit many times over).
MAX_REQUEST_BYTES = 256 * 1024 * 1024

#: The worker's package: this program runs in vLLM's environment, which has none of our packages,
#: and loads the two files it needs of it (standard library only) by their paths.
OURS = Path(__file__).resolve().parents[2]
#: The worker's one key of resident state.
RESIDENT_KEY = OURS / "resident_key.py"
#: The attention in which padding adds nothing to a row (the transformers engine's).
PADDED_ATTENTION = Path(__file__).resolve().parent / "compass_models" / "padded_attention.py"

if TYPE_CHECKING:
    from autorl_evaluator import json_lines
else:
    _spec = importlib.util.spec_from_file_location("autorl_json_lines", OURS / "json_lines.py")
    json_lines = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(json_lines)


@functools.cache
def _resident_key_module() -> Any:
    return _module_at("autorl_resident_key", RESIDENT_KEY)


def _module_at(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_state_key(model_dir: Path, engine_kwargs: dict[str, Any]) -> str:
    """Equal for two checkpoints one engine can serve by loading weights alone: the same engine
    arguments and the same files besides the weights and their shard index (config, generation
    config, tokenizer, templates: the platform's, in the evaluated view). How a checkpoint is
    sharded (and the index's ``total_size``, which follows the dtype it was saved in) is the
    submission's choice and no concern of the engine, which loads every tensor in place whatever
    file holds it."""
    key: str = _resident_key_module().resident_state_key(model_dir, {"engine_kwargs": engine_kwargs})
    return key


def weight_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no safetensors weights in {model_dir}")
    return files


def tensor_layout(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint's safetensors files: name -> shape, from the headers. Dtypes may
    differ between checkpoints (the grader lets floating tensors be F16, BF16 or F32): each is
    converted to the resident parameter's as it is copied in."""
    layout: dict[str, tuple[int, ...]] = {}
    for path in weight_files(model_dir):
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"{path.name}: a safetensors header of {size} bytes")
            header = json.loads(handle.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                layout[name] = tuple(int(n) for n in entry["shape"])
    return layout


def denormals_flushed() -> bool | None:
    """Whether a denormal float computes as zero in this process (None before torch is imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return bool((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0)


def cut_at_stop(text: str, stops: list[str]) -> str:
    """vLLM's output text for a stop string: everything before its first occurrence."""
    cuts = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return text[: min(cuts)] if cuts else text


class VllmEngine:
    def __init__(self, model_dir: Path, engine_kwargs: dict[str, Any]) -> None:
        from vllm import LLM

        self.llm = LLM(str(model_dir), **engine_kwargs)

    def load_weights(self, model_dir: Path) -> None:
        for path in weight_files(model_dir):
            self.llm.collective_rpc(_load_in_place, args=(str(path),))
        # The prefix cache's blocks hold keys and values of the weights before.
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM could not empty its prefix cache after the weights changed")

    def generate(self, prompts: list[str], sampling: dict[str, Any]) -> list[str]:
        from vllm import SamplingParams

        outputs = self.llm.generate(prompts, SamplingParams(**sampling), use_tqdm=False)
        return [output.outputs[0].text for output in outputs]


def _load_in_place(worker: Any, path: str) -> int:
    """Runs in each of the engine's workers: one safetensors file into the resident model, read on
    the CPU one tensor at a time (each parameter's loader copies it to the device and converts its
    dtype), so a checkpoint never needs its size in free GPU memory beside the model."""
    from safetensors import safe_open

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    with safe_open(path, framework="pt", device="cpu") as handle:
        names = list(handle.keys())
        loaded = model.load_weights((name, handle.get_tensor(name)) for name in names)
    return len(loaded) if loaded is not None else len(names)


#: vLLM's ``SamplingParams.skip_special_tokens`` when a request does not say: the platform's
#: configs always say (``autorl.eval_config.SKIP_SPECIAL_TOKENS``, through OpenCompass's sampling
#: parameters), which this program cannot import.
VLLM_SKIP_SPECIAL_TOKENS = True


class TransformersEngine:
    """Greedy decoding on the CPU with vLLM's semantics for a text prompt: tokenized as vLLM does
    (the tokenizer's special tokens added), stopped at end-of-text or ``max_tokens``, decoded with
    or without special tokens as the sampling parameters' ``skip_special_tokens`` says (vLLM's
    default: without), cut before the first stop string."""

    batch_size = 8

    def __init__(self, model_dir: Path, engine_kwargs: dict[str, Any]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        self.tokenizer.padding_side = "left"
        attention = _module_at("autorl_padded_attention", PADDED_ATTENTION).use_padded_attention()
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, trust_remote_code=False, attn_implementation=attention
        )
        self.model: Any = model.eval()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def load_weights(self, model_dir: Path) -> None:
        from safetensors.torch import load_file

        expected = set(self.model.state_dict())
        loaded: set[str] = set()
        for path in weight_files(model_dir):
            state = load_file(path)
            unknown = set(state) - expected
            if unknown:
                raise ValueError(f"weights the resident model does not have: {sorted(unknown)[:5]}")
            self.model.load_state_dict(state, strict=False)
            loaded |= set(state)
        tied = {name for name in expected - loaded if name.endswith("lm_head.weight")}
        missing = expected - loaded - tied
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {sorted(missing)[:5]}")
        if tied:
            self.model.tie_weights()

    def generate(self, prompts: list[str], sampling: dict[str, Any]) -> list[str]:
        if float(sampling.get("temperature", 1.0)) != 0.0:
            raise ValueError("the transformers engine decodes greedily only (temperature 0)")
        stops = [str(stop) for stop in sampling.get("stop") or []]
        max_tokens = int(sampling.get("max_tokens") or 16)
        skip_special_tokens = bool(sampling.get("skip_special_tokens", VLLM_SKIP_SPECIAL_TOKENS))
        texts: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = self.tokenizer(
                prompts[start : start + self.batch_size], return_tensors="pt", padding=True
            )
            with self.torch.inference_mode():
                out = self.model.generate(
                    **batch,
                    max_new_tokens=max_tokens,
                    do_sample=False,
                    num_beams=1,
                    repetition_penalty=1.0,
                    pad_token_id=self.pad_token_id,
                )
            new = out[:, batch["input_ids"].shape[1] :]
            for row in new:
                text = self.tokenizer.decode(row, skip_special_tokens=skip_special_tokens)
                texts.append(cut_at_stop(str(text), stops))
        return texts


ENGINES = {"vllm": VllmEngine, "transformers": TransformersEngine}


class Server:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.engine: Any = None
        self.key: str | None = None
        self.layout: dict[str, tuple[int, ...]] = {}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {
                "ok": True,
                "engine": self.kind,
                "key": self.key,
                "denormals_flushed": denormals_flushed(),
            }
        if op == "load":
            return self.load(Path(str(request["model"])), dict(request.get("engine_kwargs") or {}))
        if op == "generate":
            if self.engine is None:
                raise ValueError("generate before load")
            prompts = [str(prompt) for prompt in request["prompts"]]
            started = time.monotonic()
            texts = self.engine.generate(prompts, dict(request.get("sampling") or {}))
            # The engine's own share of an evaluation, beside OpenCompass's (docs/PERFORMANCE.md).
            seconds = round(time.monotonic() - started, 3)
            print(f"engine generate prompts={len(prompts)} seconds={seconds}", flush=True)
            return {"ok": True, "texts": texts}
        raise ValueError(f"unknown op {op!r}")

    def load(self, model_dir: Path, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        key = engine_state_key(model_dir, engine_kwargs)
        layout = tensor_layout(model_dir)
        reused = self.engine is not None and key == self.key
        if reused:
            # A load in place overwrites only the tensors a checkpoint has: one with fewer, other or
            # other-shaped tensors would leave the model before's in place. Refused before any is taken.
            if layout != self.layout:
                differing = sorted(set(layout).symmetric_difference(self.layout)) or sorted(
                    name for name in layout if layout[name] != self.layout[name]
                )
                raise ValueError(
                    f"the checkpoint's tensors differ from the resident model's ({', '.join(differing[:3])})"
                )
            try:
                self.engine.load_weights(model_dir)
            except BaseException:
                # Partly overwritten: never served again, whatever the worker does next.
                self.engine, self.key, self.layout = None, None, {}
                raise
        else:
            self.engine, self.key = None, None  # the old engine's memory goes before the new one's
            print(f"engine start kwargs={json.dumps(engine_kwargs, sort_keys=True)}", flush=True)
            self.engine = ENGINES[self.kind](model_dir, engine_kwargs)
            self.key, self.layout = key, layout
        seconds = round(time.monotonic() - started, 3)
        print(f"engine load reused={reused} seconds={seconds}", flush=True)
        return {"ok": True, "reused": reused, "seconds": seconds}


def serve(socket_path: Path, kind: str) -> None:
    server = Server(kind)
    listener = json_lines.listen(socket_path)
    print(f"engine ready engine={kind}", flush=True)

    def answer(request: dict[str, Any], connection: json_lines.Connection) -> None:
        connection.reply(server.handle(request))

    json_lines.serve(listener, answer, max_request_bytes=MAX_REQUEST_BYTES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--engine", choices=sorted(ENGINES), required=True)
    args = parser.parse_args(argv)
    # SIGTERM (also the signal the worker's death sends) takes the whole group down at once: the
    # engine's own processes hold the GPU and must not outlive the server.
    # Only as the leader of a group of its own (as the worker starts it): never a shell's group.
    if os.getpgrp() == os.getpid():
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.engine == "transformers":
        # This process runs the model on the CPU and nothing else: denormals flush for its whole life.
        import torch

        torch.set_flush_denormal(True)
    serve(args.socket, args.engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
