"""Contrastive learning for lifted networks: the gradient of clamped minus free energy (J_1).

For a mini-batch ``{(x_i, y_i)}`` of size ``B`` the rule accumulates the gradient of::

    J_1(W) / γ^{L-1} = (1 / (B γ^{L-1})) Σ_i [min_z Ê(z; x_i, y_i) − min_z E(z; x_i)]

which by the envelope theorem is (MATH.md §A)::

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

from ..engine.dense import LiftedEnergy, check_gamma, contrastive_grads, contrastive_problem
from ..losses import one_hot, quadratic_loss
from ..engine.dense_solvers import DEFAULT_SOLVER, SolveInfo, get_solver
from .base import Rule, StepInfo, accumulate_grad, register_rule


def solver_from_options(solver: str, max_iter: int | None, tol: float | None, on_fail: str):
    """Build (and so validate) a solver from a rule's options (``max_iter`` = sweeps for ``cd``)."""
    opts = {"max_iter": max_iter, "tol": tol, "on_fail": on_fail}
    if solver == "reference":
        opts = {"tol": tol, "on_fail": on_fail}
    return get_solver(solver, **opts)


def apply_energy_grads(model: nn.Module, grads) -> None:
    """Accumulate ``[(grad W_k, grad b_k)]`` (fresh tensors, owned by the caller) into ``.grad``."""
    for layer, (gw, gb) in zip(model.layers, grads):
        for p, g in ((layer.weight, gw), (layer.bias, gb)):
            if p is None:
                continue
            if p.grad is None and g.dtype == p.dtype:
                p.grad = g   # a fresh tensor: no copy needed (accumulate_grad would clone it)
            else:
                accumulate_grad(p, g)


def info_extras(info: SolveInfo) -> dict:
    return {"solver_iterations": info.iterations, "solver_residual": info.residual}


@dataclass
class LiftedSolverRule(Rule):
    """Base of the rules that infer activations on the lifted energy: its feedback weight and solver.

    Args:
        gamma: feedback weight ``γ > 0`` (paper: 1/8).
        solver, max_iter, tol, on_fail: the inference solver (see :func:`solver_from_options`).
    """

    gamma: float = 1 / 8
    solver: str = DEFAULT_SOLVER
    max_iter: int | None = None
    tol: float | None = None
    on_fail: str = "warn"

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        self._solver = solver_from_options(self.solver, self.max_iter, self.tol, self.on_fail)


@register_rule
@dataclass
class Contrastive(LiftedSolverRule):
    """Contrastive training of a lifted network (J_1, clamped minus free), divided by ``γ^{L-1}``.

    Args:
        gamma: feedback weight ``γ > 0`` (paper: 1/8).
        solver: ``block-pg`` (fast default), ``cd`` (the paper's coordinate descent) or
            ``reference`` (float64, slow).
        max_iter: sweeps (``cd``: exactly this many, default 15) or the sweep limit (``block-pg``,
            default 100); ``None`` for the solver's default.
        tol: the solver's stopping tolerance (``None``: the solver's default).
        on_fail: ``warn`` | ``raise`` | ``ignore`` when the solver misses its tolerance.

    Both phases are solved as one stacked batch ``[free; clamped]``, started from the forward pass.
    ``StepInfo.loss`` is the quadratic loss of the forward pass; ``extras`` hold the solver's
    iterations and residual and ``j1``, the batch mean of the contrastive loss divided by ``γ^{L-1}``.

    References:
        Zach & Estellers (2019), Eq. 9 (J_1) and Sec. 5 (η^Contr = η^BP / γ^{L-1}).
    """

    name = "contrastive"

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        energy = LiftedEnergy.from_model(model, self.gamma)
        B, L = x.shape[0], energy.depth
        y = one_hot(labels, energy.sizes[-1], x.dtype)
        problem = contrastive_problem(energy, x, y, check=False)   # x was validated by Rule.backward
        output = problem.forward_state()[1][L][:B]
        hidden, info = self._solver.solve(problem)
        grads = contrastive_grads(energy, problem.full(hidden), 1.0 / (B * energy.term_weights[L]), problem.pre_of(hidden))
        apply_energy_grads(model, grads)
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=info_extras(info))
