"""The transformers-4 view of a snapshot: what transformers 4 needs, nothing that can run, the
snapshot untouched."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from autorl.errors import EvaluationError
from autorl_evaluator.backends.opencompass.model_view import (
    build_view,
    fix_model_config,
    fix_tokenizer_config,
    remove_view,
)

TRANSFORMERS5_TOKENIZER_CONFIG = {
    "tokenizer_class": "TokenizersBackend",
    "extra_special_tokens": ["<|im_start|>", "<|im_end|>"],
    "additional_special_tokens": ["<|im_end|>", "<tool>"],
    "eos_token": "<|im_end|>",
    "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
}
TRANSFORMERS5_CONFIG = {
    "model_type": "qwen2",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "dtype": "bfloat16",
}


def _digest(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Content, mode and modification time of every file: what "untouched" means."""
    return {
        str(path.relative_to(folder)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mode,
            path.stat().st_mtime_ns,
        )
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def submission(tmp_path: Path) -> Path:
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TRANSFORMERS5_CONFIG))
    (folder / "tokenizer_config.json").write_text(json.dumps(TRANSFORMERS5_TOKENIZER_CONFIG))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"weights-1")
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"weights-2")
    (folder / "model.safetensors.index.json").write_text("{}")
    # What must never reach an evaluator: code, pickles, training leftovers.
    (folder / "modeling_custom.py").write_text("import os; os.system('echo pwned')")
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    (folder / "training_args.bin").write_bytes(b"pickle")
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "model.safetensors").write_bytes(b"old")
    return folder


def test_view_holds_only_model_files_and_leaves_the_submission_untouched(
    submission: Path, tmp_path: Path
) -> None:
    before = _digest(submission)
    view = build_view(submission, tmp_path / "view")
    assert _digest(submission) == before
    assert sorted(p.name for p in view.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # Weights are linked, not copied: a 3 GB checkpoint costs nothing to sanitize.
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert os.path.samefile(view / name, submission / name)
    assert (view.stat().st_mode & 0o222) == 0
    assert (view / "config.json").stat().st_mode & 0o222 == 0


def test_view_files_are_what_transformers_4_reads(submission: Path, tmp_path: Path) -> None:
    view = build_view(submission, tmp_path / "view")
    tokenizer_config = json.loads((view / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "extra_special_tokens" not in tokenizer_config
    assert tokenizer_config["additional_special_tokens"] == ["<|im_end|>", "<tool>", "<|im_start|>"]
    assert tokenizer_config["model_input_names"] == ["input_ids", "attention_mask"]
    config = json.loads((view / "config.json").read_text())
    assert config["rope_theta"] == 1000000.0
    assert config["rope_parameters"] == TRANSFORMERS5_CONFIG["rope_parameters"]
    assert "rope_scaling" not in config


def test_remove_view_deletes_the_view_but_not_the_weights(submission: Path, tmp_path: Path) -> None:
    view = build_view(submission, tmp_path / "view")
    remove_view(view)
    assert not view.exists()
    assert (submission / "model-00001-of-00002.safetensors").read_bytes() == b"weights-1"


def test_a_scaled_rope_is_written_where_transformers_4_reads_it() -> None:
    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 500000.0,
        "original_max_position_embeddings": 32768,
    }
    fixed = fix_model_config({"rope_parameters": rope})
    assert fixed["rope_theta"] == 500000.0
    assert fixed["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }


def test_files_transformers_4_wrote_pass_unchanged() -> None:
    config = {"model_type": "qwen2", "rope_theta": 10000.0, "rope_scaling": None}
    assert fix_model_config(config) == config
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_input_names": ["input_ids", "attention_mask"],
    }
    assert fix_tokenizer_config(tokenizer_config) == tokenizer_config


def test_a_checkpoint_without_config_or_with_broken_json_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EvaluationError, match=r"no config\.json"):
        build_view(empty, tmp_path / "v1")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(EvaluationError, match=r"config\.json of the checkpoint is not valid JSON"):
        build_view(broken, tmp_path / "v2")
