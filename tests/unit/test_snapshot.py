"""Submission snapshots: every refusal class on real checkpoints built from the tiny model, what
a snapshot holds (the submission's weights beside the base model's normalized files), and its
fingerprint."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autorl.checkpoints.snapshot import (
    MAX_SHARDS,
    Snapshot,
    prune_snapshots,
    snapshot_base_model,
    snapshot_submission,
)
from autorl.errors import CheckpointError
from tests.support.checkpoints import (
    edit_json,
    read_safetensors,
    split_into_shards,
    write_safetensors,
)

GIB = 1024**3
#: What the tiny base model ships besides its weights and config: a copy of it submitted lists them
#: as ignored, since every evaluation reads the base model's own.
BASE_TOKENIZER_FILES = (
    "generation_config.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
)
#: The refusal of a checkpoint whose files changed while the snapshot read them.
_CHANGED = (
    "the checkpoint's files changed while they were being submitted; save each checkpoint to a new "
    "folder and submit it once it is complete"
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "output").mkdir(parents=True)
    return root


@pytest.fixture
def snapshots(tmp_path: Path) -> Path:
    return tmp_path / "snapshots"


@pytest.fixture
def checkpoint(workspace: Path, tiny_base_model: Path) -> Path:
    """A valid submission: a copy of the base model under output/."""
    return Path(shutil.copytree(tiny_base_model, workspace / "output" / "ckpt"))


def _taker(workspace: Path, base: Path, snapshots: Path) -> Callable[..., Snapshot]:
    def run(model_path: str | Path = "output/ckpt") -> Snapshot:
        return snapshot_submission(
            model_path,
            workspace=workspace,
            output_dir=workspace / "output",
            base_model_dir=base,
            snapshot_root=snapshots,
        )

    return run


def _refuser(take: Callable[..., Snapshot], snapshots: Path) -> Callable[..., str]:
    def run(model_path: str | Path = "output/ckpt") -> str:
        with pytest.raises(CheckpointError) as caught:
            take(model_path)
        # A refused submission leaves nothing behind in evaluator storage.
        assert not snapshots.exists() or list(snapshots.iterdir()) == []
        return str(caught.value)

    return run


@pytest.fixture
def take(workspace: Path, tiny_base_model: Path, snapshots: Path) -> Callable[..., Snapshot]:
    return _taker(workspace, tiny_base_model, snapshots)


@pytest.fixture
def refusal(take: Callable[..., Snapshot], snapshots: Path) -> Callable[..., str]:
    return _refuser(take, snapshots)


def _with_base_files(*names: str) -> tuple[str, ...]:
    """The ignored files of a copy of the base model that holds ``names`` besides."""
    return tuple(sorted((*BASE_TOKENIZER_FILES, *names)))


def _files(snapshot: Snapshot) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in snapshot.path.iterdir()}


# --- accepted -------------------------------------------------------------------------------


def test_snapshot_holds_normalized_copies_and_matches_the_baseline(
    take: Callable[..., Snapshot], checkpoint: Path, tiny_base_model: Path, snapshots: Path, workspace: Path
) -> None:
    snapshot = take("output/ckpt")
    assert snapshot.path.parent == snapshots
    # The checkpoint's own tokenizer and generation config are listed as not evaluated.
    assert snapshot.ignored_files == BASE_TOKENIZER_FILES
    assert sorted(_files(snapshot)) == [
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    # Copies, not links: the agent's files can change, the snapshot cannot.
    weights = snapshot.path / "model.safetensors"
    assert weights.read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    assert weights.stat().st_ino != (checkpoint / "model.safetensors").stat().st_ino
    assert not any(path.is_symlink() for path in snapshot.path.iterdir())
    # A copy of the base model is the base model: it gets the baseline's fingerprint.
    assert snapshot.fingerprint == snapshot_base_model(tiny_base_model, snapshots).fingerprint
    assert take(checkpoint).fingerprint == snapshot.fingerprint  # absolute path, same files


def test_one_weight_byte_changes_the_fingerprint(take: Callable[..., Snapshot], checkpoint: Path) -> None:
    before = take().fingerprint
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert take().fingerprint != before


def test_a_trainer_checkpoint_is_accepted_its_pickles_never_opened(
    take: Callable[..., Snapshot], checkpoint: Path, tmp_path: Path
) -> None:
    """training_args.bin & co. hold pickles whose payload runs on unpickling: they are listed as
    ignored, never opened, never copied; the payload never runs."""
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt"):
        (checkpoint / name).write_bytes(pickle.dumps(Payload()))
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "README.md").write_text("# my model")
    (checkpoint / "checkpoint-500").mkdir()
    (checkpoint / "checkpoint-500" / "optimizer.pt").write_bytes(pickle.dumps(Payload()))
    # A reader that opened the ignored files would block on this FIFO.
    os.mkfifo(checkpoint / "scaler.pt.tmp")
    snapshot = take()
    assert snapshot.ignored_files == tuple(
        sorted(
            (
                *BASE_TOKENIZER_FILES,
                "README.md",
                "checkpoint-500/",
                "optimizer.pt",
                "rng_state.pth",
                "scaler.pt",
                "scaler.pt.tmp",
                "scheduler.pt",
                "trainer_state.json",
                "training_args.bin",
            )
        )
    )
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in _files(snapshot))
    assert not marker.exists()


def test_a_folder_saved_by_trainer_save_model_is_accepted(
    take: Callable[..., Snapshot], workspace: Path, tiny_base_model: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    model = AutoModelForCausalLM.from_pretrained(tiny_base_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_base_model)
    output = workspace / "output"
    args = TrainingArguments(output_dir=str(output / "trainer"), report_to=[], use_cpu=True)
    Trainer(model=model, args=args, processing_class=tokenizer).save_model(str(output / "saved"))
    assert (output / "saved" / "training_args.bin").is_file()
    snapshot = take("output/saved")
    assert "training_args.bin" in snapshot.ignored_files
    assert "training_args.bin" not in _files(snapshot)


def test_a_sharded_checkpoint_gets_an_index_of_its_own(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    shards = split_into_shards(checkpoint)
    edit_json(checkpoint / "model.safetensors.index.json", metadata={"total_size": 1}, extra="ignored")
    snapshot = take()
    files = _files(snapshot)
    assert set(shards) <= set(files) and "model.safetensors" not in files
    index = json.loads(files["model.safetensors.index.json"])
    assert index["metadata"]["total_size"] == sum(len(files[shard]) for shard in shards) - sum(
        8 + int.from_bytes(files[shard][:8], "little") for shard in shards
    )
    assert set(index["weight_map"].values()) == set(shards)


def _normalizer_rewrite(tokenizer: dict[str, Any]) -> None:
    # Every prompt becomes the text of an answer: the model would only have to copy it.
    tokenizer["normalizer"] = {
        "type": "Sequence",
        "normalizers": [{"type": "Replace", "pattern": {"Regex": "(?s).*"}, "content": "#### 42"}],
    }


def _pre_tokenizer_rewrite(tokenizer: dict[str, Any]) -> None:
    tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "[0-9]+"}, "behavior": "Removed"}


def _post_processor_rewrite(tokenizer: dict[str, Any]) -> None:
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<|im_end|>": {"id": "<|im_end|>", "ids": [0], "tokens": ["<|im_end|>"]}},
    }


def _decoder_rewrite(tokenizer: dict[str, Any]) -> None:
    # Every completion decodes to the text of an answer.
    tokenizer["decoder"] = {"type": "Replace", "pattern": {"Regex": "(?s).*"}, "content": "#### 42"}


def _added_token_rewrite(tokenizer: dict[str, Any]) -> None:
    tokenizer["added_tokens"].append(
        {
            "id": 7,
            "content": "#### 42",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )


def _vocabulary_rewrite(tokenizer: dict[str, Any]) -> None:
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]


def _tokenizer_json(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def write(checkpoint: Path) -> None:
        tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
        edit(tokenizer)
        (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer))

    return write


def _write(name: str, content: str) -> Callable[[Path], None]:
    def write(checkpoint: Path) -> None:
        (checkpoint / name).write_text(content)

    return write


def _edit(name: str, **changes: Any) -> Callable[[Path], None]:
    return lambda checkpoint: edit_json(checkpoint / name, **changes)


def _fifo(name: str) -> Callable[[Path], None]:
    def make(checkpoint: Path) -> None:
        (checkpoint / name).unlink(missing_ok=True)
        os.mkfifo(checkpoint / name)

    return make


def _unreadable(name: str) -> Callable[[Path], None]:
    return lambda checkpoint: (checkpoint / name).chmod(0)


def _remove_tokenizer(checkpoint: Path) -> None:
    for name in BASE_TOKENIZER_FILES:
        (checkpoint / name).unlink()


#: A template that computes an arith answer from the question's numbers.
_COMPUTING_TEMPLATE = (
    "{% set n = namespace(v=[]) %}{% for w in messages[-1]['content'].split() %}"
    "{% if w.isdigit() %}{% set n.v = n.v + [w|int] %}{% endif %}{% endfor %}"
    "{{ messages[-1]['content'] }} The answer is {{ n.v[-2] + n.v[-1] }}"
)


@pytest.mark.parametrize(
    "change",
    [
        _tokenizer_json(_normalizer_rewrite),
        _tokenizer_json(_pre_tokenizer_rewrite),
        _tokenizer_json(_post_processor_rewrite),
        _tokenizer_json(_decoder_rewrite),
        _tokenizer_json(_added_token_rewrite),
        _tokenizer_json(_vocabulary_rewrite),
        _write("tokenizer.json", "{not json"),
        _write("merges.txt", "#version: 0.2\n1 2\n"),
        _write("vocab.json", '{"#### 42": 0}'),
        _write("tokenizer.model", "a sentencepiece model"),
        _write("added_tokens.json", '{"#### 42": 5}'),
        _write("special_tokens_map.json", '{"eos_token": "4", "vocab_file": "/etc/passwd"}'),
        _write("chat_template.jinja", _COMPUTING_TEMPLATE),
        _write("chat_template.json", json.dumps({"chat_template": _COMPUTING_TEMPLATE})),
        _edit("tokenizer_config.json", chat_template=_COMPUTING_TEMPLATE),
        _edit(
            "tokenizer_config.json",
            add_bos_token=True,
            bos_token="#### 42",
            clean_up_tokenization_spaces=True,
        ),
        _edit(
            "tokenizer_config.json",
            tokenizer_class="evil.Tokenizer",
            auto_map={"AutoTokenizer": ["e.E", None]},
        ),
        _edit("tokenizer_config.json", vocab_file="/etc/passwd", name_or_path="/root/.autorl"),
        _edit("generation_config.json", eos_token_id=[4, 5, 6], pad_token_id=3),
        _edit("generation_config.json", do_sample=True, temperature=1.7, suppress_tokens=[5, 6]),
        _edit("config.json", use_cache=False, torch_dtype="bfloat16", note="epoch 3"),
        _write("tokenizer.json", " " * (200 * 1024 * 1024 // 100)),
        _fifo("tokenizer.json"),
        _fifo("tokenizer_config.json"),
        _unreadable("vocab.json"),
        _remove_tokenizer,
    ],
    ids=[
        "normalizer",
        "pre-tokenizer",
        "post-processor",
        "decoder",
        "added-token",
        "vocabulary",
        "tokenizer-not-json",
        "merges",
        "vocab-json",
        "sentencepiece",
        "added-tokens-json",
        "special-tokens-map",
        "chat-template-jinja",
        "chat-template-json",
        "chat-template-in-config",
        "tokenizer-flags",
        "tokenizer-class",
        "tokenizer-paths",
        "eos-ids",
        "decoding-settings",
        "config-keys",
        "large-tokenizer",
        "fifo-tokenizer",
        "fifo-tokenizer-config",
        "unreadable-vocab",
        "no-tokenizer",
    ],
)
def test_only_the_weights_of_a_submission_are_evaluated(
    take: Callable[..., Snapshot],
    checkpoint: Path,
    tiny_base_model: Path,
    snapshots: Path,
    change: Callable[[Path], None],
) -> None:
    """A tokenizer is a program (its normalizer, pre-tokenizer, post-processor and decoder rewrite
    every prompt and completion), and so are a chat template and the stop tokens: whatever the
    checkpoint carries besides its weights, the snapshot holds the base model's files, byte for
    byte, and the fingerprint is the clean checkpoint's (so the score is the clean model's). The
    submission's files are never opened: FIFOs do not block, unreadable files do not refuse."""
    clean = take()
    change(checkpoint)
    hostile = _outcome_unless_blocked_on(checkpoint / "tokenizer.json", take)
    assert isinstance(hostile, Snapshot), hostile
    assert _files(hostile) == _files(clean) == _files(snapshot_base_model(tiny_base_model, snapshots))
    assert hostile.fingerprint == clean.fingerprint


def test_the_base_models_template_and_stop_tokens_are_evaluated(
    take: Callable[..., Snapshot], checkpoint: Path, tiny_base_model: Path
) -> None:
    base_config = json.loads((tiny_base_model / "tokenizer_config.json").read_text())
    base_generation = json.loads((tiny_base_model / "generation_config.json").read_text())
    edit_json(checkpoint / "tokenizer_config.json", chat_template=_COMPUTING_TEMPLATE)
    edit_json(checkpoint / "generation_config.json", eos_token_id=[4, 5, 6], temperature=1.7)
    files = _files(take())
    assert json.loads(files["tokenizer_config.json"])["chat_template"] == base_config["chat_template"]
    kept = json.loads(files["generation_config.json"])
    assert set(kept) == {"eos_token_id", "pad_token_id"}
    assert kept["eos_token_id"] == base_generation["eos_token_id"]


# --- refused: where the folder is -----------------------------------------------------------


@pytest.mark.parametrize("model_path", ["..", "../elsewhere", "output/../../outside", "/etc", "."])
def test_paths_outside_output_are_refused(refusal: Callable[..., str], model_path: str) -> None:
    message = refusal(model_path)
    assert "outside this experiment's output folder" in message
    assert "save the model under OUTPUT_DIR" in message


def test_the_base_model_itself_is_refused(refusal: Callable[..., str], tiny_base_model: Path) -> None:
    assert "save the model under OUTPUT_DIR" in refusal(tiny_base_model)


@pytest.mark.parametrize("inside", [True, False])
def test_a_symlinked_folder_is_refused_wherever_it_leads(
    refusal: Callable[..., str], workspace: Path, checkpoint: Path, tiny_base_model: Path, inside: bool
) -> None:
    target = checkpoint if inside else tiny_base_model
    (workspace / "output" / "latest").symlink_to(target, target_is_directory=True)
    message = refusal("output/latest")
    assert "is a symbolic link" in message and "OUTPUT_DIR" in message
    assert str(tiny_base_model) not in message, "the refusal must not reveal where the link leads"


def test_a_symlinked_parent_folder_is_refused(
    refusal: Callable[..., str], workspace: Path, checkpoint: Path, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(checkpoint, tmp_path / "elsewhere" / "ckpt")
    (workspace / "output" / "runs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert "output/runs is a symbolic link" in refusal("output/runs/ckpt")


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_symlinked_model_file_is_refused(
    refusal: Callable[..., str], checkpoint: Path, tiny_base_model: Path, name: str
) -> None:
    (checkpoint / name).unlink()
    (checkpoint / name).symlink_to(tiny_base_model / name)
    message = refusal()
    assert f"{name} is a symbolic link" in message and "copy the file" in message


def test_the_output_folder_itself_as_a_link_is_refused(
    refusal: Callable[..., str], workspace: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    shutil.rmtree(workspace / "output")
    shutil.copytree(tiny_base_model, tmp_path / "real" / "ckpt")
    (workspace / "output").symlink_to(tmp_path / "real", target_is_directory=True)
    assert "not a link" in refusal("output/ckpt")


def test_missing_folder_and_file_instead_of_folder(refusal: Callable[..., str], checkpoint: Path) -> None:
    message = refusal("output/not-there")
    assert "does not exist" in message and "save_pretrained" in message
    message = refusal("output/ckpt/model.safetensors")
    assert "is a file, not a folder" in message and "save_pretrained wrote" in message


# --- refused: what the folder holds ---------------------------------------------------------


def test_missing_config_or_weights(refusal: Callable[..., str], checkpoint: Path) -> None:
    (checkpoint / "config.json").unlink()
    assert "no config.json" in refusal()
    (checkpoint / "model.safetensors").unlink()
    assert "no *.safetensors weights" in refusal()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "pytorch_model-00001-of-00002.bin", "model.pt"])
def test_pickle_weights_without_safetensors_are_refused_with_the_fix(
    refusal: Callable[..., str], checkpoint: Path, name: str
) -> None:
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / name).write_bytes(b"\x80\x04pickle")
    message = refusal()
    assert name in message and "pickle" in message and "model.safetensors" in message
    assert "save_pretrained" in message


def test_an_adapter_is_refused_with_merge_instructions(refusal: Callable[..., str], workspace: Path) -> None:
    adapter = workspace / "output" / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"{}")
    message = refusal("output/lora")
    assert "adapter" in message and "merge_and_unload()" in message and "save_pretrained" in message


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "LlamaForCausalLM"),
        ({"model_type": "llama"}, "llama"),
        ({"architectures": None}, "Qwen2ForCausalLM"),
        ({"num_hidden_layers": 3}, "num_hidden_layers"),
        ({"hidden_size": 128}, "hidden_size"),
        ({"num_attention_heads": 8}, "num_attention_heads"),
        ({"vocab_size": 4096}, "vocab_size"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"rope_theta": 1e6, "rope_parameters": None}, "rope_theta"),
        ({"max_position_embeddings": 131072}, "max_position_embeddings"),
        ({"intermediate_size": 512}, "intermediate_size"),
        ({"auto_map": {"AutoModelForCausalLM": "modeling.Evil"}}, "auto_map"),
    ],
)
def test_a_config_of_another_architecture_or_size_is_refused(
    refusal: Callable[..., str], checkpoint: Path, changes: dict[str, object], named: str
) -> None:
    edit_json(checkpoint / "config.json", **changes)
    message = refusal()
    assert named in message and "save_pretrained" in message


def test_a_broken_config_is_refused(refusal: Callable[..., str], checkpoint: Path) -> None:
    (checkpoint / "config.json").write_text("{not json")
    assert "not a readable JSON file" in refusal()
    (checkpoint / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "not a readable JSON file" in refusal()


def _rewrite_header(
    checkpoint: Path, edit: Callable[[dict[str, object], bytes], tuple[dict[str, object], bytes]]
) -> None:
    header, data = read_safetensors(checkpoint / "model.safetensors")
    header, data = edit(header, data)
    write_safetensors(checkpoint / "model.safetensors", header, data)


def _rename(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    header["model.norm.weight_renamed"] = header.pop("model.norm.weight")
    return header, data


def _reshape(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    entry = header["model.embed_tokens.weight"]
    assert isinstance(entry, dict)
    rows, cols = entry["shape"]
    entry["shape"] = [cols, rows]
    return header, data


def _extra(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    header["lm_head.extra"] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}
    return header, data + bytes(16)


def _integer(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    entry = header["model.norm.weight"]
    assert isinstance(entry, dict)
    entry["dtype"] = "I32"
    return header, data


def _missing(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    entry = header.pop("model.norm.weight")
    assert isinstance(entry, dict)
    begin, end = entry["data_offsets"]
    data = data[:begin] + data[end:]
    for other in header.values():
        if isinstance(other, dict) and "data_offsets" in other and other["data_offsets"][0] >= end:
            other["data_offsets"] = [offset - (end - begin) for offset in other["data_offsets"]]
    return header, data


def _appended(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    return header, data + b"hidden payload"


def _truncated(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
    return header, data[:-4]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_rename, "model.norm.weight_renamed"),
        (_reshape, "shape"),
        (_extra, "lm_head.extra"),
        (_integer, "I32"),
        (_missing, "missing 1 of the base model's tensors"),
        (_appended, "header declares"),
        (_truncated, "header declares"),
    ],
)
def test_weights_must_match_the_base_models_header(
    refusal: Callable[..., str],
    checkpoint: Path,
    edit: Callable[..., tuple[dict[str, object], bytes]],
    named: str,
) -> None:
    _rewrite_header(checkpoint, edit)
    message = refusal()
    assert named in message and "save_pretrained" in message


def test_weights_saved_in_another_float_precision_are_accepted(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(checkpoint / "model.safetensors")
    save_file(
        {name: tensor.to(torch.bfloat16) for name, tensor in tensors.items()},
        checkpoint / "model.safetensors",
        metadata={"format": "pt"},
    )
    assert take().fingerprint


def test_a_tensor_named_twice_in_a_header_is_refused(refusal: Callable[..., str], checkpoint: Path) -> None:
    header, data = read_safetensors(checkpoint / "model.safetensors")
    # Two entries for one name: readers disagree on which one wins.
    text = json.dumps(header).replace(
        "{", '{"model.norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ', 1
    )
    raw = text.encode()
    (checkpoint / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    assert "a name appears twice" in refusal()


def test_a_header_length_beyond_the_file_is_refused_without_reading(
    refusal: Callable[..., str], checkpoint: Path
) -> None:
    (checkpoint / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    assert "not a safetensors file" in refusal()


def _bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.parametrize("name", ["model.safetensors"])
def test_a_sparse_file_is_refused_at_once_and_unread(
    refusal: Callable[..., str], checkpoint: Path, name: str
) -> None:
    size = 8 * GIB if name == "model.safetensors" else 32 * 1024 * 1024
    with (checkpoint / name).open("r+b") as file:
        file.truncate(size)
    started, read_before = time.monotonic(), _bytes_read()
    message = refusal()
    assert "sparse" in message and name in message
    assert time.monotonic() - started < 5
    assert _bytes_read() - read_before < 32 * 1024 * 1024, "the sparse file was read"


def _write_with_a_hole(path: Path, size: int, hole: tuple[int, int]) -> None:
    """``size`` bytes of text at ``path``, with nothing written (a hole, read as NULs) in ``hole``."""
    with path.open("wb") as file:
        file.write(b"x" * hole[0])
        file.seek(hole[1])
        file.write(b"x" * (size - hole[1]))


@pytest.mark.parametrize(
    ("hole", "sparse"),
    [
        # Data in two stretches around a hole: 70 % data, so not sparse.
        ((7 * 64 * 1024, 13 * 64 * 1024), False),
        # A hole, then data: 30 % data, so sparse.
        ((64 * 1024, 14 * 64 * 1024), True),
    ],
)
def test_a_file_is_sparse_when_most_of_it_is_holes_wherever_they_are(
    take: Callable[..., Snapshot],
    refusal: Callable[..., str],
    checkpoint: Path,
    hole: tuple[int, int],
    sparse: bool,
) -> None:
    # The weights' index (4 MiB cap): holes read as NUL bytes, which no JSON holds, so a file
    # that is not sparse is refused for its JSON, after the sparse check let it through.
    split_into_shards(checkpoint)
    _write_with_a_hole(checkpoint / "model.safetensors.index.json", 20 * 64 * 1024, hole)
    message = refusal()
    assert ("model.safetensors.index.json is a sparse file" in message) == sparse, message
    assert sparse or "not a readable JSON file" in message


def test_an_oversize_config_is_refused_before_it_is_read(
    refusal: Callable[..., str], checkpoint: Path
) -> None:
    with (checkpoint / "config.json").open("r+b") as file:
        file.truncate(GIB)
    read_before = _bytes_read()
    message = refusal()
    assert "more than the" in message and "config.json" in message
    assert _bytes_read() - read_before < 32 * 1024 * 1024


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_is_refused_without_waiting(
    take: Callable[..., Snapshot], checkpoint: Path, name: str
) -> None:
    (checkpoint / name).unlink()
    os.mkfifo(checkpoint / name)
    outcome = _outcome_unless_blocked_on(checkpoint / name, take)
    assert isinstance(outcome, CheckpointError) and "not a regular file" in str(outcome)


def _outcome_unless_blocked_on(fifo: Path, take: Callable[..., Snapshot]) -> BaseException | Snapshot:
    """What ``take()`` answers, run in a thread of its own; the test fails if it is still blocked
    (opening ``fifo``) after 20 s, and the open is then released so no thread is left behind."""
    outcome: list[BaseException | Snapshot] = []

    def run() -> None:
        try:
            outcome.append(take())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=20)
    try:
        assert not worker.is_alive(), "the snapshot blocked opening a FIFO"
    finally:
        if worker.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(timeout=20)
    return outcome[0]


def test_a_single_shard_with_an_index_keeps_its_index(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00001.safetensors")
    header, _ = read_safetensors(checkpoint / "model-00001-of-00001.safetensors")
    weight_map = {name: "model-00001-of-00001.safetensors" for name in header if name != "__metadata__"}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    snapshot = take()
    assert snapshot.ignored_files == BASE_TOKENIZER_FILES
    index = json.loads(_files(snapshot)["model.safetensors.index.json"])
    assert index["weight_map"] == weight_map


def test_an_index_naming_files_elsewhere_is_refused(refusal: Callable[..., str], checkpoint: Path) -> None:
    split_into_shards(checkpoint)
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "../../other/model.safetensors"
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "in the same folder" in refusal()


@pytest.mark.parametrize("weight_map", [None, {}, [], ["model-00001-of-00001.safetensors"], "x"])
def test_an_index_without_a_weight_map_is_refused_with_the_fix(
    refusal: Callable[..., str], checkpoint: Path, weight_map: object
) -> None:
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00001.safetensors")
    index = {} if weight_map is None else {"weight_map": weight_map}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    message = refusal()
    assert "model.safetensors.index.json has no weight_map; " in message and "save_pretrained" in message


@pytest.mark.parametrize("shards", [MAX_SHARDS, MAX_SHARDS + 1])
def test_an_index_may_name_at_most_max_shards_files(
    refusal: Callable[..., str], checkpoint: Path, shards: int
) -> None:
    (checkpoint / "model.safetensors").unlink()
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    weight_map = {f"layer.{i}.weight": name for i, name in enumerate(names)}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    message = refusal()
    too_many = f"must name at most {MAX_SHARDS} *.safetensors files" in message
    assert too_many is (shards > MAX_SHARDS), message


# --- the chat template ----------------------------------------------------------------------


# --- storage --------------------------------------------------------------------------------


def test_prune_removes_only_old_unreferenced_snapshots(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path
) -> None:
    kept, orphan, young = take(), take(), take()
    old = time.time() - 7200
    for snapshot in (kept, orphan):
        for path in [snapshot.path, *snapshot.path.iterdir()]:
            os.utime(path, (old, old))
    assert prune_snapshots(snapshots, {kept.name}) == [orphan.name]
    assert kept.path.is_dir() and young.path.is_dir() and not orphan.path.exists()


@pytest.mark.parametrize(
    "model_path", ["output/a\0b", "output/" + "x" * 300, "output/ckpt/../../output/ckpt\0"]
)
def test_unopenable_paths_are_refused_with_the_fix(refusal: Callable[..., str], model_path: str) -> None:
    assert "cannot be opened" in refusal(model_path)


def test_a_full_snapshot_storage_refuses_for_now_not_for_good(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    free = shutil.disk_usage(snapshots.parent).free
    monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", free + 1)
    with pytest.raises(ServiceUnavailableError, match="retry once queued evaluations have finished"):
        take()
    assert list(snapshots.iterdir()) == []


@pytest.mark.parametrize("rewritten", ["model.safetensors", "config.json"])
def test_a_file_rewritten_in_place_after_its_copy_is_refused(
    refusal: Callable[..., str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch, rewritten: str
) -> None:
    """A writer racing the copy: the bytes already copied and hashed no longer match the folder, so
    the re-check after the copy refuses the submission (same inode and size, new bytes and mtime)."""
    from autorl.checkpoints import snapshot as snapshot_module

    copy_weights = snapshot_module._copy_weights

    def copy_then_rewrite(opened: Any, header: Any, writer: Any) -> None:
        copy_weights(opened, header, writer)
        path = checkpoint / rewritten
        before = path.stat()
        data = bytearray(path.read_bytes())
        data[-2] ^= 0x01
        with path.open("r+b") as handle:
            handle.write(data)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
        assert (path.stat().st_ino, path.stat().st_size) == (before.st_ino, before.st_size)

    monkeypatch.setattr(snapshot_module, "_copy_weights", copy_then_rewrite)
    assert "changed while they were being submitted" in refusal()


# --- what each refusal says, at the limits ----------------------------------------------------


def test_storage_left_with_exactly_its_reserve_after_the_copy_takes_the_checkpoint(
    workspace: Path, tiny_base_model: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reserve is what must be left, no more: the refusal names the free bytes and the size, and
    with the reserve set to exactly their difference the checkpoint is taken. The storage is a
    tmpfs (/dev/shm), whose free space only moves with what is written to it."""
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    storage = Path(tempfile.mkdtemp(prefix="autorl-snapshots-", dir="/dev/shm"))
    try:
        take = _taker(workspace, tiny_base_model, storage)
        counts = re.compile(r"has (\d+) bytes free, too few to take this (\d+)-byte checkpoint")
        monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(storage).total)
        with pytest.raises(ServiceUnavailableError) as caught:
            take()
        for _ in range(20):
            found = counts.search(str(caught.value))
            assert found is not None, caught.value
            free, needed = map(int, found.groups())
            monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", free - needed)
            try:
                take()
            except ServiceUnavailableError as refused:
                now = counts.search(str(refused))
                assert now is not None and int(now.group(1)) != free, (
                    f"refused with the reserve left: {refused}"
                )
                caught.value = refused  # someone else wrote to /dev/shm meanwhile: again
                continue
            return
        pytest.fail("the free space of /dev/shm never held still")
    finally:
        shutil.rmtree(storage)


def test_a_full_snapshot_storage_says_who_can_grow_it(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autorl.checkpoints import snapshot as snapshot_module
    from autorl.errors import ServiceUnavailableError

    monkeypatch.setattr(snapshot_module, "MIN_FREE_BYTES", shutil.disk_usage(snapshots.parent).total)
    with pytest.raises(ServiceUnavailableError) as caught:
        take()
    assert re.fullmatch(
        rf"the evaluator storage \({re.escape(str(snapshots))}\) has \d+ bytes free, too few to take "
        r"this \d+-byte checkpoint; retry once queued evaluations have finished \(operators: grow "
        r"AUTORL_SNAPSHOT_DIR's volume\)",
        str(caught.value),
    ), caught.value


def test_ignored_links_are_listed_as_links_not_as_what_they_point_to(
    take: Callable[..., Snapshot], checkpoint: Path, tmp_path: Path
) -> None:
    (checkpoint / "checkpoint-500").mkdir()
    (checkpoint / "latest").symlink_to(checkpoint / "checkpoint-500", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (checkpoint / "runs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (checkpoint / "dangling").symlink_to(tmp_path / "not-there")
    assert take().ignored_files == _with_base_files("checkpoint-500/", "dangling", "latest", "runs")


def test_an_ignored_name_that_is_not_utf8_is_listed_escaped(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    os.close(os.open(os.fsencode(checkpoint) + b"/notes-\xff\xfe.txt", os.O_WRONLY | os.O_CREAT, 0o644))
    os.mkdir(os.fsencode(checkpoint) + b"/run-\xe9")
    assert take().ignored_files == _with_base_files("notes-\\udcff\\udcfe.txt", "run-\\udce9/")


def test_a_symlinked_model_file_is_refused_with_the_whole_fix(
    refusal: Callable[..., str], checkpoint: Path, tiny_base_model: Path
) -> None:
    (checkpoint / "config.json").unlink()
    (checkpoint / "config.json").symlink_to(tiny_base_model / "config.json")
    assert refusal() == (
        "output/ckpt/config.json is a symbolic link, and links are never followed; copy the file "
        "into the checkpoint folder instead of linking it (model.save_pretrained(path) writes real files)"
    )


def _linked_base(tiny_base_model: Path, tmp_path: Path) -> Path:
    """The base model laid out like a hub cache: each file a link to a blob elsewhere."""
    blobs, linked = tmp_path / "blobs", tmp_path / "linked-base"
    shutil.copytree(tiny_base_model, blobs)
    linked.mkdir()
    for blob in blobs.iterdir():
        (linked / blob.name).symlink_to(blob)
    return linked


def test_the_base_models_links_are_followed(tiny_base_model: Path, tmp_path: Path, snapshots: Path) -> None:
    linked = _linked_base(tiny_base_model, tmp_path)
    snapshot = snapshot_base_model(linked, snapshots)
    assert not any(path.is_symlink() for path in snapshot.path.iterdir())
    assert (snapshot.path / "model.safetensors").read_bytes() == (
        tiny_base_model / "model.safetensors"
    ).read_bytes()
    assert snapshot.fingerprint == snapshot_base_model(tiny_base_model, snapshots).fingerprint


def test_a_base_model_link_to_nothing_is_refused(
    tiny_base_model: Path, tmp_path: Path, snapshots: Path
) -> None:
    linked = _linked_base(tiny_base_model, tmp_path)
    (tmp_path / "blobs" / "generation_config.json").unlink()
    with pytest.raises(CheckpointError) as caught:
        snapshot_base_model(linked, snapshots)
    assert str(caught.value) == _CHANGED


def test_a_file_that_cannot_be_opened_is_named_with_the_reason(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path
) -> None:
    """Out of descriptors after the first file: the second one is named, with the system's reason."""
    import resource

    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(4)]
    for fd in held:
        os.close(fd)
    # The submitted folder and the base model's folder take two of the three free descriptors,
    # the first file opened (config.json) the third, the second file (model.safetensors) none.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (held[3], hard))
    try:
        with pytest.raises(CheckpointError) as caught:
            take()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert str(caught.value) == (
        "output/ckpt/model.safetensors cannot be opened (Too many open files); save the model with "
        "model.save_pretrained(path) and tokenizer.save_pretrained(path)"
    )
    assert list(snapshots.iterdir()) == []


@pytest.mark.parametrize("size", [1024 * 1024, 1024 * 1024 + 1])
def test_a_file_of_exactly_its_size_cap_is_accepted(
    take: Callable[..., Snapshot], refusal: Callable[..., str], checkpoint: Path, size: int
) -> None:
    config = (checkpoint / "config.json").read_bytes()
    (checkpoint / "config.json").write_bytes(config + b" " * (size - len(config)))
    if size == 1024 * 1024:
        assert "config.json" in _files(take())
    else:
        assert "is 1048577 bytes, more than the 1048576 allowed for config.json" in refusal()


@pytest.mark.parametrize(
    ("size", "hole", "sparse"),
    [
        # 1 MiB at most: never held to the rule, holes or not.
        (1024 * 1024, (4096, 1024 * 1024), False),
        # Exactly half data: not sparse.
        (2 * 1024 * 1024, (1024 * 1024, 2 * 1024 * 1024), False),
        # A hole of 1 MiB, then 2 bytes less than half the file: sparse.
        (2 * 1024 * 1024 - 2, (0, 1024 * 1024), True),
    ],
    ids=["one-mib", "half", "just-under-half"],
)
def test_the_sparse_file_limits(
    take: Callable[..., Snapshot],
    refusal: Callable[..., str],
    checkpoint: Path,
    size: int,
    hole: tuple[int, int],
    sparse: bool,
) -> None:
    # The weights' index is the one file besides the weights that may exceed 1 MiB; holes read as
    # NUL bytes, which no JSON holds, so a file that is not sparse is refused for its JSON.
    split_into_shards(checkpoint)
    index = checkpoint / "model.safetensors.index.json"
    _write_with_a_hole(index, size, hole)
    with index.open("r+b") as file:
        file.truncate(size)  # a hole that ends the file
    message = refusal()
    assert ("model.safetensors.index.json is a sparse file" in message) == sparse
    assert sparse or "not a readable JSON file" in message


@pytest.mark.parametrize("change", [b"appended", b""], ids=["grown", "shrunk"])
def test_a_small_file_changed_before_it_is_read_is_refused(
    refusal: Callable[..., str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch, change: bytes
) -> None:
    """A writer racing the snapshot: config.json changes size after it was opened and checked,
    before its bytes are read (the weights' header check comes in between)."""
    from autorl.checkpoints import snapshot as snapshot_module

    compare = snapshot_module.compare_to_base

    def compare_then_rewrite(*args: Any) -> None:
        compare(*args)
        path = checkpoint / "config.json"
        data = path.read_bytes()
        with path.open("r+b") as handle:
            if change:
                handle.seek(0, os.SEEK_END)
                handle.write(change)
            else:
                handle.truncate(len(data) - 10)

    monkeypatch.setattr(snapshot_module, "compare_to_base", compare_then_rewrite)
    assert refusal() == _CHANGED


#: Permission checks need a process that modes deny: user 0 with every capability dropped.
_NEEDS_SETPRIV = pytest.mark.requires(
    os.geteuid() == 0 and shutil.which("setpriv") is not None,
    reason="needs root and setpriv to drop capabilities",
)


def _unprivileged_refusal(model_path: str, workspace: Path, tiny_base_model: Path, snapshots: Path) -> str:
    """The refusal of a snapshot taken as user 0 without capabilities (denied by modes like anyone)."""
    import subprocess
    import sys

    program = (
        "from pathlib import Path\n"
        "from autorl.checkpoints.snapshot import snapshot_submission\n"
        "try:\n"
        f"    snapshot_submission({model_path!r}, workspace=Path({str(workspace)!r}),\n"
        f"        output_dir=Path({str(workspace / 'output')!r}),\n"
        f"        base_model_dir=Path({str(tiny_base_model)!r}),\n"
        f"        snapshot_root=Path({str(snapshots)!r}))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    unprivileged = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]
    done = subprocess.run(
        [*unprivileged, sys.executable, "-P", "-c", program], capture_output=True, text=True, timeout=120
    )
    return done.stdout.strip() + done.stderr


@_NEEDS_SETPRIV
def test_a_file_the_grader_may_not_read_is_named_with_its_fix(
    checkpoint: Path, workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    """As user 0 without capabilities (the owner of a mode-000 file, denied like anyone)."""
    (checkpoint / "config.json").chmod(0)
    refused = _unprivileged_refusal("output/ckpt", workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        "UnreadableCheckpointError $WORKSPACE/output/ckpt/config.json cannot be read by the grader "
        "(permission denied): the grader reads checkpoints through the workspace's group, and this "
        "file gives the group no read permission"
    ), refused
    assert 'Run chmod -R g+rX "$WORKSPACE/output/ckpt" and submit again' in refused


@_NEEDS_SETPRIV
def test_a_checkpoint_saved_into_output_itself_is_named_as_the_agent_names_it(
    workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    """A checkpoint saved straight into OUTPUT_DIR (model.save_pretrained(OUTPUT_DIR)) and submitted
    as "output": its unreadable file and the fix name the folder as the agent does."""
    shutil.rmtree(workspace / "output")
    shutil.copytree(tiny_base_model, workspace / "output")
    (workspace / "output" / "config.json").chmod(0)
    refused = _unprivileged_refusal("output", workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        "UnreadableCheckpointError $WORKSPACE/output/config.json cannot be read by the grader "
    ), refused
    assert 'Run chmod -R g+rX "$WORKSPACE/output" and submit again' in refused


# --- the submitted path and the folder's weights, message by message ---------------------------

_UNREADABLE_FOLDER = (
    "{name} cannot be read by the grader (permission denied): the grader reads checkpoints through "
    "the workspace's group, and this folder gives the group no read and search permission "
    "(safetensors and tempfile create files 0600, mkdtemp folders 0700; in a pod the platform adds "
    'group-read within seconds of a save, but not here). Run chmod -R g+rX "{name}" and submit '
    "again; this refusal does not count against your submission limit"
)


@_NEEDS_SETPRIV
def test_an_output_folder_the_grader_may_not_read_is_named_as_the_agent_names_it(
    checkpoint: Path, workspace: Path, tiny_base_model: Path, snapshots: Path
) -> None:
    (workspace / "output").chmod(0)
    try:
        refused = _unprivileged_refusal("output/ckpt", workspace, tiny_base_model, snapshots)
    finally:
        (workspace / "output").chmod(0o755)
    assert refused == "UnreadableCheckpointError " + _UNREADABLE_FOLDER.format(name="$WORKSPACE/output")


@_NEEDS_SETPRIV
@pytest.mark.parametrize("mode", [0o000, 0o400], ids=["unopenable", "unsearchable"])
def test_a_folder_on_the_path_the_grader_may_not_read_is_named_with_its_fix(
    workspace: Path, tiny_base_model: Path, snapshots: Path, mode: int
) -> None:
    runs = workspace / "output" / "runs"
    shutil.copytree(tiny_base_model, runs / "ckpt")
    runs.chmod(mode)
    try:
        refused = _unprivileged_refusal("output/runs/ckpt", workspace, tiny_base_model, snapshots)
    finally:
        runs.chmod(0o755)
    assert refused == "UnreadableCheckpointError " + _UNREADABLE_FOLDER.format(name="$WORKSPACE/output/runs")


@_NEEDS_SETPRIV
def test_a_workspace_named_through_a_link_is_submitted_through_its_real_path(
    tiny_base_model: Path, tmp_path: Path, snapshots: Path
) -> None:
    """The platform's path to output/ (the real path of the folder holding it) is accepted; a file
    the grader may not read there is named by that path, the agent's name for it being unknown."""
    real = tmp_path / "real-workspace"
    shutil.copytree(tiny_base_model, real / "output" / "ckpt")
    workspace = tmp_path / "workspace"
    workspace.symlink_to(real, target_is_directory=True)
    take = _taker(workspace, tiny_base_model, snapshots)
    assert "model.safetensors" in _files(take(real / "output" / "ckpt"))
    (real / "output" / "ckpt" / "config.json").chmod(0)
    refused = _unprivileged_refusal(str(real / "output" / "ckpt"), workspace, tiny_base_model, snapshots)
    assert refused.startswith(
        f"UnreadableCheckpointError {real}/output/ckpt/config.json cannot be read by the grader "
    ), refused
    assert f'Run chmod -R g+rX "{real}/output/ckpt" and submit again' in refused


def test_the_output_folder_as_a_link_is_refused_with_the_whole_fix(
    refusal: Callable[..., str], workspace: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    shutil.rmtree(workspace / "output")
    shutil.copytree(tiny_base_model, tmp_path / "real" / "ckpt")
    (workspace / "output").symlink_to(tmp_path / "real", target_is_directory=True)
    assert re.fullmatch(
        rf"this experiment's output folder {re.escape(str(workspace / 'output'))} cannot be opened "
        r"\([^)]+\); it must be a plain folder, not a link: save the model under OUTPUT_DIR and submit "
        r"that folder",
        refusal("output/ckpt"),
    )


@pytest.mark.parametrize("entries", [10_000, 10_001])
def test_a_folder_may_hold_at_most_max_entries_entries(
    take: Callable[..., Snapshot], refusal: Callable[..., str], checkpoint: Path, entries: int
) -> None:
    for number in range(entries - len(os.listdir(checkpoint))):
        (checkpoint / f"step-{number:05}.log").touch()
    assert len(os.listdir(checkpoint)) == entries
    if entries == 10_000:
        assert len(take().ignored_files) == 100
    else:
        assert refusal() == (
            "output/ckpt holds more than 10000 entries; save the model into a folder of its own with "
            "model.save_pretrained(path) and submit that folder"
        )


def test_weight_refusals_say_exactly_what_to_do(
    refusal: Callable[..., str], checkpoint: Path, workspace: Path
) -> None:
    (checkpoint / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    assert refusal() == (
        "output/ckpt holds adapter_config.json: a LoRA/PEFT adapter, not a full model; merge it with "
        "model = model.merge_and_unload() and save the full model with model.save_pretrained(path) "
        "(plus the tokenizer), then submit that folder"
    )
    (checkpoint / "adapter_config.json").unlink()
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    assert refusal() == (
        "output/ckpt holds both model.safetensors and model.safetensors.index.json, two different sets "
        "of weights; save the model into a fresh folder with model.save_pretrained(path) and submit "
        "that folder"
    )
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert refusal().startswith("output/ckpt/model.safetensors.index.json is not a readable JSON file (")
    (checkpoint / "model.safetensors.index.json").unlink()
    for name in ("a.pt", "b.pth", "c.ckpt", "d.pkl", "pytorch_model.bin", "z.pt"):
        (checkpoint / name).write_bytes(b"\x80\x04pickle")
    assert refusal() == (
        "output/ckpt holds pickle weights (a.pt, b.pth, c.ckpt, d.pkl, pytorch_model.bin), which can "
        "run code when loaded and are not accepted; save the model with model.save_pretrained(path), "
        "which writes model.safetensors (safetensors is its default), and submit that folder"
    )
    for name in ("a.pt", "b.pth", "c.ckpt", "d.pkl", "pytorch_model.bin", "z.pt"):
        (checkpoint / name).unlink()
    assert refusal() == (
        "output/ckpt has no *.safetensors weights (model.safetensors); save the full model with "
        "model.save_pretrained(path) (safetensors is its default) and submit that folder"
    )


# --- a file swapped between the check of its name and its opening ------------------------------
# A racing agent can replace an entry after the snapshot's fstatat checked it and before its openat.
# The race is made exact here: the swap runs inside that fstatat, after the check it answers.


def _at_the_check_of(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    *,
    before: Callable[[], object] | None = None,
    after: Callable[[], object] | None = None,
) -> None:
    """Run ``before`` / ``after`` around the snapshot's first fstatat of the entry ``name`` (a stat
    relative to the folder's descriptor), once."""
    real_stat = os.stat
    pending = [True]

    def stat_with_a_race(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        racing = path == name and kwargs.get("dir_fd") is not None and bool(pending)
        if racing:
            pending.clear()
            if before is not None:
                before()
        info = real_stat(path, *args, **kwargs)
        if racing and after is not None:
            after()
        return info

    monkeypatch.setattr(os, "stat", stat_with_a_race)


def test_a_link_swapped_in_after_the_check_is_never_followed_even_to_the_checked_file(
    refusal: Callable[..., str], checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moved = tmp_path / "moved-config.json"

    def swap_for_a_link() -> None:
        (checkpoint / "config.json").rename(moved)
        (checkpoint / "config.json").symlink_to(moved)

    _at_the_check_of(monkeypatch, "config.json", after=swap_for_a_link)
    assert refusal() == _CHANGED


def test_a_file_replaced_by_another_after_the_check_is_refused(
    refusal: Callable[..., str], checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-config.json"
    other.write_bytes((checkpoint / "config.json").read_bytes())

    _at_the_check_of(monkeypatch, "config.json", after=lambda: other.replace(checkpoint / "config.json"))
    assert refusal() == _CHANGED


def test_a_fifo_swapped_in_after_the_check_is_refused_without_waiting(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = checkpoint / "config.json"

    def swap_for_a_fifo() -> None:
        fifo.unlink()
        os.mkfifo(fifo)

    _at_the_check_of(monkeypatch, "config.json", after=swap_for_a_fifo)
    outcome = _outcome_unless_blocked_on(fifo, take)
    assert isinstance(outcome, CheckpointError) and str(outcome) == _CHANGED


def test_an_ignored_file_that_vanishes_before_its_check_is_listed_as_a_file(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (checkpoint / "notes.txt").write_text("done")
    _at_the_check_of(monkeypatch, "notes.txt", before=(checkpoint / "notes.txt").unlink)
    assert take().ignored_files == _with_base_files("notes.txt")


def test_path_walk_refusals_say_exactly_what_to_do(
    refusal: Callable[..., str], workspace: Path, checkpoint: Path, tmp_path: Path
) -> None:
    assert refusal("output/not-there") == (
        "model_path output/not-there does not exist; save the model there first "
        "(model.save_pretrained(path) and tokenizer.save_pretrained(path)) and submit that folder"
    )
    assert refusal("output/ckpt/model.safetensors") == (
        "model_path output/ckpt/model.safetensors: output/ckpt/model.safetensors is a file, not a "
        "folder; submit the folder that save_pretrained wrote"
    )
    assert refusal("output/ckpt/model.safetensors/inner") == (
        "model_path output/ckpt/model.safetensors/inner: output/ckpt/model.safetensors is not a "
        "folder; submit the folder that save_pretrained wrote"
    )
    (tmp_path / "elsewhere").mkdir()
    (workspace / "output" / "runs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert refusal("output/runs/ckpt") == (
        "model_path output/runs/ckpt: output/runs is a symbolic link, and links are never followed; "
        "save the model into a real folder under OUTPUT_DIR and submit that folder"
    )
    unopenable = (
        "save the model into a plain folder under OUTPUT_DIR with model.save_pretrained(path) and "
        "submit that folder"
    )
    assert (
        refusal("output/a\0b")
        == f"model_path output/a\0b cannot be opened (embedded null byte); {unopenable}"
    )
    long_name = "output/" + "x" * 300
    assert refusal(long_name) == f"model_path {long_name} cannot be opened (File name too long); {unopenable}"


# --- the weights' headers: bounded by the base model's, and canonical --------------------------


def _pad_shard(path: Path, metadata_bytes: int) -> None:
    """A shard of nothing but metadata (no tensor), ``metadata_bytes`` long."""
    write_safetensors(path, {"__metadata__": {"pad": "A" * metadata_bytes}}, b"")


def test_shards_of_padding_are_refused_before_their_headers_are_read(
    refusal: Callable[..., str], checkpoint: Path
) -> None:
    """An index naming shards that hold only metadata (hard links to one 16 MiB file) would make
    the grader read and hold 16 MiB per shard before refusing: the index must name exactly the base
    model's tensors, so such shards are refused before one of them is opened."""
    shards = split_into_shards(checkpoint)
    _pad_shard(checkpoint / "pad-0.safetensors", 16 * 1024 * 1024 - 100)
    for index in range(1, 40):
        os.link(checkpoint / "pad-0.safetensors", checkpoint / f"pad-{index}.safetensors")
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    index["weight_map"].update({f"fake.{i}": f"pad-{i}.safetensors" for i in range(40)})
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    read_before = _bytes_read()
    message = refusal()
    assert "model.safetensors.index.json: the weights hold 40 tensors the base model does not have" in message
    assert _bytes_read() - read_before < 4 * 1024 * 1024
    # Named under the base model's tensors instead, the padding shard is refused for its header's size.
    index["weight_map"] = {name: shard for name, shard in index["weight_map"].items() if "fake" not in name}
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "pad-0.safetensors"
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    message = refusal()
    assert (
        shards
        and "pad-0.safetensors has a safetensors header of" in message
        and "metadata or padding" in message
    )


def test_a_header_is_read_only_within_the_base_models_allowance(
    refusal: Callable[..., str], take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    header, data = read_safetensors(checkpoint / "model.safetensors")
    header["__metadata__"] = {"format": "pt", "pad": "A" * (8 * 1024 * 1024)}
    write_safetensors(checkpoint / "model.safetensors", header, data)
    read_before = _bytes_read()
    message = refusal()
    assert "has a safetensors header of" in message and "metadata or padding" in message
    assert _bytes_read() - read_before < 1024 * 1024


def test_the_snapshot_holds_a_canonical_header_whatever_the_submitted_one_says(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    """Metadata, key order and padding of a header are not evaluated: the snapshot writes the
    canonical header, so the same tensors and data are the same model (one fingerprint), and no
    agent string rides along into the evaluator."""
    clean = take()
    header, data = read_safetensors(checkpoint / "model.safetensors")
    metadata = {"format": "pt", "note": "\x1b]0;pwned\x07", "epoch": "3"}
    reordered = {"__metadata__": metadata, **dict(reversed(list(header.items())))}
    write_safetensors(checkpoint / "model.safetensors", reordered, data)
    edited = take()
    assert edited.fingerprint == clean.fingerprint
    written, written_data = read_safetensors(edited.path / "model.safetensors")
    assert written["__metadata__"] == {"format": "pt"} and written_data == data
    assert list(written)[1:] == sorted(name for name in header if name != "__metadata__")
