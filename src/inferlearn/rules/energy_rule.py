"""The base of the rules that infer activations on a lifted energy: γ, the solver and the engine choice.

Contrastive learning, equilibrium propagation and standard lifted training all build the lifted
energy of the model's chain (:mod:`inferlearn.engine.graph`), minimise it in one or more phases and
read the weight gradient off the minimisers (envelope theorem). They run on

* the **fused** dense engine (:mod:`inferlearn.engine.problems`) when the model is a dense chain
  (``Linear`` layers with box units: the library's MLP or an equivalent ``nn.Sequential``), or
* the **generic** layered engine (:mod:`inferlearn.engine.problems`) for any chain of affine maps
  (conv nets with average pooling included),

tested equal in float64. ``engine="generic"`` forces the generic engine (benchmarks, tests).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import AFFINE, Graph, read_graph
from ..engine.problems import LiftedEnergy, check_gamma
from ..engine.problems import LayeredEnergy
from ..engine.solvers import DEFAULT_SOLVER, BlockProjectedGradient, SolveInfo, get_solver
from ..errors import PrecisionWarning
from ..losses import one_hot
from .base import Rule

ENGINES = ("auto", "fused", "generic")
PHASES = ("auto", "differential", "direct")
#: ``phases="auto"`` solves the second phase differentially when its signal is below this many machine
#: epsilons (or below 10× the solver's absolute tolerance): there the direct difference of two O(1) solutions
#: loses more than about 1 % of the first layers' gradient (float32, 5 hidden layers: 1 % at a signal of 3e-5
#: = 250 ε, 20 % at 1e-6; benchmarks/results/contrastive_small_gamma.md and tests/engine/test_signal_precision.py)
DIFFERENTIAL_BELOW_EPS = 1000
#: a directly solved clamped or nudged phase stops at the solver's tolerance or at this fraction of its signal,
#: whichever is smaller (an absolute 1e-5 against a signal of 1.6e-5 left 8.9 % gradient error on a small conv net)
PHASE_TOL_FRACTION = 0.05
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
        phases: (two-phase rules: contrastive, EqProp) how the second phase (clamped or nudged) is solved on
            the fused engine: ``differential``
            (for its difference ``δ = z⁺ − z⁰`` from the free minimiser, to a tolerance relative to ``δ``:
            :mod:`inferlearn.engine.differential`; resolved in float32 however small ``γ^{L-1}`` or β),
            ``direct`` (both phases as minimisers of their own, stacked into one solve), or ``auto``
            (differential when the signal ``γ^{L-1}`` or ``β γ^{L-1}`` is below ``DIFFERENTIAL_BELOW_EPS``
            epsilons of the dtype or 10× the solver's tolerance, else direct, which is faster). The generic
            (graph) engine solves directly.
    """

    gamma: float = 1 / 8
    solver: str = DEFAULT_SOLVER
    max_iter: int | None = None
    tol: float | None = None
    on_fail: str = "warn"
    engine: str = "auto"
    phases: str = "auto"

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_engine(self.engine)
        if self.phases not in PHASES:
            raise ValueError(f"Invalid phases: {self.phases!r}; choose one of {list(PHASES)}")
        self._solver = solver_from_options(self.solver, self.max_iter, self.tol, self.on_fail)

    def chain(self, model: nn.Module, x: torch.Tensor | None = None) -> tuple[Graph, bool]:
        """The model's graph (checked: affine maps, box units; ``x`` an input batch for traced models that need
        its shape) and whether to use the fused engine."""
        chain = read_graph(model, AFFINE, self.name, example=x)
        if self.engine == "fused" and not chain.is_dense:
            raise ValueError(f"engine='fused' needs a dense chain (Linear layers with box units, no skip connections); "
                             f"{type(model).__name__} is not one: use engine='auto'")
        fused = chain.is_dense and self.engine != "generic"
        if not fused and self.solver == "cd":
            raise ValueError("solver 'cd' (coordinate descent) runs on dense chains only (Linear layers with box "
                             "units, no skip connections); use solver 'block-pg' for this model")
        return chain, fused

    def dense_inputs(self, chain: Graph, x: torch.Tensor, labels: torch.Tensor):
        """``(energy, x, y)`` for the fused path: the dense lifted energy, flat inputs, one-hot targets."""
        energy = LiftedEnergy.from_chain(chain, self.gamma)
        x = x.reshape(x.shape[0], -1)
        return energy, x, one_hot(labels, energy.sizes[-1], x.dtype)

    def differential(self, fused: bool, depth: int, dtype: torch.dtype, beta: float | None = None) -> bool:
        """Whether to solve the second phase differentially (``phases``; see the class docstring).

        Raises:
            ValueError: the two-phase signal ``γ^{L-1}`` (``β γ^{L-1}``), by which the gradient is divided, is below
                ``dtype``'s smallest normal number: the phases' term weights underflow and the gradient is inf or NaN.
        """
        signal = self.gamma ** (depth - 1) * (1.0 if beta is None else beta)
        if signal < torch.finfo(dtype).tiny:
            what = (f"gamma^(L-1) = {self.gamma:.3g}^{depth - 1}" if beta is None
                    else f"beta * gamma^(L-1) = {beta:.3g} * {self.gamma:.3g}^{depth - 1}")
            raise ValueError(f"Invalid gamma: {what} = {signal:.3g} underflows {str(dtype).replace('torch.', '')} "
                             f"(smallest normal {torch.finfo(dtype).tiny:.3g}), so the gradient divided by it is not "
                             "finite; use a larger gamma, fewer layers, or float64 (--dtype float64)")
        if self.phases == "differential":
            if not fused:
                raise ValueError("phases='differential' runs on the fused engine (dense chains: Linear layers with box "
                                 "units); use phases='auto' or 'direct' for this model")
            return True
        if self.phases == "direct" or not fused:
            return False
        tol = getattr(self._solver, "tol", None)
        return signal < DIFFERENTIAL_BELOW_EPS * torch.finfo(dtype).eps or (tol is not None and signal < 10 * tol)

    def phase_solver(self, depth: int, beta: float | None = None):
        """The solver of a directly solved clamped or nudged phase: the rule's, with its tolerance lowered to
        ``PHASE_TOL_FRACTION`` times the phase's signal ``γ^{L-1}`` (``β γ^{L-1}``) where that is smaller.

        A phase stopped at an absolute tolerance comparable to its signal leaves the first layers short of their
        equilibrium (the nudge has not reached them), so the tolerance follows the signal instead.
        """
        tol = getattr(self._solver, "tol", None)
        signal = self.gamma ** (depth - 1) * (1.0 if beta is None else beta)
        if tol is None or tol <= PHASE_TOL_FRACTION * signal:
            return self._solver
        cache = self.__dict__.setdefault("_phase_solvers", {})
        key = PHASE_TOL_FRACTION * signal
        if key not in cache:
            solver = copy.copy(self._solver)
            solver.tol = key
            cache[key] = solver
        return cache[key]

    def check_precision(self, depth: int, dtype: torch.dtype, beta: float | None = None) -> None:
        """Warn (:class:`~inferlearn.errors.PrecisionWarning`) when a directly solved two-phase signal is near
        ``dtype``'s resolution.

        The phases' first layers differ by about ``γ^{L-1}`` (contrastive J_1) or ``β γ^{L-1}`` (a nudged phase,
        ``beta``) relative to O(1) activations, and the gradient divides by that signal: below
        ``PRECISION_FLOOR_EPS`` machine epsilons the round-off of each phase dominates the difference (the
        differential phases of the fused engine resolve it; the generic engine solves directly). Runs once per
        step, before inference; the message is built only when it warns.
        """
        signal = self.gamma ** (depth - 1) * (1.0 if beta is None else beta)
        eps = torch.finfo(dtype).eps
        if signal >= PRECISION_FLOOR_EPS * eps:
            return
        what = (f"gamma^(L-1) = {self.gamma:.3g}^{depth - 1}" if beta is None
                else f"beta * gamma^(L-1) = {beta:.3g} * {self.gamma:.3g}^{depth - 1}")
        fix = ("phases='differential' on a dense chain, " if self.phases == "direct" else "")
        tail = ", fewer layers, or float64 (--dtype float64)" if dtype != torch.float64 else " or fewer layers"
        warnings.warn(f"{what} = {signal:.2g} is below {PRECISION_FLOOR_EPS} {str(dtype).replace('torch.', '')} "
                      f"epsilons ({PRECISION_FLOOR_EPS * eps:.1e}): the first layers' gradients are dominated by "
                      f"round-off; use {fix}a larger gamma (or beta){tail}",
                      PrecisionWarning, stacklevel=4)

    def difference_steps(self, energy, x: torch.Tensor, target=None, nudge=None, b: float = 0.0) -> list[float]:
        """Block step sizes of the second phase's problem (clamped by ``target`` or nudged by ``b · nudge``)."""
        problem = energy.problem(x, target, nudge=nudge, beta=b, check=False)
        return BlockProjectedGradient().steps(problem)

    def layered_energy(self, chain: Graph) -> LayeredEnergy:
        return LayeredEnergy.lifted(chain, self.gamma)


__all__ = ["LiftedEnergyRule", "ENGINES", "check_engine", "info_extras", "solver_from_options"]
