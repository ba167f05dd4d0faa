"""Model sources, the builtin tiny Qwen2, checkpoint validation and the content fingerprint."""

from __future__ import annotations

import json
import os
import shutil
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from autorl.checkpoints import (
    BUILTIN_BUILD_VERSION,
    build_tiny_qwen2,
    fingerprint,
    model_dir_name,
    resolve_model,
    validate_checkpoint,
)
from autorl.errors import CheckpointError, ModelSourceError

# --- validation -----------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "output").mkdir(parents=True)
    return root


@pytest.fixture
def checkpoint(workspace: Path, tiny_base_model: Path) -> Path:
    """A valid submission: a copy of the base model under output/."""
    return Path(shutil.copytree(tiny_base_model, workspace / "output" / "ckpt"))


def _validate(model_path: str | Path, workspace: Path, base: Path) -> Path:
    return validate_checkpoint(
        model_path, workspace=workspace, output_dir=workspace / "output", base_model_dir=base
    )


def _refusal(model_path: str | Path, workspace: Path, base: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        _validate(model_path, workspace, base)
    assert type(caught.value) is CheckpointError
    return str(caught.value)


def test_valid_checkpoint_resolves_relative_to_the_workspace(
    workspace: Path, checkpoint: Path, tiny_base_model: Path
) -> None:
    assert _validate("output/ckpt", workspace, tiny_base_model) == checkpoint.resolve()
    assert _validate(checkpoint, workspace, tiny_base_model) == checkpoint.resolve()
    # A symlink that stays inside output/ is fine, and resolves to its target.
    (workspace / "output" / "latest").symlink_to(checkpoint)
    assert _validate("output/latest", workspace, tiny_base_model) == checkpoint.resolve()


@pytest.mark.parametrize(
    "model_path",
    ["..", "../elsewhere", "output/../../outside", "/etc", "."],
)
def test_paths_outside_output_are_refused(workspace: Path, tiny_base_model: Path, model_path: str) -> None:
    message = _refusal(model_path, workspace, tiny_base_model)
    assert "outside this experiment's output folder" in message
    assert "save the model under OUTPUT_DIR" in message


def test_base_model_path_is_refused(workspace: Path, tiny_base_model: Path) -> None:
    assert "save the model under OUTPUT_DIR" in _refusal(tiny_base_model, workspace, tiny_base_model)


def test_symlinked_folder_leading_outside_is_refused(workspace: Path, tiny_base_model: Path) -> None:
    (workspace / "output" / "borrowed").symlink_to(tiny_base_model, target_is_directory=True)
    message = _refusal("output/borrowed", workspace, tiny_base_model)
    assert "after following symlinks" in message
    assert str(tiny_base_model) not in message, "the refusal must not reveal where the link leads"


def test_weight_file_linked_outside_is_refused(
    workspace: Path, checkpoint: Path, tiny_base_model: Path
) -> None:
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "model.safetensors").symlink_to(tiny_base_model / "model.safetensors")
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "model.safetensors is a symlink" in message
    assert "copy the file into the checkpoint instead of linking it" in message


def test_nested_link_outside_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    (checkpoint / "extra").mkdir()
    (checkpoint / "extra" / "base").symlink_to(tiny_base_model, target_is_directory=True)
    assert "extra/base is a symlink" in _refusal("output/ckpt", workspace, tiny_base_model)


def test_weight_file_linked_inside_output_is_accepted(
    workspace: Path, checkpoint: Path, tiny_base_model: Path
) -> None:
    store = workspace / "output" / "blobs"
    store.mkdir()
    (checkpoint / "model.safetensors").rename(store / "weights")
    (checkpoint / "model.safetensors").symlink_to(store / "weights")
    assert _validate("output/ckpt", workspace, tiny_base_model) == checkpoint.resolve()


def test_missing_folder_is_refused(workspace: Path, tiny_base_model: Path) -> None:
    message = _refusal("output/not-there", workspace, tiny_base_model)
    assert "does not exist" in message and "save_pretrained" in message


def test_file_instead_of_folder_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    message = _refusal("output/ckpt/model.safetensors", workspace, tiny_base_model)
    assert "is a file, not a folder" in message and "save_pretrained wrote" in message


def test_missing_config_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    (checkpoint / "config.json").unlink()
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "no config.json" in message and "save_pretrained" in message


def test_missing_safetensors_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    (checkpoint / "model.safetensors").unlink()
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "no *.safetensors weights" in message and "save_pretrained" in message


@pytest.mark.parametrize(
    "pickle_file",
    [
        "pytorch_model.bin",
        "training_args.bin",
        "model.pt",
        "weights.PTH",
        "state.pkl",
        "last.ckpt",
        "sub/optimizer.pt",
    ],
)
def test_pickle_files_are_refused(
    workspace: Path, checkpoint: Path, tiny_base_model: Path, pickle_file: str
) -> None:
    (checkpoint / pickle_file).parent.mkdir(exist_ok=True)
    (checkpoint / pickle_file).write_bytes(b"\x80\x04pickle")
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert pickle_file in message
    assert "pickle" in message and "delete them" in message and "save_pretrained" in message


def test_adapter_is_refused_with_merge_instructions(workspace: Path, tiny_base_model: Path) -> None:
    adapter = workspace / "output" / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"{}")
    message = _refusal("output/lora", workspace, tiny_base_model)
    assert "adapter" in message
    assert "merge_and_unload()" in message and "save_pretrained" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("architectures", ["LlamaForCausalLM"]), ("model_type", "llama"), ("architectures", None)],
)
def test_other_architecture_is_refused(
    workspace: Path, checkpoint: Path, tiny_base_model: Path, field: str, value: object
) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config[field] = value
    (checkpoint / "config.json").write_text(json.dumps(config))
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "Qwen2ForCausalLM" in message and "base model" in message
    assert "fine-tune the base model itself" in message


def test_unreadable_config_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    (checkpoint / "config.json").write_text("{not json")
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "not a readable JSON file" in message and "save_pretrained" in message


def test_fifo_weight_file_is_refused(workspace: Path, checkpoint: Path, tiny_base_model: Path) -> None:
    (checkpoint / "model.safetensors").unlink()
    os.mkfifo(checkpoint / "model.safetensors")
    message = _refusal("output/ckpt", workspace, tiny_base_model)
    assert "not a regular file" in message and "save_pretrained" in message


# --- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_stable_across_copies(tiny_base_model: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "a-different-name")
    assert fingerprint(copy) == fingerprint(tiny_base_model)
    assert len(fingerprint(copy)) == 64


def test_fingerprint_changes_with_one_weight_byte(tiny_base_model: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert fingerprint(copy) != fingerprint(tiny_base_model)


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer_config.json", "config.json"])
def test_fingerprint_covers_files_that_change_evaluation(
    tiny_base_model: Path, tmp_path: Path, name: str
) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    with (copy / name).open("a") as file:
        file.write(" ")
    assert fingerprint(copy) != fingerprint(tiny_base_model)


def test_fingerprint_ignores_files_that_do_not_change_evaluation(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    (copy / "README.md").write_text("my model")
    (copy / "trainer_state.json").write_text("{}")
    (copy / "checkpoint-10").mkdir()
    assert fingerprint(copy) == fingerprint(tiny_base_model)


def test_fingerprint_names_matter(tiny_base_model: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    (copy / "model.safetensors").rename(copy / "model-00001-of-00001.safetensors")
    assert fingerprint(copy) != fingerprint(tiny_base_model)


def test_fingerprint_streams_large_files(tmp_path: Path) -> None:
    model = tmp_path / "big"
    model.mkdir()
    with (model / "model.safetensors").open("wb") as file:
        file.truncate(64 * 1024 * 1024)  # sparse: costs no disk
    tracemalloc.start()
    try:
        fingerprint(model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"peak Python memory {peak} bytes: the file was not streamed"


def test_fingerprint_refuses_a_fifo_without_waiting(tiny_base_model: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    (copy / "model.safetensors").unlink()
    os.mkfifo(copy / "model.safetensors")
    outcome: list[BaseException | str] = []

    def run() -> None:
        try:
            outcome.append(fingerprint(copy))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "fingerprint blocked on a FIFO"
    assert isinstance(outcome[0], CheckpointError)
    assert "not a regular file" in str(outcome[0])


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
    assert fingerprint(again) == fingerprint(tiny_base_model)
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
        ModelSourceError, match=r"has no config\.json; pass a folder written by save_pretrained"
    ):
        resolve_model(str(tmp_path / "empty"), tmp_path / "models")
    with pytest.raises(ModelSourceError, match=r"is a file; pass the folder"):
        resolve_model(str(tiny_base_model / "config.json"), tmp_path / "models")


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
