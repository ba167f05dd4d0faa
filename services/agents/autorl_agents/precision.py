"""AdamW that keeps float32 weights for a model held in bfloat16 or float16.

A bfloat16 weight near 0.02 moves in steps of about 1.2e-4, so an update of learning-rate size
(1e-6 to 5e-5 for RL fine-tuning) rounds back to the same weight: an optimizer stepping the
bfloat16 parameters themselves leaves most of the model unchanged. This one steps float32 copies
(its state is float32 too) and writes them back, rounded, into the model after every step, so
small updates add up. The model keeps its dtype, so generation runs at its speed. For a model
already in float32 it is plain AdamW over the model's own parameters.

Imported inside the agents' functions, after torch (a heavy import the agents keep lazy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over float32 copies of the low-precision parameters, written back after each step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float = 0.0) -> None:
        self.model_params = list(params)
        self.masters = [
            p.detach().float().requires_grad_(p.requires_grad) if p.dtype in LOW_PRECISION else p
            for p in self.model_params
        ]
        super().__init__(self.masters, lr=lr, weight_decay=weight_decay)

    def _copies(self) -> Iterable[tuple[torch.nn.Parameter, torch.Tensor]]:
        return ((p, m) for p, m in zip(self.model_params, self.masters, strict=True) if m is not p)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        for param, master in self._copies():
            master.grad = None if param.grad is None else param.grad.float()
        loss: float | None = super().step(closure)
        for param, master in self._copies():
            param.copy_(master)
            master.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param, _ in self._copies():
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
