"""A model kept resident between evaluations: the next checkpoint with the same files besides its
weights only swaps its weights in.

Submissions of one experiment share the base model's files (the snapshot keeps the base's
``config.json``, generation config and tokenizer, and refuses tensors whose names or shapes differ
from the base's), so building the module tree, allocating it on the device and moving it there is
done once per base model; each further checkpoint reads its safetensors straight to the device and
copies them into the resident parameters. The resident model is reused only when every file
besides the weights, the device and the dtype are those it was built from
(:func:`autorl_evaluator.resident_key.resident_state_key`): a model keeps what it read at its
load (the generation config's eos ids among it), and another experiment's base that differs in one
byte of one file gets a cold load. Any failure while swapping drops the resident model (its weights
may be half-copied) and the checkpoint is loaded cold, where its own error, if any, is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autorl_evaluator.resident_key import resident_state_key

log = logging.getLogger("autorl.evaluator.warm")


def swap_weights(model: Any, model_dir: Path) -> None:
    """Copy every tensor of ``model_dir``'s safetensors files into ``model``'s parameters and
    buffers, read straight to their device. Raises ``ValueError`` when a tensor has no place in
    the model or a parameter gets no tensor (tied weights count as given with their source)."""
    import torch
    from safetensors.torch import load_file

    device = next(model.parameters()).device
    targets = model.state_dict()
    written: set[int] = set()
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no safetensors files in {model_dir}")
    with torch.no_grad():
        for path in files:
            for name, tensor in load_file(str(path), device=str(device)).items():
                target = targets.get(name)
                if target is None or target.shape != tensor.shape:
                    raise ValueError(f"tensor {name} {tuple(tensor.shape)} does not fit the resident model")
                target.copy_(tensor)
                written.add(target.data_ptr())
    missing = [
        name for name, p in model.named_parameters(remove_duplicate=True) if p.data_ptr() not in written
    ]
    if missing:
        raise ValueError(f"the checkpoint has no tensor for {', '.join(missing[:5])}")


class WarmModels:
    """One resident model (the last one loaded); ``load`` swaps weights when it may."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.model: Any = None

    def load(
        self, model_dir: Path, device: Any, dtype: Any, cold_load: Callable[[], Any]
    ) -> tuple[Any, bool]:
        """The model of ``model_dir`` on ``device``, and whether it was swapped into a resident one
        (``cold_load`` builds it otherwise, and it becomes the resident model)."""
        key = resident_state_key(model_dir, {"device": str(device), "dtype": str(dtype)})
        if self.model is not None and key == self.key:
            try:
                swap_weights(self.model, model_dir)
                self.model.eval()
                return self.model, True
            except Exception as exc:  # a half-copied model is never reused
                log.warning("event=warm_swap_failed reason=%s", f"{type(exc).__name__}: {exc}"[:300])
        self.clear()
        model = cold_load()
        self.key, self.model = key, model
        return model, False

    def clear(self) -> None:
        self.key, self.model = None, None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover - torch is in every evaluator image
            pass


#: The evaluator process's resident model (a warm worker child keeps it between evaluations).
RESIDENT = WarmModels()
