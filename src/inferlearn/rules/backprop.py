"""Back-propagation as a learning rule.

``∇_θ ℓ(f(x; θ), y)`` by reverse-mode autodiff, with ``ℓ`` the quadratic loss ``½‖f(x) − y‖²`` on
one-hot targets (the lifted-network paper's loss) or cross-entropy; batch mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..losses import LOSSES, output_loss
from .base import Rule, StepInfo, register_rule


@register_rule
@dataclass
class BackProp(Rule):
    """Plain back-propagation of the output loss.

    Args:
        loss: ``"quadratic"`` (default, MATH.md §A) or ``"cross-entropy"``.

    References:
        Rumelhart, Hinton & Williams (1986); the baseline of every table in the three papers.
    """

    name = "backprop"
    loss: str = "quadratic"

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"Unknown loss {self.loss!r}; choose one of {list(LOSSES)}")

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        with torch.enable_grad():
            output = model(x)
            loss = output_loss(self.loss, output, labels)
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())
