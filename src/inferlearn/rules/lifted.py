"""Standard lifted training (J_0): the gradient of the clamped energy at its minimiser.

    J_0(W) / γ^{L-1} = (1 / (B γ^{L-1})) Σ_i min_z Ê(z; x_i, y_i),
    ∇_{W_k} = γ^k / (B γ^{L-1}) Σ_i (W_k ẑ_k + b_k − ẑ_{k+1}) ẑ_kᵀ          (envelope theorem)

Minimising ``J_0`` jointly with the activations is the classic lifted (MAC-like) training. Its
stationarity condition forces every unit with non-zero input to behave linearly (docs/maths.md §A, "why
J_0 fails"), so networks drift to (almost) linear ones and reach about linear regression's accuracy.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 6-8 and Sec. 5.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.fused import accumulate_dense_grads
from ..engine.problems import LayeredProblem
from ..losses import one_hot, quadratic_loss
from .base import StepInfo, register_rule
from .energy_rule import LiftedEnergyRule, info_extras

SCALINGS = ("layerwise", "global")


@register_rule
@dataclass
class LiftedJ0(LiftedEnergyRule):
    """Standard lifted training: gradient of the clamped energy ``Ê`` at its minimiser, / ``γ^{L-1}``.

    Args:
        scaling: ``"layerwise"`` (default) divides layer ``k``'s gradient by its term weight ``γ^k``,
            so every layer takes a regression step of the same size; ``"global"`` divides everything
            by ``γ^{L-1}`` as for contrastive learning.

    The other options (``gamma``, ``solver``, ``max_iter``, ``tol``, ``on_fail``, ``engine``) are those of
    every lifted-energy rule, :class:`~inferlearn.rules.energy_rule.LiftedEnergyRule`.

    Note:
        The paper says only that "the first epochs utilized a smaller learning rate" for standard
        lifted training; neither the number of epochs, the factor nor the scaling of J_0 are given.
        With the global ``1/γ^{L-1}`` scaling the first layer's J_0 gradient is ``γ^{-(L-1)}`` times a
        regression gradient on the raw pixels (512× at γ = 1/8, L = 4) and SGD with η = 1/20
        diverges at once (measured). Per-layer scaling changes the optimisation path but not the
        stationary points (a positive rescaling of each layer's gradient), so the paper's argument --
        ``∇_{W_k} Ê = 0`` forces linear behaviour -- applies unchanged. With per-layer scaling the
        first layer's update is a least-squares step from the raw pixels, whose Hessian has top
        eigenvalue ``E‖x‖² ≈ 88`` on MNIST, so plain SGD needs ``η < 2/88 ≈ 0.023``. The learning-rate
        warm-up the reproduction uses is a scheduler, :func:`inferlearn.training.schedules.warmup_schedule`
        (5 epochs at 1/10 of the learning rate, then 0.3 of it), not part of the rule.
    """

    name = "lifted-j0"
    recommended_lr = {"sgd": 0.01, "adam": 1e-3}  # SGD: benchmarks/tune_defaults.py (0.05 diverged); Adam: not tuned
    scaling: str = "layerwise"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scaling not in SCALINGS:
            raise ValueError(f"Invalid scaling: {self.scaling!r}; choose one of {list(SCALINGS)}")

    def _layer_scale(self, term_weights: list[float]) -> list[float]:
        """``s_k`` dividing term ``k``'s gradient: ``1/w_k`` (layer-wise) or ``1/w_L`` (global)."""
        L = len(term_weights) - 1
        return [1.0 / term_weights[L if self.scaling == "global" else k] for k in range(1, L + 1)]

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain, fused = self.chain(model, x)
        B, L = x.shape[0], chain.depth
        if fused:
            energy, x, y = self.dense_inputs(chain, x, labels)
            problem = energy.problem(x, y, check=False)   # x was validated by Rule.backward
            output = problem.forward_state()[1][L]
            hidden, info = self._solver.solve(problem)
            grads = energy.weight_grads(problem.full(hidden), 1.0 / B)
            s = self._layer_scale(energy.term_weights)
            accumulate_dense_grads(chain, [(gw * s[k], gb * s[k]) for k, (gw, gb) in enumerate(grads)])
        else:
            energy = self.layered_energy(chain)
            free = LayeredProblem(energy, x)
            output = free.forward_state()[1][L]
            y = one_hot(labels, output.shape[1], x.dtype)
            problem = free.stacked(1, target=y)
            hidden, info = self._solver.solve(problem)
            problem.accumulate_weight_grads(hidden, 1.0 / B, self._layer_scale(energy.term_weights), precise=False)
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=info_extras(info))
