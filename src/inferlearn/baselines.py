"""Closed-form baselines: least squares from inputs to one-hot targets (linear regression).

Linear regression is the model without hidden layers trained on the quadratic loss -- in the
command line ``--rule backprop --arch 784-10`` (its learning rate scaled with ``--lr-schedule
scaled:0.1`` on raw pixels) -- and :func:`least_squares_fit` is its closed-form minimiser, the oracle
of that training run. The lifted-network paper uses it as what standard lifted training collapses to.
"""
from __future__ import annotations

import torch

from .losses import one_hot


def least_squares_fit(x: torch.Tensor, labels: torch.Tensor, n_classes: int, ridge: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form least squares ``min_{W,b} Σ ½‖W x_i + b − y_i‖² + ½ ridge ‖W‖²`` in float64.

    Note:
        Least squares on raw pixels is stiff: the Hessian's top eigenvalue is about ``E‖x‖²`` (≈ 88 on
        MNIST, ≈ 15 on digits), so SGD at the networks' learning rate 1/20 is near its stability limit.

    Returns:
        ``(W, b)`` with shapes ``(n_classes, d)`` and ``(n_classes,)``.
    """
    x64 = x.double().reshape(x.shape[0], -1)
    xa = torch.cat([x64, torch.ones(x64.shape[0], 1, dtype=torch.float64)], dim=1)
    y = one_hot(labels, n_classes, torch.float64)
    reg = ridge * torch.eye(xa.shape[1], dtype=torch.float64)
    reg[-1, -1] = 0.0
    sol = torch.linalg.solve(xa.T @ xa + reg, xa.T @ y)
    return sol[:-1].T.contiguous(), sol[-1].contiguous()
