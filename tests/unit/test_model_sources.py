"""Model sources and the builtin tiny Qwen2 (submitted checkpoints: tests/unit/test_snapshot.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autorl.errors import ModelSourceError
from autorl.layout import BUILTIN_BUILD_VERSION
from autorl.models.sources import model_dir_name, resolve_model
from autorl.models.tiny import build_tiny_qwen2

# --- model sources --------------------------------------------------------------------------


def test_builtin_is_built_once_and_cached(tmp_path: Path) -> None:
    first = resolve_model("builtin:tiny-qwen2", tmp_path)
    assert first.is_dir() and first.is_relative_to(tmp_path)
    assert first.name == f"tiny-qwen2-v{BUILTIN_BUILD_VERSION}"
    stamp = {entry.name: entry.stat().st_mtime_ns for entry in first.iterdir()}
    assert resolve_model("builtin:tiny-qwen2", tmp_path) == first
    assert {entry.name: entry.stat().st_mtime_ns for entry in first.iterdir()} == stamp
    # Readable by other users (an agent running as a user of its own).
    assert all(entry.stat().st_mode & 0o004 for entry in first.iterdir())
    assert not [
        entry
        for entry in first.parent.iterdir()
        if entry.name.startswith(f".{first.name}.") and entry.is_dir()
    ]


def test_builtin_build_is_deterministic(tiny_base_model: Path, tmp_path: Path) -> None:
    again = build_tiny_qwen2(tmp_path / "again", seed=0)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {
        p.name: p.read_bytes() for p in tiny_base_model.iterdir()
    }
    other_seed = build_tiny_qwen2(tmp_path / "seed1", seed=1)
    assert (other_seed / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()
    assert (other_seed / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_unknown_builtin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ModelSourceError, match=r"unknown builtin model builtin:gpt-17; use one of: builtin:tiny-qwen2"
    ):
        resolve_model("builtin:gpt-17", tmp_path)


def test_local_folder(tiny_base_model: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_base_model), tmp_path / "models") == tiny_base_model.resolve()
    with pytest.raises(
        ModelSourceError, match=r"does not exist; pass an existing folder that holds config\.json"
    ):
        resolve_model(str(tmp_path / "nope"), tmp_path / "models")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ModelSourceError,
        match=r"has no config\.json; pass a folder written by save_pretrained "
        r"\(config\.json, tokenizer files and weights\)$",
    ):
        resolve_model(str(tmp_path / "empty"), tmp_path / "models")
    with pytest.raises(ModelSourceError, match=r"is a file; pass the folder"):
        resolve_model(str(tiny_base_model / "config.json"), tmp_path / "models")


def test_a_hub_like_source_with_dots_is_a_local_path_never_a_download(tmp_path: Path) -> None:
    # "org/a..b" has the hub id's shape, but ".." never names a hub repository: it is a folder.
    with pytest.raises(ModelSourceError, match=r"model folder org/a\.\.b does not exist"):
        resolve_model("org/a..b", tmp_path)
    assert not (tmp_path / "hub").exists(), "nothing was downloaded"


def test_hub_id_offline_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelSourceError) as caught:
        resolve_model("Qwen/Qwen2.5-0.5B", tmp_path)
    message = str(caught.value)
    assert "cannot download Qwen/Qwen2.5-0.5B" in message
    assert "hf download Qwen/Qwen2.5-0.5B --local-dir DIR" in message and "pass DIR as the model" in message
    # Nothing is recorded as downloaded: the next attempt tries again.
    assert not list((tmp_path / "hub").glob(".*.complete"))


def test_hub_id_without_network_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No route to the hub from here: an unreachable endpoint gives the same answer anywhere.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}"
    )
    with pytest.raises(ModelSourceError, match=r"pre-download it where the hub is reachable"):
        resolve_model("someorg/some-model", tmp_path)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("builtin:tiny-qwen2", "tiny-qwen2"),
        ("Qwen/Qwen2.5-1.5B", "Qwen2.5-1.5B"),
        ("/models/My Model!/", "My-Model"),
        ("/", "model"),
        # Leading and trailing letters stay; only the dashes left by unsafe characters go.
        ("xverse/XVERSE-7B", "XVERSE-7B"),
        ("builtin:-X-", "X"),
        # Never a name that leaves models/ or names it.
        ("builtin:.", "model"),
        ("builtin:..", "model"),
        ("builtin:!!", "model"),
    ],
)
def test_model_dir_name(source: str, name: str) -> None:
    assert model_dir_name(source) == name


def test_model_dir_name_of_an_existing_relative_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "org" / "local-model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_dir_name("org/local-model") == "local-model"
    assert model_dir_name(".") == tmp_path.name


# --- the builtin model with transformers ----------------------------------------------------


def test_builtin_loads_and_generates_with_transformers(tiny_base_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_base_model)
    loaded: Any = AutoModelForCausalLM.from_pretrained(tiny_base_model, output_loading_info=True)
    model, info = loaded
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        None,
    )
    assert model.config.vocab_size == len(tokenizer)
    generation = GenerationConfig.from_pretrained(tiny_base_model)
    assert (
        tokenizer.eos_token_id in generation.eos_token_id
        and generation.pad_token_id == tokenizer.pad_token_id
    )

    messages = [{"role": "user", "content": "Question: 2+2?"}, {"role": "assistant", "content": "4"}]
    assert tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nQuestion: 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    text = "Janet’s ducks lay 16 eggs per day. She sells them for $2.50 each: 1,234 dollars #### 18 🦆"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    # Qwen2's pre-tokenizer: every digit is a token of its own.
    assert [tokenizer.decode([i]) for i in tokenizer("12345", add_special_tokens=False)["input_ids"]] == list(
        "12345"
    )
    assert tokenizer("<|im_start|>user", add_special_tokens=False)["input_ids"][
        0
    ] == tokenizer.convert_tokens_to_ids("<|im_start|>")

    prompt: Any = tokenizer.apply_chat_template(
        messages[:1], return_tensors="pt", add_generation_prompt=True, return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > prompt["input_ids"].shape[1]
