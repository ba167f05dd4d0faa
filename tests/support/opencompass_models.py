"""OpenCompass's side of the tests: its own Python (``.venv-opencompass``, transformers 4) and tiny
checkpoints for it, written by transformers 5 as an agent's would be."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

#: OpenCompass's own environment (``make setup`` builds it).
OC_PYTHON = Path(__file__).resolve().parents[2] / ".venv-opencompass" / "bin" / "python"

#: Multiplies the tiny model's random matrices: its greedy output then depends on the prompt
#: (at the builtin scale every prompt gives the same newlines, which would hide a prompt mismatch).
SHARPEN = 25.0
#: Not transformers 4's default (10000): a model config that transformers 4 misreads unless fixed.
ROPE_THETA = 1_000_000.0


def save_sharp_model(base: Path, target: Path) -> Path:
    """``base`` (the builtin tiny Qwen2) with sharpened weights and a non-default RoPE theta,
    loaded and saved by transformers 5: the files an agent's ``save_pretrained`` writes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(SHARPEN)
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    config = json.loads((target / "config.json").read_text())
    assert "rope_theta" not in config, "transformers 5 is expected to keep RoPE only in rope_parameters"
    return target


def corrupt_weights(model: Path, target: Path) -> Path:
    """A copy of ``model`` whose safetensors file is cut short: its files pass every check that
    reads only names and configs, but no library can load the weights."""
    import shutil

    shutil.copytree(model, target)
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return target


def run_in_opencompass(
    script: str, cases: Any, root: Path, *, timeout_s: float, env: dict[str, str] | None = None
) -> Any:
    """Run ``script`` in OpenCompass's Python in ``root``, given ``cases`` as a JSON file's path and
    an output path as its arguments; its JSON output."""
    (root / "cases.json").write_text(json.dumps(cases))
    subprocess.run(
        [str(OC_PYTHON), "-c", script, str(root / "cases.json"), str(root / "out.json")],
        check=True,
        capture_output=True,
        cwd=root,
        timeout=timeout_s,
        env=env,
    )
    return json.loads((root / "out.json").read_text())
