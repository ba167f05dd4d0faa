"""The resident engine's server and OpenCompass's side of it (autorl_evaluator.backends.opencompass:
engine_server.py, engine_shim/vllm): answers reach OpenCompass whatever processes the engine forks,
a checkpoint of the resident architecture is loaded in place and answers as a fresh engine does,
another architecture or any other file besides the weights (another base's generation config) gets
a new engine, and vLLM's stop-string semantics hold on the CPU engine."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autorl.eval_config import SKIP_SPECIAL_TOKENS
from autorl_evaluator import resident_key
from autorl_evaluator.backends.opencompass import engine_server
from autorl_evaluator.backends.opencompass.engine_server import Server, cut_at_stop, engine_state_key
from autorl_evaluator.backends.opencompass.engine_shim import vllm as shim
from autorl_evaluator.backends.opencompass.resident_engine import SERVER, SHIM
from autorl_evaluator.model_settings import ModelSettings
from tests.support.opencompass_models import save_answering_model
from tests.support.waiting import wait_for

PROMPTS = [f"<|im_start|>user\nWhat is {n} plus {n}?<|im_end|>\n<|im_start|>assistant\n" for n in range(5)]
SAMPLING = {"temperature": 0.0, "max_tokens": 10, "stop": ["<|im_end|>", "<|endoftext|>"], "top_k": 1}


def serve_in_thread(socket_path: Path) -> None:
    """The engine server in a thread of this process, once its socket's path exists."""
    threading.Thread(target=engine_server.serve, args=(socket_path, "transformers"), daemon=True).start()
    wait_for(socket_path.exists, "the engine server's socket", 10, 0.005)


def reweighted(base: Path, target: Path, seed: int) -> Path:
    """``base`` with its weights nudged by a seeded draw: another checkpoint of the same architecture."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, target)
    generator = torch.Generator().manual_seed(seed)
    state = {
        name: value + 0.05 * torch.randn(value.shape, generator=generator).to(value.dtype)
        for name, value in load_file(str(base / "model.safetensors")).items()
    }
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_stop_strings_cut_as_vllm_cuts_them() -> None:
    assert cut_at_stop("The answer is 4.<|im_end|>more", ["<|im_end|>"]) == "The answer is 4."
    assert cut_at_stop("a STOP b END c", ["END", "STOP"]) == "a "  # the earliest, whichever stop
    assert cut_at_stop("no stop here", ["<|im_end|>", ""]) == "no stop here"


def test_the_engine_key_follows_config_tokenizer_and_engine_arguments(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    other_weights = reweighted(tiny_base_model, tmp_path / "b", seed=1)
    assert engine_state_key(tiny_base_model, {"dtype": "bfloat16"}) == engine_state_key(
        other_weights, {"dtype": "bfloat16"}
    )
    assert engine_state_key(tiny_base_model, {"dtype": "bfloat16"}) != engine_state_key(
        tiny_base_model, {"dtype": "float16"}
    )
    template = other_weights / "tokenizer_config.json"
    template.write_text(template.read_text().replace("assistant", "helper"))
    assert engine_state_key(tiny_base_model, {}) != engine_state_key(other_weights, {})
    # A file in a folder beside the weights (transformers reads additional_chat_templates/) too.
    nested = shutil.copytree(tiny_base_model, tmp_path / "nested")
    (nested / "additional_chat_templates").mkdir()
    (nested / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    assert engine_state_key(tiny_base_model, {}) != engine_state_key(nested, {})


def test_the_engine_key_is_the_workers_one_resident_state_key(tiny_base_model: Path) -> None:
    """The server (in vLLM's environment) loads the worker's key function by its path: one
    function decides reuse for every resident kind."""
    assert Path(resident_key.__file__).resolve() == engine_server.RESIDENT_KEY
    kwargs = {"dtype": "bfloat16", "enforce_eager": False}
    assert engine_state_key(tiny_base_model, kwargs) == resident_key.resident_state_key(
        tiny_base_model, {"engine_kwargs": kwargs}
    )


def sharded(checkpoint: Path, target: Path, *, dtype: str) -> Path:
    """``checkpoint`` saved again as two shards of ``dtype`` with their index, as
    ``save_pretrained(max_shard_size=...)`` writes them: the same weights, other files."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(checkpoint, target)
    (target / "model.safetensors").unlink()
    state = {
        name: value.to(getattr(torch, dtype))
        for name, value in load_file(str(checkpoint / "model.safetensors")).items()
    }
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({name: state[name] for name in part}, str(target / file), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
        "weight_map": {name: file for file, part in shards.items() for name in part},
    }
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    return target


def test_how_a_checkpoint_is_sharded_or_typed_does_not_replace_the_engine(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    """The shard index is the submission's choice: two shards of another dtype, with their index,
    are the same engine's, and loading them in place answers as the single file does."""
    single = reweighted(tiny_base_model, tmp_path / "single", seed=1)
    two = sharded(single, tmp_path / "two", dtype="float16")
    assert engine_state_key(two, {}) == engine_state_key(single, {}) == engine_state_key(tiny_base_model, {})
    resident = Server("transformers")
    generate = {"op": "generate", "prompts": PROMPTS, "sampling": SAMPLING}
    assert resident.handle({"op": "load", "model": str(tiny_base_model)})["reused"] is False
    assert resident.handle({"op": "load", "model": str(single)})["reused"] is True
    on_single = resident.handle(generate)["texts"]
    assert resident.handle({"op": "load", "model": str(two)})["reused"] is True
    assert resident.handle(generate)["texts"] == on_single


def test_weights_loaded_in_place_answer_as_a_fresh_engine_does(tiny_base_model: Path, tmp_path: Path) -> None:
    a = reweighted(tiny_base_model, tmp_path / "a", seed=0)
    b = reweighted(tiny_base_model, tmp_path / "b", seed=1)
    resident = Server("transformers")
    generate = {"op": "generate", "prompts": PROMPTS, "sampling": SAMPLING}
    assert resident.handle({"op": "load", "model": str(a)})["reused"] is False
    on_a = resident.handle(generate)["texts"]
    assert resident.handle({"op": "load", "model": str(b)})["reused"] is True
    on_b = resident.handle(generate)["texts"]
    fresh = Server("transformers")
    assert fresh.handle({"op": "load", "model": str(b)})["reused"] is False
    assert fresh.handle(generate)["texts"] == on_b
    assert on_b != on_a  # the load changed the answers: the weights were really swapped
    assert all("<|im_end|>" not in text for text in on_a + on_b)
    # A checkpoint of another architecture (here: other engine arguments) replaces the engine.
    assert resident.handle({"op": "load", "model": str(a), "engine_kwargs": {"seed": 1}})["reused"] is False
    assert resident.handle(generate)["texts"] == on_a


def test_the_cpu_engine_decodes_special_tokens_as_the_sampling_parameters_say(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    """The platform's sampling parameters drop special tokens (vLLM's default, said explicitly); the
    engine keeps them only when told to, as vLLM does."""
    answer = ["The", "Ġanswer", "Ġis", "Ġ", "1", "<|im_start|>", "9"]
    model = save_answering_model(tiny_base_model, tmp_path / "model", answer, "<|im_start|>assistant\n")
    platform = ModelSettings().vllm_generation_kwargs()
    assert platform["skip_special_tokens"] is SKIP_SPECIAL_TOKENS is True
    server = Server("transformers")
    server.handle({"op": "load", "model": str(model)})

    def texts(sampling: dict[str, Any]) -> list[str]:
        return list(server.handle({"op": "generate", "prompts": PROMPTS[:1], "sampling": sampling})["texts"])

    assert texts({**SAMPLING, **platform}) == texts(SAMPLING) == ["The answer is 19"]
    assert texts({**SAMPLING, **platform, "skip_special_tokens": False}) == ["The answer is 1<|im_start|>9"]


def with_extra_eos(base: Path, target: Path, eos_id: int) -> Path:
    """``base`` byte for byte, but for ``eos_id`` added to its generation config's eos ids: another
    base model, whose weights and every other file are the first's."""
    shutil.copytree(base, target)
    config = json.loads((target / "generation_config.json").read_text())
    config["eos_token_id"] = [*config["eos_token_id"], eos_id]
    (target / "generation_config.json").write_text(json.dumps(config, indent=2))
    return target


def generated_ids(model_dir: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """The ids greedy decoding of ``model_dir`` generates after ``prompt`` (no eos stops it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)
    return [int(token) for token in out[0, ids.shape[1] :]]


def test_a_base_with_another_generation_config_never_steers_the_resident_engine(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    """Base A, then base B (A's files but for extra eos ids in its generation config, ids that cut
    A's answers short), then A again, in one resident engine: B gets an engine of its own (its key
    differs) and A's answers are those of A's cold engine."""
    a = Path(shutil.copytree(tiny_base_model, tmp_path / "a"))
    b = with_extra_eos(a, tmp_path / "b", generated_ids(a, PROMPTS[0], 3)[2])
    assert engine_state_key(a, {}) != engine_state_key(b, {})
    generate = {"op": "generate", "prompts": PROMPTS, "sampling": SAMPLING}
    cold = Server("transformers")
    cold.handle({"op": "load", "model": str(a)})
    on_a_cold = cold.handle(generate)["texts"]

    resident = Server("transformers")
    assert resident.handle({"op": "load", "model": str(a)})["reused"] is False
    assert resident.handle(generate)["texts"] == on_a_cold
    assert resident.handle({"op": "load", "model": str(b)})["reused"] is False
    on_b = resident.handle(generate)["texts"]
    assert len(on_b[0]) < len(on_a_cold[0])  # B's eos ids cut A's first answer: B would steer A
    assert resident.handle({"op": "load", "model": str(a)})["reused"] is False
    assert resident.handle(generate)["texts"] == on_a_cold


def test_a_checkpoint_with_other_tensors_is_refused_before_any_is_loaded(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    """Loading in place overwrites only what a checkpoint holds: one tensor short would leave the
    previous submission's tensor serving this one. The server refuses it and the model is untouched."""
    import torch
    from safetensors.torch import load_file, save_file

    broken = shutil.copytree(tiny_base_model, tmp_path / "broken")
    state = load_file(str(broken / "model.safetensors"))
    dropped = sorted(state)[-1]
    state.pop(dropped)
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    server = Server("transformers")
    server.handle({"op": "load", "model": str(tiny_base_model)})
    generate = {"op": "generate", "prompts": PROMPTS, "sampling": SAMPLING}
    before = server.handle(generate)["texts"]
    with pytest.raises(ValueError, match=f"tensors differ from the resident model's \\({dropped}"):
        server.handle({"op": "load", "model": str(broken)})
    assert server.handle(generate)["texts"] == before
    # Another floating dtype is no other layout: it is converted as it is copied in.
    as_half = shutil.copytree(tiny_base_model, tmp_path / "half")
    save_file(
        {
            name: value.to(torch.bfloat16)
            for name, value in load_file(str(tiny_base_model / "model.safetensors")).items()
        },
        str(as_half / "model.safetensors"),
        metadata={"format": "pt"},
    )
    assert server.handle({"op": "load", "model": str(as_half)})["reused"] is True


class ForkingEngine:
    """Stands for vLLM's engine, which starts its worker processes while the first load request is
    being served: they inherit every open descriptor, the request's connection too."""

    children: list[int] = []

    def __init__(self, model_dir: Path, engine_kwargs: dict[str, Any]) -> None:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        self.children.append(pid)

    def generate(self, prompts: list[str], sampling: dict[str, Any]) -> list[str]:
        return [prompt[::-1] for prompt in prompts]


def test_answers_reach_opencompass_while_processes_the_engine_forked_hold_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import save_file

    monkeypatch.setitem(engine_server.ENGINES, "transformers", ForkingEngine)
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    socket_path = tmp_path / "engine.sock"
    serve_in_thread(socket_path)
    monkeypatch.setenv("AUTORL_ENGINE_SOCKET", str(socket_path))
    try:
        started = time.monotonic()
        llm = shim.LLM(str(tmp_path), dtype="bfloat16")
        outputs = llm.generate(["ab", "cd"], shim.SamplingParams(temperature=0))
        assert time.monotonic() - started < 10  # not held until the forked process ends
        assert llm.loaded["reused"] is False
        assert [output.outputs[0].text for output in outputs] == ["ba", "dc"]
        assert [output.prompt for output in outputs] == ["ab", "cd"]
        with pytest.raises(shim.EngineError, match="LoRA"):
            llm.generate(["ab"], shim.SamplingParams(), lora_request=object())
    finally:
        for pid in ForkingEngine.children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_the_socket_appears_only_once_the_server_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that waits for the path connects at once: it never meets a bound socket that refuses."""
    import socket

    socket_path = tmp_path / "engine.sock"
    seen_at_listen: list[bool] = []
    listen = socket.socket.listen

    def slow_listen(self: socket.socket, backlog: int = 0) -> None:
        seen_at_listen.append(socket_path.exists())
        time.sleep(0.5)  # a loaded machine between bind and listen
        listen(self, backlog)

    monkeypatch.setattr(socket.socket, "listen", slow_listen)
    serve_in_thread(socket_path)
    assert shim.exchange(str(socket_path), {"op": "ping"}, timeout_s=10)["ok"] is True
    assert seen_at_listen == [False]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["engine.sock"]  # no name left behind


def test_the_server_and_the_shim_need_nothing_of_ours_at_import() -> None:
    """The server runs in the vLLM environment and the shim in OpenCompass's: neither has our
    packages, so each imports only the standard library when it loads (engines load lazily)."""
    for path in (SERVER, SHIM / "vllm" / "__init__.py", SHIM / "ray" / "__init__.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [
            alias.name.split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import)
            for alias in node.names
        ] + [
            node.module.split(".")[0]
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module
        ]
        assert set(names) <= set(sys.stdlib_module_names) | {"__future__"}, (path, names)
