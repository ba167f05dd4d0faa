"""OpenCompass's side of the tests: its own Python (``.venv-opencompass``, transformers 4) and tiny
checkpoints for it, written by transformers 5 as an agent's would be."""

from __future__ import annotations

import itertools
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


def save_answering_model(base: Path, target: Path, answer: list[str], after: str) -> Path:
    """``base`` (the builtin tiny Qwen2) rewired to answer every prompt that ends in ``after`` with
    the tokens ``answer`` (each a token of the tokenizer's, special ones too) and then its eos:
    every layer's output projections are zeroed, so a position's state is its own token's
    embedding; the tokens of the chain get embeddings one-hot in a dimension of their own, and an
    untied head maps each to the next token of the chain."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    [start] = tokenizer(after, add_special_tokens=False)["input_ids"][-1:]
    chain = [start, *tokenizer.convert_tokens_to_ids(answer), tokenizer.eos_token_id]
    if len(set(chain)) != len(chain):
        raise ValueError(f"the chain of tokens must not repeat one: {chain}")
    target.mkdir(parents=True)
    for path in base.iterdir():
        if path.name != "model.safetensors":
            (target / path.name).write_bytes(path.read_bytes())
    config = json.loads((base / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = load_file(base / "model.safetensors")
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = torch.zeros_like(tensors[name])
    embeddings = tensors["model.embed_tokens.weight"].clone()
    head = torch.zeros_like(embeddings)
    for dimension, (token, following) in enumerate(itertools.pairwise(chain)):
        embeddings[token] = 0.0
        embeddings[token, dimension] = 1.0
        head[following, dimension] = 10.0
    tensors["model.embed_tokens.weight"], tensors["lm_head.weight"] = embeddings, head
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target
