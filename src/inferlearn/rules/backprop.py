"""Back-propagation as a learning rule.

``∇_θ ℓ(f(x; θ), y)`` with ``ℓ`` the quadratic loss ``½‖f(x) − y‖²`` on one-hot targets (the
lifted-network paper's loss) or cross-entropy; batch mean. For a dense chain (an
:class:`~inferlearn.models.MLP` or an ``nn.Sequential`` of ``Linear`` layers and box units) the gradient
is computed by the fused backward of :mod:`inferlearn.engine.fused` (one ``addmm`` per layer forward,
two matrix products per layer backward, no autograd graph); any other ``nn.Module`` uses autograd, its
forward pass one compiled call (:data:`GRAPH_FORWARD`, whose backward ``torch.compile`` compiles too) when
compilation is on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import dense_graph
from ..engine.compiled import CompiledStep
from ..engine.fused import DensePlan, dense_backward
from ..losses import check_loss, output_loss
from ..units import Box
from .base import Rule, StepInfo, register_rule


@register_rule
@dataclass
class BackProp(Rule):
    """Plain back-propagation of the output loss.

    For an MLP with ``a_{k+1} = W_k z_k + b_k`` and ``z_{k+1} = Π_C(a_{k+1})``::

        δ_L = (z_L − y)/B  (quadratic)  or  (softmax(z_L) − y)/B  (cross-entropy)
        ∇W_k = δ_{k+1} z_kᵀ,  ∇b_k = Σ_batch δ_{k+1},  δ_k = (W_kᵀ δ_{k+1}) ⊙ 1[lower ≤ a_k ≤ upper]

    (the mask is the derivative of the clamp, as autograd defines it at the kinks).

    Args:
        loss: ``"quadratic"`` (default, docs/maths.md §A) or ``"cross-entropy"``.
        fused: use the fused backward for dense chains (``False``: always autograd).

    References:
        Rumelhart, Hinton & Williams (1986); the baseline of every table in the three papers.
    """

    name = "backprop"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # benchmarks/tune_defaults.py, validation splits
    loss: str = "quadratic"
    fused: bool = True

    def __post_init__(self) -> None:
        check_loss(self.loss)

    def dense_plan(self, model: nn.Module) -> DensePlan | None:
        """The fused dense backward (:func:`~inferlearn.engine.fused.dense_backward`) when it applies to ``model``:
        ``constants = (loss, local backward)``; else ``None``."""
        chain = dense_graph(model) if self.fused else None
        return None if chain is None else DensePlan(chain, "bp", (self.loss, _derivative_mask))

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        plan = self.dense_plan(model)
        if plan is not None:
            loss, out = dense_backward(plan.graph, x, labels, *plan.constants)
            return StepInfo(loss=loss, output=out)
        with torch.enable_grad():
            output = GRAPH_FORWARD(model, x)
            loss = output_loss(self.loss, output, labels)   # eager: it checks the labels against the output
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())


def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)``, differentiable in the parameters."""
    return model(x)


#: Back-propagation's forward pass on any model but a dense chain (conv nets, residual networks, your own modules)
#: as one compiled call; ``torch.compile`` compiles its backward as well (AOTAutograd). ``auto`` leaves it eager on
#: CPU, where compiled it took 0.97-1.75 of eager's time on the conv net, the residual network and VGG-5
#: (``benchmarks/bench_graph_compile.py``)
GRAPH_FORWARD = CompiledStep(_forward, "back-propagation's forward pass of a graph")


def _derivative_mask(units: Box, z: torch.Tensor, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``f'(a) ⊙ g`` of a box unit: ``g`` where the clamp leaves ``a`` unchanged (autograd's convention)."""
    return g.masked_fill_(units.engaged(a), 0.0)
