"""Back-propagation as a learning rule.

``∇_θ ℓ(f(x; θ), y)`` with ``ℓ`` the quadratic loss ``½‖f(x) − y‖²`` on one-hot targets (the
lifted-network paper's loss) or cross-entropy; batch mean. For an :class:`~inferlearn.models.MLP`
the gradient is computed by a fused hand-written backward pass (one ``addmm`` per layer forward,
two matrix products per layer backward, no autograd graph); any other ``nn.Module`` uses autograd.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..losses import LOSSES, one_hot, output_loss, quadratic_loss
from ..models import MLP
from .base import Rule, StepInfo, accumulate_grad, register_rule


@register_rule
@dataclass
class BackProp(Rule):
    """Plain back-propagation of the output loss.

    For an MLP with ``a_{k+1} = W_k z_k + b_k`` and ``z_{k+1} = Π_C(a_{k+1})``::

        δ_L = (z_L − y)/B  (quadratic)  or  (softmax(z_L) − y)/B  (cross-entropy)
        ∇W_k = δ_{k+1} z_kᵀ,  ∇b_k = Σ_batch δ_{k+1},  δ_k = (W_kᵀ δ_{k+1}) ⊙ 1[lower ≤ a_k ≤ upper]

    (the mask is the derivative of the clamp, as autograd defines it at the kinks).

    Args:
        loss: ``"quadratic"`` (default, MATH.md §A) or ``"cross-entropy"``.
        fused: use the hand-written backward for MLPs (``False``: always autograd).

    References:
        Rumelhart, Hinton & Williams (1986); the baseline of every table in the three papers.
    """

    name = "backprop"
    loss: str = "quadratic"
    fused: bool = True

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"Unknown loss {self.loss!r}; choose one of {list(LOSSES)}")

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        if self.fused and isinstance(model, MLP):
            return self._mlp_backward(model, x, labels)
        with torch.enable_grad():
            output = model(x)
            loss = output_loss(self.loss, output, labels)
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())

    @torch.no_grad()
    def _mlp_backward(self, model: MLP, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        layers = model.layers
        zs, pres = [x], []
        for k, layer in enumerate(layers):
            a = torch.addmm(layer.bias, zs[-1], layer.weight.t())
            pres.append(a)
            zs.append(a if k == len(layers) - 1 else model.units[k].project(a))
        out = zs[-1]
        y = one_hot(labels, out.shape[1], out.dtype)
        if self.loss == "quadratic":
            loss = quadratic_loss(out, y)
            delta = (out - y) / x.shape[0]
        else:
            loss = torch.nn.functional.cross_entropy(out, labels.long())
            delta = (torch.softmax(out, dim=1) - y) / x.shape[0]
        for k in range(len(layers) - 1, -1, -1):
            accumulate_grad(layers[k].weight, delta.t().mm(zs[k]), owned=True)
            accumulate_grad(layers[k].bias, delta.sum(0), owned=True)
            if k > 0:
                delta = delta.mm(layers[k].weight)
                units = model.units[k - 1]
                if not units.is_linear:
                    delta.mul_(~units.engaged(pres[k - 1]))
        return StepInfo(loss=float(loss), output=out)
