"""A submission's lineage (autorl.provenance.lineage): the registered public checkpoint it is nearer
than its base is named, by its parameters, not by how many tensors it has; a weight that is not a
number is said, never read as "not nearer". Small real safetensors files; nothing mocked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from autorl.provenance.lineage import BASE, lineage

#: A layer's shapes: one large matrix and the small tensors beside it (norms, biases, a k/v projection).
SHAPES = {
    "mlp.weight": (256, 128),
    "k_proj.weight": (16, 128),
    "k_proj.bias": (16,),
    "v_proj.bias": (16,),
    "input_norm.weight": (128,),
    "post_norm.weight": (128,),
}


def tensors(
    seed: int, like: dict[str, torch.Tensor] | None = None, scale: float = 0.05
) -> dict[str, torch.Tensor]:
    """Random tensors, or ``like``'s each moved by ``scale`` of its spread."""
    generator = torch.Generator().manual_seed(seed)
    if like is None:
        return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
    return {name: t + scale * torch.randn(t.shape, generator=generator) * t.std() for name, t in like.items()}


def saved(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    folder.mkdir()
    save_file({name: t.contiguous() for name, t in weights.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def checkpoints(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], Path, dict[str, torch.Tensor]]:
    base = tensors(0)
    public = tensors(1, like=base)
    return saved(tmp_path / "base", base), base, saved(tmp_path / "public", public), public


def test_a_checkpoint_whose_large_matrices_are_the_public_ones_is_named(
    tmp_path: Path, checkpoints: tuple[Path, dict[str, torch.Tensor], Path, dict[str, torch.Tensor]]
) -> None:
    base_dir, base, public_dir, public = checkpoints
    # Most parameters public, most tensors (the small ones) the base's.
    stitched = {
        name: public[name] if name.endswith("weight") and "norm" not in name else base[name]
        for name in SHAPES
    }
    assert sum(public[n].numel() for n in SHAPES if stitched[n] is public[n]) > 0.9 * sum(
        t.numel() for t in base.values()
    )
    found = lineage(saved(tmp_path / "stitched", stitched), base_dir, [("public-instruct", public_dir)])
    assert found.nearest == "public-instruct"
    assert found.distances["public-instruct"] < found.distances[BASE]


def test_one_tensor_moved_far_does_not_decide(
    tmp_path: Path, checkpoints: tuple[Path, dict[str, torch.Tensor], Path, dict[str, torch.Tensor]]
) -> None:
    base_dir, _, public_dir, public = checkpoints
    tuned = tensors(2, like=public, scale=0.005)
    tuned["k_proj.weight"] = tuned["k_proj.weight"] * 1e6  # one tensor far from both
    found = lineage(saved(tmp_path / "tuned", tuned), base_dir, [("public-instruct", public_dir)])
    assert found.nearest == "public-instruct"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_weight_that_is_not_a_number_is_named_not_compared(
    tmp_path: Path,
    checkpoints: tuple[Path, dict[str, torch.Tensor], Path, dict[str, torch.Tensor]],
    value: float,
) -> None:
    base_dir, _, public_dir, public = checkpoints
    tuned = tensors(2, like=public, scale=0.005)
    tuned["mlp.weight"][255, 0] = value  # a row never used
    found = lineage(saved(tmp_path / "tuned", tuned), base_dir, [("public-instruct", public_dir)])
    assert found.nearest is None
    assert set(found.skipped) == {BASE, "public-instruct"}
    assert all(why.startswith("not compared: ") and "mlp.weight" in why for why in found.skipped.values())
    assert all(math.isfinite(d) for d in found.distances.values())
