"""The base of the rules that infer activations on a lifted energy: γ, the solver and the engine choice.

Contrastive learning, equilibrium propagation and standard lifted training all build the lifted
energy of the model's chain (:mod:`inferlearn.engine.chain`), minimise it in one or more phases and
read the weight gradient off the minimisers (envelope theorem). They run on

* the **fused** dense engine (:mod:`inferlearn.engine.dense`) when the model is a dense chain
  (``Linear`` layers with box units: the library's MLP or an equivalent ``nn.Sequential``), or
* the **generic** layered engine (:mod:`inferlearn.engine.layered`) for any chain of affine maps
  (conv nets with average pooling included),

tested equal in float64. ``engine="generic"`` forces the generic engine (benchmarks, tests).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.chain import AFFINE, Chain, model_chain
from ..engine.dense import LiftedEnergy, check_gamma
from ..engine.layered import LayeredEnergy
from ..engine.solvers import DEFAULT_SOLVER, SolveInfo, get_solver
from ..errors import PrecisionWarning
from ..losses import one_hot
from .base import Rule

ENGINES = ("auto", "fused", "generic")
#: a two-phase difference of relative size below this many machine epsilons is not resolved
#: (``benchmarks/results/contrastive_small_gamma.md``: in float32 the first layers' contrastive
#: gradient errors exceed 100 % at γ^{L-1} ≈ 1e-6 ≈ 8 ε and stay near the γ-bias at γ^{L-1} ≥ 1.5e-5)
PRECISION_FLOOR_EPS = 100


def solver_from_options(solver: str, max_iter: int | None, tol: float | None, on_fail: str):
    """Build (and so validate) a solver from a rule's options (``max_iter`` = sweeps for ``cd``)."""
    opts = {"max_iter": max_iter, "tol": tol, "on_fail": on_fail}
    if solver == "reference":
        opts = {"tol": tol, "on_fail": on_fail}
    return get_solver(solver, **opts)


def info_extras(info: SolveInfo) -> dict:
    return {"solver_iterations": info.iterations, "solver_residual": info.residual}


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"Invalid engine: {engine!r}; choose one of {list(ENGINES)}")
    return engine


@dataclass
class LiftedEnergyRule(Rule):
    """Base of the rules on the lifted energy (abstract).

    Args:
        gamma: feedback weight ``γ > 0`` (paper: 1/8).
        solver: ``block-pg`` (fast default), ``cd`` (the paper's coordinate descent, dense chains
            only) or ``reference`` (float64, slow).
        max_iter: sweeps (``cd``: exactly this many, default 15) or the sweep limit (``block-pg``,
            default 100); ``None`` for the solver's default.
        tol: the solver's stopping tolerance (``None``: the solver's default).
        on_fail: ``warn`` | ``raise`` | ``ignore`` when the solver misses its tolerance.
        engine: ``auto`` (fused for dense chains, else generic), ``fused`` or ``generic``.
    """

    gamma: float = 1 / 8
    solver: str = DEFAULT_SOLVER
    max_iter: int | None = None
    tol: float | None = None
    on_fail: str = "warn"
    engine: str = "auto"

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_engine(self.engine)
        self._solver = solver_from_options(self.solver, self.max_iter, self.tol, self.on_fail)

    def chain(self, model: nn.Module, x: torch.Tensor | None = None) -> tuple[Chain, bool]:
        """The model's graph (checked: affine maps, box units; ``x`` an input batch for traced models that need
        its shape) and whether to use the fused engine."""
        chain = model_chain(model, AFFINE, self.name, example=x)
        if self.engine == "fused" and not chain.is_dense:
            raise ValueError(f"engine='fused' needs a dense chain (Linear layers with box units, no skip connections); "
                             f"{type(model).__name__} is not one: use engine='auto'")
        fused = chain.is_dense and self.engine != "generic"
        if not fused and self.solver == "cd":
            raise ValueError("solver 'cd' (coordinate descent) runs on dense chains only (Linear layers with box "
                             "units, no skip connections); use solver 'block-pg' for this model")
        return chain, fused

    def dense_inputs(self, chain: Chain, x: torch.Tensor, labels: torch.Tensor):
        """``(energy, x, y)`` for the fused path: the dense lifted energy, flat inputs, one-hot targets."""
        energy = LiftedEnergy.from_chain(chain, self.gamma)
        x = x.reshape(x.shape[0], -1)
        return energy, x, one_hot(labels, energy.sizes[-1], x.dtype)

    def check_precision(self, depth: int, dtype: torch.dtype, beta: float | None = None) -> None:
        """Warn (:class:`~inferlearn.errors.PrecisionWarning`) when this rule's two-phase signal is near ``dtype``'s resolution.

        The phases' first layers differ by about ``γ^{L-1}`` (contrastive J_1) or ``β γ^{L-1}`` (a nudged phase,
        ``beta``) relative to O(1) activations, and the gradient divides by that signal: below
        ``PRECISION_FLOOR_EPS`` machine epsilons the round-off of each phase dominates the difference. A nudged
        phase starts from the free solution, so a signal below the solver's step tolerance also warns: the solve
        stops before the nudge reaches the first layers, whose gradient then vanishes (measured in float64 with
        5 hidden layers). Runs once per step, before inference; the message is built only when it warns.
        """
        signal = self.gamma ** (depth - 1) * (1.0 if beta is None else beta)
        eps, tol = torch.finfo(dtype).eps, getattr(self._solver, "tol", None) if beta is not None else None
        if signal >= PRECISION_FLOOR_EPS * eps and (tol is None or signal >= tol):
            return
        what = (f"gamma^(L-1) = {self.gamma:.3g}^{depth - 1}" if beta is None
                else f"beta * gamma^(L-1) = {beta:.3g} * {self.gamma:.3g}^{depth - 1}")
        if signal < PRECISION_FLOOR_EPS * eps:
            warnings.warn(f"{what} = {signal:.2g} is below {PRECISION_FLOOR_EPS} {str(dtype).replace('torch.', '')} "
                          f"epsilons ({PRECISION_FLOOR_EPS * eps:.1e}): the first layers' gradients are dominated by "
                          f"round-off; use a larger gamma (or beta), fewer layers, or float64 (--dtype float64)",
                          PrecisionWarning, stacklevel=4)
        else:
            warnings.warn(f"{what} = {signal:.2g} is below the solver's tolerance ({tol:g}): the nudged phase stops "
                          f"before its signal reaches the first layers; use a larger beta or gamma, or a smaller tol",
                          PrecisionWarning, stacklevel=4)

    def layered_energy(self, chain: Chain) -> LayeredEnergy:
        return LayeredEnergy.lifted(chain, self.gamma)


__all__ = ["LiftedEnergyRule", "ENGINES", "check_engine", "info_extras", "solver_from_options"]
