"""Submission snapshots: what the threat model relies on (docs/SECURITY.md names these tests), on real
checkpoints built from the tiny model: what a snapshot holds (the submission's weights beside the
base model's normalized files) and its fingerprint, every refusal class of where the folder is and
what it holds, files changed or swapped while they are read, and the weights' headers. What each
refusal says at its limits: test_snapshot_messages.py; evaluator storage: test_snapshot_storage.py.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autorl.checkpoints import model_files
from autorl.checkpoints import snapshot as snapshot_module
from autorl.checkpoints.agent_names import MAX_NAME_CHARS
from autorl.checkpoints.snapshot import (
    MAX_SHARDS,
    Snapshot,
    snapshot_base_model,
)
from autorl.errors import (
    CheckpointError,
    CostlyCheckpointError,
    MalformedCheckpointError,
    ServiceUnavailableError,
)
from autorl.untrusted_text import CUT
from tests.support.checkpoints import (
    edit_json,
    read_safetensors,
    split_into_shards,
    write_safetensors,
)
from tests.support.snapshots import (
    BASE_TOKENIZER_FILES,
    CHANGED,
    output_as_a_link,
    snapshot_files,
    taker,
    with_base_files,
    write_with_a_hole,
)

GIB = 1024**3


# --- accepted -------------------------------------------------------------------------------


def test_snapshot_holds_normalized_copies_and_matches_the_baseline(
    take: Callable[..., Snapshot], checkpoint: Path, tiny_base_model: Path, snapshots: Path, workspace: Path
) -> None:
    snapshot = take("output/ckpt")
    assert snapshot.path.parent == snapshots
    # The checkpoint's own tokenizer and generation config are listed as not evaluated.
    assert snapshot.ignored_files == BASE_TOKENIZER_FILES
    assert sorted(snapshot_files(snapshot)) == [
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
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in snapshot_files(snapshot))
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
    assert "training_args.bin" not in snapshot_files(snapshot)


def test_a_sharded_checkpoint_gets_an_index_of_its_own(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    shards = split_into_shards(checkpoint)
    edit_json(checkpoint / "model.safetensors.index.json", metadata={"total_size": 1}, extra="ignored")
    snapshot = take()
    files = snapshot_files(snapshot)
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
    assert (
        snapshot_files(hostile)
        == snapshot_files(clean)
        == snapshot_files(snapshot_base_model(tiny_base_model, snapshots))
    )
    assert hostile.fingerprint == clean.fingerprint


def test_the_base_models_template_and_stop_tokens_are_evaluated(
    take: Callable[..., Snapshot], checkpoint: Path, tiny_base_model: Path
) -> None:
    base_config = json.loads((tiny_base_model / "tokenizer_config.json").read_text())
    base_generation = json.loads((tiny_base_model / "generation_config.json").read_text())
    edit_json(checkpoint / "tokenizer_config.json", chat_template=_COMPUTING_TEMPLATE)
    edit_json(checkpoint / "generation_config.json", eos_token_id=[4, 5, 6], temperature=1.7)
    files = snapshot_files(take())
    assert json.loads(files["tokenizer_config.json"])["chat_template"] == base_config["chat_template"]
    kept = json.loads(files["generation_config.json"])
    assert set(kept) == {"eos_token_id", "pad_token_id"}
    assert kept["eos_token_id"] == base_generation["eos_token_id"]


def test_a_tied_output_embedding_is_the_input_embedding_whatever_a_submission_stores(
    tiny_base_model: Path, workspace: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base whose config ties its output embedding to its input embedding and stores both (as
    some Qwen3 checkpoints ship): a submission without the head (transformers' save of a tied
    model) is accepted, and one with a head of its own is evaluated as the config says, the head
    left out, whichever file holds it; every engine then loads the same model."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    base = Path(shutil.copytree(tiny_base_model, workspace / "base"))
    weights = load_file(str(base / "model.safetensors"))
    embedding = weights["model.embed_tokens.weight"]
    assert json.loads((base / "config.json").read_text())["tie_word_embeddings"] is True
    save_file({**weights, "lm_head.weight": embedding.clone()}, str(base / "model.safetensors"))
    take = taker(workspace, base, snapshots)
    baseline = snapshot_base_model(base, snapshots)
    assert "lm_head.weight" not in read_safetensors(baseline.path / "model.safetensors")[0]

    def submitted(name: str, head: torch.Tensor | None, *, shards: bool = False) -> Path:
        folder = workspace / "output" / name
        folder.mkdir(parents=True)
        shutil.copy(base / "config.json", folder / "config.json")
        own = {key: value + 0.5 for key, value in weights.items()}
        if not shards:
            save_file(
                {**own, **({"lm_head.weight": head} if head is not None else {})},
                str(folder / "model.safetensors"),
            )
            return folder
        save_file(own, str(folder / "a.safetensors"))
        index = {name: "a.safetensors" for name in own}
        if head is not None:
            save_file({"lm_head.weight": head}, str(folder / "b.safetensors"))
            index["lm_head.weight"] = "b.safetensors"
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
        return folder

    other_head = torch.randn(embedding.shape)
    saved_tied = take(submitted("saved", None).relative_to(workspace))
    own_head = take(submitted("own_head", other_head).relative_to(workspace))
    # What the submission stored as its head changes nothing that is evaluated.
    assert own_head.fingerprint == saved_tied.fingerprint
    copied = read_safetensors(own_head.path / "model.safetensors")
    assert "lm_head.weight" not in copied[0]
    kept = load_file(str(own_head.path / "model.safetensors"))
    assert kept.keys() == weights.keys() - {"lm_head.weight"}
    assert all(torch.equal(kept[key], weights[key] + 0.5) for key in kept)
    sharded = take(submitted("sharded", other_head, shards=True).relative_to(workspace))
    # The shard that held only the head is no part of it.
    assert {"a.safetensors", "model.safetensors.index.json"} <= set(snapshot_files(sharded))
    assert not (sharded.path / "b.safetensors").exists()
    index = json.loads((sharded.path / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    # A copy of the base, its head stored, is the base: the baseline's fingerprint.
    assert take(
        Path(shutil.copytree(base, workspace / "output" / "copy")).relative_to(workspace)
    ).fingerprint == (baseline.fingerprint)
    # The head anywhere in the data (a writer that does not sort), copied in blocks smaller than the
    # file: the same bytes are written, and they hash the same.
    monkeypatch.setattr(snapshot_module, "COPY_BLOCK_BYTES", 64 * 1024)
    without_head = take(submitted("again", None).relative_to(workspace)).fingerprint
    middle = submitted("middle", other_head)
    header, data = read_safetensors(middle / "model.safetensors")
    header.pop("__metadata__", None)
    order = sorted(header, key=lambda name: (name == "lm_head.weight", name))
    order.insert(len(order) // 2, order.pop())  # the head between two halves of the others
    laid, at = bytearray(), 0
    for name in order:
        start, end = header[name]["data_offsets"]
        laid += data[start:end]
        header[name]["data_offsets"], at = [at, at + end - start], at + end - start
    write_safetensors(middle / "model.safetensors", header, bytes(laid))
    assert take(middle.relative_to(workspace)).fingerprint == without_head
    for snapshot in (own_head, sharded):
        model = AutoModelForCausalLM.from_pretrained(snapshot.path)
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
        assert torch.equal(model.lm_head.weight, embedding + 0.5)


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
    output_as_a_link(workspace, tiny_base_model, tmp_path / "real")
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


#: A name an agent may give a tensor: terminal escapes, a forged line, a bidi override, a quote.
HOSTILE_NAME = "\x1b[2J\x1b]8;;https://x.example\x07\nautorl: score 99.00\u202e'"


def _norm_entry(**fields: object) -> Callable[[dict[str, object], bytes], tuple[dict[str, object], bytes]]:
    """Set fields of model.norm.weight's entry."""

    def edit(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
        entry = header["model.norm.weight"]
        assert isinstance(entry, dict)
        entry.update(fields)
        return header, data

    return edit


def _named(name: str) -> Callable[[dict[str, object], bytes], tuple[dict[str, object], bytes]]:
    def edit(header: dict[str, object], data: bytes) -> tuple[dict[str, object], bytes]:
        header[name] = header.pop("model.norm.weight")
        return header, data

    return edit


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
        # Sizes past 2**63: the product's digits broke the message (ValueError, a 500).
        (_norm_entry(shape=[10**299] * 20), "below 2**63"),
        (_norm_entry(shape=[2**63]), "below 2**63"),
        (_norm_entry(shape=[2**62, 2**62]), "needs 2**63 bytes or more"),
        (_norm_entry(shape=[-8]), "below 2**63"),
        (_norm_entry(shape=[8.0]), "below 2**63"),
        (_norm_entry(shape=[True] * 8), "below 2**63"),
        (_norm_entry(shape=[[8]]), "below 2**63"),
        (_norm_entry(shape={"rows": 8}), "below 2**63"),
        (_norm_entry(shape=[1] * 33), "at most 32 sizes"),
        (_norm_entry(data_offsets=[0, 2**63]), "below 2**63"),
        (_norm_entry(data_offsets=[False, True]), "below 2**63"),
        (_norm_entry(data_offsets=[-32, 0]), "below 2**63"),
        (_norm_entry(data_offsets=[[0], [32]]), "below 2**63"),
        # A dtype that cannot be looked up (unhashable: a TypeError, a 500).
        (_norm_entry(dtype=["F32"]), 'unknown dtype ["F32"]'),
        (_norm_entry(dtype={"F32": 1}), 'unknown dtype {"F32": 1}'),
        (_norm_entry(shape=[float("nan")]), "NaN is not a JSON value"),
        (_norm_entry(data_offsets=[0, float("inf")]), "Infinity is not a JSON value"),
        (_named("w" * 2_000), "names a tensor of 2000 characters"),
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
    assert named in message and "save_pretrained" in message, message
    assert len(message) < 600, message


def _index(checkpoint: Path, **entries: object) -> None:
    """Shard the checkpoint and set entries of its index's weight_map."""
    split_into_shards(checkpoint)
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    index["weight_map"].update(entries)
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "shard",
    # Unhashable values were a TypeError (a 500); the rest named the wrong fix or a 300-character name.
    [["model-00001-of-00002.safetensors"], {"x": 1}, 7, None, True, "m" * 300 + ".safetensors"],
)
def test_an_index_mapping_a_tensor_to_anything_but_a_shard_name_is_refused(
    refusal: Callable[..., str], checkpoint: Path, shard: object
) -> None:
    _index(checkpoint, **{"model.norm.weight": shard})
    message = refusal()
    assert message.startswith(
        "output/ckpt/model.safetensors.index.json maps tensor 'model.norm.weight' to "
    ), message
    assert "not to the name of a *.safetensors file in the same folder" in message
    assert len(message) < 400, message


def test_tensor_names_in_refusals_are_escaped_and_bounded(
    refusal: Callable[..., str], checkpoint: Path
) -> None:
    """However an agent names its tensors, a refusal shows each name escaped, between quotes, in at
    most MAX_NAME_CHARS characters, and at most MAX_NAMES_SHOWN of them."""
    shard = "model-00001-of-00002.safetensors"
    _index(checkpoint, **{HOSTILE_NAME: shard, **{f"{i}" + "A" * 900: shard for i in range(5)}})
    message = refusal()
    assert message.isprintable(), message
    assert "('\\x1b[2J\\x1b]8;;https://x.example\\x07\\nautorl: score 99.00\\u202e\\'', '0AAA" in message
    assert f"'0{'A' * (MAX_NAME_CHARS - 2)}{CUT}'" in message
    assert "6 tensors the base model does not have (" in message and " and 3 more)" in message
    assert len(message) < 800, message


def test_a_header_names_no_tensor_longer_than_any_models(
    refusal: Callable[..., str], checkpoint: Path
) -> None:
    name = HOSTILE_NAME * 40  # 1,960 characters, well within the header allowance
    _rewrite_header(checkpoint, _named(name))
    message = refusal()
    assert message.isprintable() and len(message) < 500, message
    assert f"names a tensor of {len(name)} characters ('\\x1b[2J" in message and "…')" in message


def test_a_tensor_stored_twice_is_named_escaped(refusal: Callable[..., str], checkpoint: Path) -> None:
    shards = split_into_shards(checkpoint)
    for shard in shards:
        header, data = read_safetensors(checkpoint / shard)
        header[HOSTILE_NAME] = {"dtype": "U8", "shape": [1], "data_offsets": [len(data), len(data) + 1]}
        write_safetensors(checkpoint / shard, header, data + b"\0")
    message = refusal()
    assert message.isprintable(), message
    assert message.startswith("output/ckpt: tensor '\\x1b[2J"), message
    assert f"is stored twice ('{shards[0]}' and '{shards[1]}')" in message


def test_a_check_failing_unforeseen_on_the_files_is_a_refusal_at_no_cost(
    take: Callable[..., Snapshot], snapshots: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a check of the files raises that no rule names is a refusal with the fix, before any
    weight data is read (not a CostlyCheckpointError), the failure kept as its cause."""

    def unforeseen(*args: object) -> None:
        raise TypeError("a value no check expected")

    monkeypatch.setattr(model_files, "check_config", unforeseen)
    with pytest.raises(MalformedCheckpointError) as caught:
        take()
    assert not isinstance(caught.value, CostlyCheckpointError)
    assert isinstance(caught.value.__cause__, TypeError)
    assert str(caught.value) == (
        "output/ckpt: the checkpoint's files could not be read as a model (TypeError while checking "
        "them); save the model with model.save_pretrained(path), which writes safetensors, and submit "
        "that folder"
    )
    assert list(snapshots.iterdir()) == []


def test_a_failure_while_copying_stays_the_platforms(
    take: Callable[..., Snapshot], snapshots: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy into the snapshot storage is the platform's: what fails there is no refusal."""

    def broken(*args: object) -> None:
        raise TypeError("the platform's own fault")

    monkeypatch.setattr(snapshot_module, "_copy_weights", broken)
    with pytest.raises(TypeError):
        take()
    assert list(snapshots.iterdir()) == []


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
    write_with_a_hole(checkpoint / "model.safetensors.index.json", 20 * 64 * 1024, hole)
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
    index = json.loads(snapshot_files(snapshot)["model.safetensors.index.json"])
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


@pytest.mark.parametrize("rewritten", ["model.safetensors", "config.json"])
def test_a_file_rewritten_in_place_after_its_copy_is_refused(
    refusal: Callable[..., str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch, rewritten: str
) -> None:
    """A writer racing the copy: the bytes already copied and hashed no longer match the folder, so
    the re-check after the copy refuses the submission (same inode and size, new bytes and mtime)."""
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


def _appended(weights: Path) -> None:
    with weights.open("ab") as opened:
        opened.write(b"\0" * 1024)


def _rewritten_with_its_time_set_back(weights: Path) -> None:
    """Its last bytes changed in place, the same size, its modification time set back: what an agent,
    owning its files, can do to each of them."""
    before = weights.stat()
    with weights.open("r+b") as opened:
        opened.seek(-4, os.SEEK_END)
        last = opened.read(4)
        opened.seek(-4, os.SEEK_END)
        opened.write(bytes(byte ^ 0xFF for byte in last))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns


#: How an agent's process can change a weights file under the grader.
WEIGHT_EDITS = {
    "appended": _appended,
    "rewritten_in_place_with_its_time_set_back": _rewritten_with_its_time_set_back,
}


@pytest.fixture(params=list(WEIGHT_EDITS))
def edit_weights(request: pytest.FixtureRequest, checkpoint: Path) -> Callable[[], None]:
    """Changes the checkpoint's weights file in one of the ways of WEIGHT_EDITS (a test each)."""
    edit = WEIGHT_EDITS[request.param]
    return lambda: edit(checkpoint / "model.safetensors")


def test_weights_changed_under_the_copy_stop_it_and_are_a_costly_refusal(
    take: Callable[..., Snapshot],
    snapshots: Path,
    checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    edit_weights: Callable[[], None],
) -> None:
    """Bytes changed as the copy starts: the copy stops at the block where the change shows, and
    the refusal is a CostlyCheckpointError (tensor data was read: the grader counts it)."""
    monkeypatch.setattr(snapshot_module, "COPY_BLOCK_BYTES", 64 * 1024)
    monkeypatch.setattr(snapshot_module, "COPY_THREADS", 2)
    copy_weights, reads = snapshot_module._copy_weights, []
    pread = os.pread

    def counted_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(size)
        return pread(fd, size, offset)

    def edit_then_copy(opened: Any, header: Any, writer: Any) -> None:
        edit_weights()
        monkeypatch.setattr(snapshot_module.os, "pread", counted_pread)
        copy_weights(opened, header, writer)

    monkeypatch.setattr(snapshot_module, "_copy_weights", edit_then_copy)
    blocks = -(-(checkpoint / "model.safetensors").stat().st_size // (64 * 1024))
    with pytest.raises(CostlyCheckpointError) as caught:
        take()
    assert blocks > 10 and str(caught.value) == CHANGED and reads == [64 * 1024]
    assert list(snapshots.iterdir()) == []


@pytest.mark.parametrize("threads", [1, 3])
def test_the_weights_digest_is_over_their_blocks_in_order_whatever_the_threads(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """The snapshot's weights are the submitted bytes (a canonical header before them), and their
    digest is SHA-256 over the header and each block's SHA-256 in file order: the same fingerprint
    however many threads hashed the blocks, and whatever order they finished in."""
    import hashlib

    block = 48 * 1024
    monkeypatch.setattr(snapshot_module, "COPY_BLOCK_BYTES", block)
    monkeypatch.setattr(snapshot_module, "COPY_THREADS", threads)
    sha256, finished = hashlib.sha256, []

    def slow_first_block(data: bytes = b"") -> Any:  # the first block finishes last
        if len(data) == block and not finished:
            finished.append(True)
            time.sleep(0.2 if threads > 1 else 0)
        return sha256(data)

    monkeypatch.setattr(snapshot_module.hashlib, "sha256", slow_first_block)
    snapshot = take()
    monkeypatch.setattr(snapshot_module.hashlib, "sha256", sha256)
    copied = (snapshot.path / "model.safetensors").read_bytes()
    submitted = (checkpoint / "model.safetensors").read_bytes()
    header_bytes = 8 + int.from_bytes(copied[:8], "little")
    data = copied[header_bytes:]
    assert data == submitted[8 + int.from_bytes(submitted[:8], "little") :] and len(data) > 10 * block
    blocks = b"".join(sha256(data[at : at + block]).digest() for at in range(0, len(data), block))
    files = {
        path.name: sha256(path.read_bytes()).digest()
        for path in snapshot.path.iterdir()
        if path.name != "model.safetensors"
    }
    files["model.safetensors"] = sha256(copied[:header_bytes] + blocks).digest()
    expected = sha256(b"autorl-snapshot-v3\0")
    for name in sorted(files):
        expected.update(len(name.encode()).to_bytes(8, "big") + name.encode() + files[name])
    assert snapshot.fingerprint == expected.hexdigest()


def test_a_block_that_cannot_be_written_stops_the_copy_and_leaves_nothing(
    take: Callable[..., Snapshot], snapshots: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk, say) ends the copy: the blocks after it are never read, the
    error is the storage's (not a refusal of the checkpoint), and the folder is removed."""
    import errno

    monkeypatch.setattr(snapshot_module, "COPY_BLOCK_BYTES", 32 * 1024)
    monkeypatch.setattr(snapshot_module, "COPY_THREADS", 2)
    reads, pread = [], os.pread

    def counted_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(offset)
        return pread(fd, size, offset)

    def full_disk(*_: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot_module.os, "pread", counted_pread)
    monkeypatch.setattr(snapshot_module.os, "pwrite", full_disk)
    with pytest.raises(OSError, match="No space left"):
        take()
    blocks = -(-(checkpoint / "model.safetensors").stat().st_size // (32 * 1024))
    assert blocks > 10 and len(reads) == 1
    assert list(snapshots.iterdir()) == []


def test_weights_changed_before_their_data_is_read_are_refused_at_no_cost(
    take: Callable[..., Snapshot],
    snapshots: Path,
    monkeypatch: pytest.MonkeyPatch,
    edit_weights: Callable[[], None],
) -> None:
    """A change after the header and config checks, before the first tensor byte: refused by the
    re-check before the copy, which never starts; not a CostlyCheckpointError."""

    def never_copy(*args: Any) -> None:
        raise AssertionError("the weights were copied")

    platform_files = snapshot_module._platform_files

    def read_then_edit(*args: Any) -> dict[str, bytes]:
        files = platform_files(*args)
        edit_weights()
        return files

    written: list[str] = []
    write = snapshot_module._Writer.write

    def recorded(writer: Any, name: str, data: bytes) -> None:
        written.append(name)
        write(writer, name, data)

    monkeypatch.setattr(snapshot_module, "_copy_weights", never_copy)
    monkeypatch.setattr(snapshot_module, "_platform_files", read_then_edit)
    monkeypatch.setattr(snapshot_module._Writer, "write", recorded)
    with pytest.raises(CheckpointError) as caught:
        take()
    assert str(caught.value) == CHANGED and not isinstance(caught.value, CostlyCheckpointError)
    # Refused at no cost to the agent, and at none to the evaluator storage: nothing was written.
    assert written == [] and list(snapshots.iterdir()) == []


def test_the_descriptors_a_copy_holds_do_not_grow_with_the_number_of_weights_files(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grader takes every experiment's snapshots under one limit of open files: the same weights
    saved one tensor a file hold no more of them while copied than saved as one file."""
    held: list[int] = []
    copy_weights = snapshot_module._copy_weights

    def counted(*args: Any) -> None:
        held.append(len(os.listdir("/proc/self/fd")))
        copy_weights(*args)

    monkeypatch.setattr(snapshot_module, "_copy_weights", counted)
    take()
    one_file = max(held)
    held.clear()
    shards = split_into_shards(checkpoint, count=None)
    snapshot = take()
    assert len(shards) > 20 and len(held) == len(shards)
    assert max(held) <= one_file + 1  # the index, open beside the config
    assert set(shards) <= {path.name for path in snapshot.path.iterdir()}


def test_a_weights_file_replaced_after_its_header_was_read_is_refused(
    take: Callable[..., Snapshot], checkpoint: Path, snapshots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each weights file is closed after its header is read and opened again for the copy: a file
    put in its place in between (another save's) is refused, not copied beside the others."""
    shards = split_into_shards(checkpoint)
    read_headers = snapshot_module._read_headers

    def read_then_replace(*args: Any) -> Any:
        found = read_headers(*args)
        replacement = checkpoint / "replacement"
        shutil.copyfile(checkpoint / shards[1], replacement)
        os.replace(replacement, checkpoint / shards[1])  # the same bytes, another file
        return found

    monkeypatch.setattr(snapshot_module, "_read_headers", read_then_replace)
    with pytest.raises(CheckpointError) as caught:
        take()
    assert str(caught.value) == CHANGED and not isinstance(caught.value, CostlyCheckpointError)
    assert list(snapshots.iterdir()) == []


def test_base_model_files_changed_under_the_copy_are_the_platforms_failure(
    workspace: Path, checkpoint: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base model's files are the platform's: a change to them during a submission's copy is a
    503 to retry, never a refusal of the agent's checkpoint (which would count against its limit)."""
    base = Path(shutil.copytree(tiny_base_model, tmp_path / "base"))
    snapshots = tmp_path / "own-snapshots"
    copy_weights = snapshot_module._copy_weights

    def copy_then_touch_base(opened: Any, header: Any, writer: Any) -> None:
        copy_weights(opened, header, writer)
        tokenizer = base / "tokenizer.json"
        os.utime(tokenizer, ns=(tokenizer.stat().st_atime_ns, tokenizer.stat().st_mtime_ns + 1_000_000))

    monkeypatch.setattr(snapshot_module, "_copy_weights", copy_then_touch_base)
    with pytest.raises(ServiceUnavailableError, match="the base model's files changed"):
        taker(workspace, base, snapshots)()
    assert list(snapshots.iterdir()) == []


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
    assert str(caught.value) == CHANGED


@pytest.mark.parametrize("change", [b"appended", b""], ids=["grown", "shrunk"])
def test_a_small_file_changed_before_it_is_read_is_refused(
    refusal: Callable[..., str], checkpoint: Path, monkeypatch: pytest.MonkeyPatch, change: bytes
) -> None:
    """A writer racing the snapshot: config.json changes size after it was opened and checked,
    before its bytes are read (the weights' header check comes in between)."""
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
    assert refusal() == CHANGED


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
    assert refusal() == CHANGED


def test_a_file_replaced_by_another_after_the_check_is_refused(
    refusal: Callable[..., str], checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-config.json"
    other.write_bytes((checkpoint / "config.json").read_bytes())

    _at_the_check_of(monkeypatch, "config.json", after=lambda: other.replace(checkpoint / "config.json"))
    assert refusal() == CHANGED


def test_a_fifo_swapped_in_after_the_check_is_refused_without_waiting(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = checkpoint / "config.json"

    def swap_for_a_fifo() -> None:
        fifo.unlink()
        os.mkfifo(fifo)

    _at_the_check_of(monkeypatch, "config.json", after=swap_for_a_fifo)
    outcome = _outcome_unless_blocked_on(fifo, take)
    assert isinstance(outcome, CheckpointError) and str(outcome) == CHANGED


def test_an_ignored_file_that_vanishes_before_its_check_is_listed_as_a_file(
    take: Callable[..., Snapshot], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (checkpoint / "notes.txt").write_text("done")
    _at_the_check_of(monkeypatch, "notes.txt", before=(checkpoint / "notes.txt").unlink)
    assert take().ignored_files == with_base_files("notes.txt")


def test_ignored_file_names_are_listed_escaped(take: Callable[..., Snapshot], checkpoint: Path) -> None:
    """The agent names its files: a hyperlink (OSC 8), a right-to-left override, a zero-width space,
    a C1 control, a line feed forging a log line and an undecodable byte are listed as their escapes,
    each name still readable as itself."""
    names = {
        b"\x1b]8;;evil.example\x1b\\docs": "\\x1b]8;;evil.example\\x1b\\\\docs",
        "run\u202eemanelif".encode(): "run\\u202eemanelif",
        "a\u200bb".encode(): "a\\u200bb",
        "c\x9bd".encode(): "c\\x9bd",
        b"x\nevent=final_nominated": "x\\nevent=final_nominated",
        b"y\xff": "y\\udcff",
    }
    for name in names:
        os.close(os.open(os.fsencode(checkpoint) + b"/" + name, os.O_WRONLY | os.O_CREAT, 0o644))
    assert take().ignored_files == with_base_files(*names.values())


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


def test_a_snapshot_holds_its_files_by_this_fingerprint_scheme_and_the_one_before(
    take: Callable[..., Snapshot], checkpoint: Path
) -> None:
    """A fingerprint of the scheme before (each file's SHA-256 over its bytes, as submissions scored
    before an upgrade carry) names the same files; another checkpoint's names them by neither."""
    import hashlib

    snapshot = take()
    earlier = hashlib.sha256(b"autorl-snapshot-v2\0")
    for path in sorted(snapshot.path.iterdir()):
        name = path.name.encode()
        earlier.update(len(name).to_bytes(8, "big") + name + hashlib.sha256(path.read_bytes()).digest())
    assert earlier.hexdigest() != snapshot.fingerprint
    assert snapshot.holds(snapshot.fingerprint) and snapshot.holds(earlier.hexdigest())
    header, data = read_safetensors(checkpoint / "model.safetensors")
    write_safetensors(checkpoint / "model.safetensors", header, bytes([data[0] ^ 1]) + data[1:])
    other = take()
    assert not other.holds(snapshot.fingerprint) and not other.holds(earlier.hexdigest())
