"""Tests submit many copies of one model as different submissions (tests/support/grading.py,
``make_unique``): identical weights would reuse an earlier score, so copies must never coincide."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.grading import make_unique


def test_copies_made_unique_never_coincide_and_stay_the_same_model(
    tiny_base_model: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    copy = shutil.copytree(tiny_base_model, tmp_path / "copy")
    original = load_file(str(tiny_base_model / "model.safetensors"))
    seen = {(copy / "model.safetensors").read_bytes()}
    for _ in range(60):  # one byte of 255 values made a coincidence all but certain here
        make_unique(copy)
        weights = (copy / "model.safetensors").read_bytes()
        assert weights not in seen
        seen.add(weights)
    changed = load_file(str(copy / "model.safetensors"))
    assert changed.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.allclose(changed[name], tensor, rtol=1e-2, atol=1e-6), name
