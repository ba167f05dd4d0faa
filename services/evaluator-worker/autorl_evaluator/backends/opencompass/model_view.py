"""A read-only view of a submission's snapshot, as transformers 4 (OpenCompass's) reads it.

Agents save checkpoints with transformers 5; OpenCompass 0.5 (and the vLLM line that shares its
environment) runs transformers 4, which misreads some of what version 5 writes, in part silently:

- ``tokenizer_config.json``: ``tokenizer_class`` ``TokenizersBackend`` does not exist in version 4
  (→ ``PreTrainedTokenizerFast``, which loads the same ``tokenizer.json``); a list-valued
  ``extra_special_tokens`` makes version 4 fail (→ ``additional_special_tokens``); and the default
  ``model_input_names`` of a fast tokenizer include ``token_type_ids``, which ``generate`` refuses.
- ``config.json``: version 5 keeps RoPE settings only in ``rope_parameters``; version 4 ignores
  that key and silently falls back to its default ``rope_theta`` (10000 instead of, say, Qwen2.5's
  1000000), producing a different model. The values are copied to the keys version 4 reads.

The view is built from the snapshot (:mod:`autorl.checkpoints.snapshot`), never from the agent's folder: the
snapshot holds only a submission's weights beside the base model's normalized files, in storage the
agent cannot write. Its weights are hard-linked (symlinked across filesystems: both point into the
snapshot); small files are copied, some rewritten, then the view is made read-only. The snapshot is
only ever read.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from autorl.checkpoints.snapshot import CONFIG, PLATFORM_FILES, WEIGHTS_INDEX
from autorl.errors import EvaluationError

#: Small files that describe the model, copied (and some rewritten) into the view; an allow-list
#: again, though a snapshot holds nothing else, so that no other file ever reaches OpenCompass.
COPIED_FILES = PLATFORM_FILES | {CONFIG, WEIGHTS_INDEX}
WEIGHT_SUFFIX = ".safetensors"
#: transformers 5's generic fast-tokenizer class; version 4 names the same thing this way.
TRANSFORMERS5_TOKENIZER_CLASS = "TokenizersBackend"
TRANSFORMERS4_FAST_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
_READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
_READ_ONLY_DIR = _READ_ONLY_FILE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def build_view(snapshot: Path, view: Path) -> Path:
    """Write the transformers-4 view of ``snapshot`` into the new folder ``view`` and return it."""
    if not (snapshot / "config.json").is_file():
        raise EvaluationError(f"snapshot {snapshot} has no config.json")
    view.mkdir(parents=True, exist_ok=False)
    for source in sorted(snapshot.iterdir()):
        if not source.is_file() or source.is_symlink():
            continue
        target = view / source.name
        if source.name.endswith(WEIGHT_SUFFIX):
            _link(source, target)
        elif source.name in COPIED_FILES:
            shutil.copyfile(source, target)
            target.chmod(_READ_ONLY_FILE)
    _rewrite_json(view / "tokenizer_config.json", fix_tokenizer_config)
    _rewrite_json(view / "config.json", fix_model_config)
    view.chmod(_READ_ONLY_DIR)
    return view


def remove_view(view: Path) -> None:
    """Delete a view (its folder is read-only; its links point into the snapshot, which stays)."""
    if view.is_dir():
        view.chmod(stat.S_IRWXU)
        shutil.rmtree(view)


def _link(source: Path, target: Path) -> None:
    # The snapshot is immutable evaluator storage: a link into it cannot change what is read.
    try:
        os.link(source, target)
    except OSError:
        target.symlink_to(source.resolve())


def _rewrite_json(path: Path, fix: Any) -> None:
    if not path.is_file():
        return
    try:
        original = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvaluationError(f"{path.name} of the checkpoint is not valid JSON ({exc})") from exc
    if not isinstance(original, dict):
        raise EvaluationError(f"{path.name} of the checkpoint is not a JSON object")
    fixed = fix(original)
    if fixed == original:
        return
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    path.write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    path.chmod(_READ_ONLY_FILE)


def fix_tokenizer_config(config: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers 4 reads it (see the module docstring)."""
    fixed = dict(config)
    if fixed.get("tokenizer_class") == TRANSFORMERS5_TOKENIZER_CLASS:
        fixed["tokenizer_class"] = TRANSFORMERS4_FAST_TOKENIZER_CLASS
    extra = fixed.get("extra_special_tokens")
    if isinstance(extra, list):
        additional = list(fixed.get("additional_special_tokens") or [])
        for token in extra:
            if token not in additional:
                additional.append(token)
        fixed["additional_special_tokens"] = additional
        del fixed["extra_special_tokens"]
    names = fixed.get("model_input_names")
    fixed["model_input_names"] = (
        [name for name in names if name != "token_type_ids"]
        if isinstance(names, list)
        else ["input_ids", "attention_mask"]
    )
    return fixed


def fix_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with RoPE settings where transformers 4 reads them; nothing is removed."""
    fixed = dict(config)
    rope = fixed.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" in rope and "rope_theta" not in fixed:
            fixed["rope_theta"] = rope["rope_theta"]
        scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
        if scaling.get("rope_type", "default") != "default" and fixed.get("rope_scaling") is None:
            fixed["rope_scaling"] = scaling
    return fixed
