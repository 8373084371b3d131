"""Standard lifted training (J_0): the gradient of the clamped energy at its minimiser.

    J_0(W) / γ^{L-1} = (1 / (B γ^{L-1})) Σ_i min_z Ê(z; x_i, y_i),
    ∇_{W_k} = γ^k / (B γ^{L-1}) Σ_i (W_k ẑ_k + b_k − ẑ_{k+1}) ẑ_kᵀ          (envelope theorem)

Minimising ``J_0`` jointly with the activations is the classic lifted (MAC-like) training. Its
stationarity condition forces every unit with non-zero input to behave linearly (MATH.md §A, "why
J_0 fails"), so networks drift to (almost) linear ones and reach about linear regression's accuracy.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 6-8 and Sec. 5.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.dense import LiftedEnergy
from ..losses import one_hot, quadratic_loss
from .base import Rule, StepInfo, check_positive, register_rule
from .contrastive import LiftedSolverRule, apply_energy_grads, info_extras


@register_rule
@dataclass
class LiftedJ0(LiftedSolverRule):
    """Standard lifted training: gradient of the clamped energy ``Ê`` at its minimiser, / ``γ^{L-1}``.

    Args:
        gamma: feedback weight ``γ > 0`` (paper: 1/8).
        solver, max_iter, tol, on_fail: as for :class:`~inferlearn.rules.contrastive.Contrastive`.
        warmup_epochs: number of first epochs trained with a smaller learning rate.
        warmup_scale: the learning-rate multiplier during those epochs (``lr_scale``).
        lr_factor: the learning-rate multiplier after the warm-up.
        scaling: ``"layerwise"`` (default) divides layer ``k``'s gradient by its term weight ``γ^k``,
            so every layer takes a regression step of the same size; ``"global"`` divides everything
            by ``γ^{L-1}`` as for contrastive learning.

    Note:
        The paper says only that "the first epochs utilized a smaller learning rate" for standard
        lifted training; neither the number of epochs, the factor nor the scaling of J_0 are given.
        With the global ``1/γ^{L-1}`` scaling the first layer's J_0 gradient is ``γ^{-(L-1)}`` times a
        regression gradient on the raw pixels (512× at γ = 1/8, L = 4) and SGD with η = 1/20
        diverges at once (measured; see README). Per-layer scaling changes the optimisation path but
        not the stationary points (a positive rescaling of each layer's gradient), so the paper's
        argument -- ``∇_{W_k} Ê = 0`` forces linear behaviour -- applies unchanged. With per-layer
        scaling the first layer's update is a least-squares step from the raw pixels, whose
        Hessian has top eigenvalue ``E‖x‖² ≈ 88`` on MNIST, so plain SGD needs ``η < 2/88 ≈ 0.023``:
        η = 1/20 diverges there after the warm-up. Defaults: 5 epochs at 1/10 of the learning rate,
        then 0.3 of it (the paper: "the first epochs utilized a smaller learning rate"; our later
        epochs also need one).
    """

    name = "lifted-j0"
    warmup_epochs: int = 5
    warmup_scale: float = 0.1
    lr_factor: float = 0.3
    scaling: str = "layerwise"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.warmup_epochs, int) or self.warmup_epochs < 0:
            raise ValueError(f"Invalid warmup_epochs: {self.warmup_epochs}")
        check_positive("warmup_scale", self.warmup_scale)
        check_positive("lr_factor", self.lr_factor)
        if self.scaling not in ("layerwise", "global"):
            raise ValueError(f"Invalid scaling: {self.scaling!r}; choose 'layerwise' or 'global'")

    def lr_scale(self, epoch: int) -> float:
        """``warmup_scale`` for the first ``warmup_epochs`` epochs (0-based ``epoch``), then ``lr_factor``."""
        return self.warmup_scale if epoch < self.warmup_epochs else self.lr_factor

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        energy = LiftedEnergy.from_model(model, self.gamma)
        B, L = x.shape[0], energy.depth
        y = one_hot(labels, energy.sizes[-1], x.dtype)
        problem = energy.problem(x, y, check=False)   # x was validated by Rule.backward
        output = problem.forward_state()[1][L]
        hidden, info = self._solver.solve(problem)
        grads = energy.weight_grads(problem.full(hidden), 1.0 / B)
        if self.scaling == "global":
            grads = [(gw / energy.term_weights[L], gb / energy.term_weights[L]) for gw, gb in grads]
        else:   # layer k's term has weight w_{k+1} = γ^k: divide it out
            grads = [(gw / energy.term_weights[k + 1], gb / energy.term_weights[k + 1]) for k, (gw, gb) in enumerate(grads)]
        apply_energy_grads(model, grads)
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=info_extras(info))
