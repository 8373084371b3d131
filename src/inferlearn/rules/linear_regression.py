"""Linear regression (least squares from inputs to one-hot targets) as a learning rule.

The lifted-network paper uses it as the reference that standard lifted training collapses to.
The rule trains a network without hidden layers (``adapt_sizes`` drops them) on the quadratic loss,
whose minimiser is the least-squares solution ``[W b] = Y Xᵀ (X Xᵀ)^{-1}`` with ``X`` augmented by
ones; :func:`least_squares_fit` computes it in closed form (the oracle of the SGD rule).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..losses import one_hot, quadratic_loss
from .base import Rule, StepInfo, check_positive, register_rule


@register_rule
@dataclass
class LinearRegression(Rule):
    """Least squares ``½‖W x + b − y‖²`` trained by the optimiser on ``.grad``.

    The model must be a single linear layer; use :meth:`adapt_sizes` to build it from an architecture.

    Args:
        lr_factor: multiplies the optimiser's learning rate (via :meth:`lr_scale`).

    Note:
        Least squares on raw pixels is stiff: the Hessian's top eigenvalue is about ``E‖x‖²`` (≈ 88 on
        MNIST, ≈ 15 on digits), so SGD at the networks' learning rate 1/20 is near its stability limit on
        MNIST-sized images; there use ``lr_factor=0.1`` (the lifted-network reproduction does). The
        closed-form solution is :func:`least_squares_fit`.
    """

    name = "linear-regression"
    lr_factor: float = 1.0

    def __post_init__(self) -> None:
        check_positive("lr_factor", self.lr_factor)

    def lr_scale(self, epoch: int) -> float:
        return self.lr_factor

    def adapt_sizes(self, sizes: list[int]) -> list[int]:
        return [sizes[0], sizes[-1]]

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        depth = getattr(model, "depth", None)
        if depth is not None and depth != 1:
            raise ValueError(f"linear-regression trains a network without hidden layers; got {depth} weight layers "
                             "(build the model from rule.adapt_sizes(sizes))")
        with torch.enable_grad():
            output = model(x)
            loss = quadratic_loss(output, one_hot(labels, output.shape[1], output.dtype))
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())


def least_squares_fit(x: torch.Tensor, labels: torch.Tensor, n_classes: int, ridge: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form least squares ``min_{W,b} Σ ½‖W x_i + b − y_i‖² + ½ ridge ‖W‖²`` in float64.

    Returns:
        ``(W, b)`` with shapes ``(n_classes, d)`` and ``(n_classes,)``.
    """
    x64 = x.double()
    xa = torch.cat([x64, torch.ones(x64.shape[0], 1, dtype=torch.float64)], dim=1)
    y = one_hot(labels, n_classes, torch.float64)
    reg = ridge * torch.eye(xa.shape[1], dtype=torch.float64)
    reg[-1, -1] = 0.0
    sol = torch.linalg.solve(xa.T @ xa + reg, xa.T @ y)
    return sol[:-1].T.contiguous(), sol[-1].contiguous()
