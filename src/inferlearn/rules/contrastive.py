"""Contrastive learning for lifted networks: the gradient of clamped minus free energy (J_1).

For a mini-batch ``{(x_i, y_i)}`` of size ``B`` the rule accumulates the gradient of::

    J_1(W) / γ^{L-1} = (1 / (B γ^{L-1})) Σ_i [min_z Ê(z; x_i, y_i) − min_z E(z; x_i)]

which by the envelope theorem is (docs/maths.md §A)::

    ∇_{W_k} = γ^k / (B γ^{L-1}) Σ_i [(W_k ẑ_k + b_k − ẑ_{k+1}) ẑ_kᵀ − (W_k ž_k + b_k − ž_{k+1}) ž_kᵀ]

with ``ẑ`` the clamped and ``ž`` the free minimiser. The division by ``γ^{L-1}`` makes the gradient
about back-propagation's (exactly, up to ``ẑ_k`` in place of the forward activation, for linear
units), so the same learning rate serves both.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 9, 22-23, 28.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.problems import contrastive_grads, contrastive_problem
from ..engine.differential import difference_grads, solve_difference
from ..engine.fused import accumulate_dense_grads
from ..engine.problems import LayeredProblem
from ..losses import one_hot, quadratic_loss
from .base import StepInfo, register_rule
from .energy_rule import LiftedEnergyRule, info_extras


@register_rule
@dataclass
class Contrastive(LiftedEnergyRule):
    """Contrastive training of a lifted network (J_1, clamped minus free), divided by ``γ^{L-1}``.

    Its options (``gamma``, ``solver``, ``max_iter``, ``tol``, ``on_fail``, ``engine``) are those of every
    lifted-energy rule, :class:`~inferlearn.rules.energy_rule.LiftedEnergyRule`, except that ``gamma``
    defaults to 1/16 (chosen on validation splits by ``benchmarks/tune_defaults.py``; the paper's 1/8 is
    what ``inferlearn reproduce lifted`` passes).

    Both phases are solved as one stacked batch ``[free; clamped]``, started from the forward pass.
    ``StepInfo.loss`` is the quadratic loss of the forward pass; ``extras`` hold the solver's
    iterations and residual.

    References:
        Zach & Estellers (2019), Eq. 9 (J_1) and Sec. 5 (η^Contr = η^BP / γ^{L-1}).
    """

    name = "contrastive"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # benchmarks/tune_defaults.py, validation splits
    gamma: float = 1 / 16   # the paper's 1/8 scored 0.004 lower on the validation splits (and is what `reproduce` uses)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain, fused = self.chain(model, x)
        B, L = x.shape[0], chain.depth
        if self.differential(fused, L, x.dtype):
            return self._differential(chain, x, labels)
        self.check_precision(chain.levels[L], x.dtype)
        if fused:
            energy, x, y = self.dense_inputs(chain, x, labels)
            problem = contrastive_problem(energy, x, y, check=False)   # x was validated by Rule.backward
            output = problem.forward_state()[1][L][:B]
            hidden, info = self.phase_solver(chain.levels[L]).solve(problem)
            scale = 1.0 / (B * energy.term_weights[L])
            accumulate_dense_grads(chain, contrastive_grads(energy, problem.full(hidden), scale, problem.pre_of(hidden)))
        else:
            energy = self.layered_energy(chain)
            free = LayeredProblem(energy, x)
            output = free.forward_state()[1][L]
            y = one_hot(labels, output.shape[1], x.dtype)
            clamped = torch.arange(2 * B, device=x.device) >= B
            problem = free.stacked(2, target=torch.cat([y, y]), clamped=clamped)
            hidden, info = self.phase_solver(chain.levels[L]).solve(problem)
            scale = 1.0 / (B * energy.term_weights[L])
            sign = clamped.to(x.dtype) * 2.0 - 1.0            # −1 on free rows, +1 on clamped rows
            problem.accumulate_weight_grads(hidden, sign * scale)
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=info_extras(info))

    def _differential(self, chain, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        """The free phase, then the clamped phase for its difference ``δ`` (:mod:`inferlearn.engine.differential`)."""
        energy, x, y = self.dense_inputs(chain, x, labels)
        B, L = x.shape[0], energy.depth
        free = energy.problem(x, check=False)
        output = free.forward_state()[1][L]
        hidden, info = self._solver.solve(free)
        pre = free.pre_of(hidden)
        steps = self.difference_steps(energy, x, target=y)
        delta, sweeps, rel = solve_difference(energy, x, hidden, pre, steps, target=y)
        grads = difference_grads(energy, x, hidden, pre, delta, target=y)
        scale = 1.0 / (B * energy.term_weights[L])
        accumulate_dense_grads(chain, [(gw.mul_(scale), gb.mul_(scale)) for gw, gb in grads])
        extras = info_extras(info) | {"difference_sweeps": sweeps, "difference_residual": rel}
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=extras)
