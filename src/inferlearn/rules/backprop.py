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

from ..losses import LOSSES, output_loss
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
        last = len(layers) - 1
        zs, pres = model.forward_all(x)
        engaged = [None if u.is_linear else u.engaged(pres[k]) for k, u in enumerate(model.units, start=1)]
        out = zs[-1]
        batch = x.shape[0]
        rows = torch.arange(batch, device=out.device)
        labels = labels.long()  # uint8 labels would index as a mask
        if self.loss == "quadratic":
            delta = out.clone()
            delta[rows, labels] -= 1.0
            loss = 0.5 * torch.dot(delta.view(-1), delta.view(-1)) / batch
        else:
            loss = torch.nn.functional.cross_entropy(out, labels)
            delta = torch.softmax(out, dim=1)
            delta[rows, labels] -= 1.0
        delta.div_(batch)
        for k in range(last, -1, -1):
            accumulate_grad(layers[k].weight, delta.t().mm(zs[k]), owned=True)
            accumulate_grad(layers[k].bias, delta.sum(0), owned=True)
            if k > 0:
                delta = delta.mm(layers[k].weight)
                if engaged[k - 1] is not None:
                    delta.masked_fill_(engaged[k - 1], 0.0)
        return StepInfo(loss=float(loss), output=out)
