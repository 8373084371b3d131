"""What a solve did and how it is judged: :class:`SolveInfo`, the verdicts (converged, *far* from equilibrium,
a missed tolerance), the warned-once bookkeeping, and the :class:`Solver` protocol every inference solver follows.

One vocabulary for every solve in the library: ``on_fail`` is one of :data:`ON_FAIL` (``"warn"``, ``"raise"``,
``"ignore"``) for the lifted-network solvers, predictive coding's steps, LPOM and the argmin layer alike.
"""
from __future__ import annotations

import abc
import math
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...errors import ConvergenceError, ConvergenceWarning, NonFiniteError

if TYPE_CHECKING:   # the protocol, for annotations only: solvers never import a problem
    from ..problems.protocol import Problem

ON_FAIL = ("warn", "raise", "ignore")


#: a solve run for a fixed number of steps (no ``tol``) counts as converged when its residual is at most this
#: fraction of the residual at its start (the forward pass: the signal the inference has to resolve), and never
#: below :func:`residual_floor` (what the dtype resolves)
CONVERGED_RTOL = 1e-3
#: the steps (PC, MAC, lifted Fenchel) and block sweeps (LPOM) that stand for a rule's equilibrium in
#: :func:`inferlearn.diagnostics.equilibrium_gap` (:meth:`inferlearn.rules.Rule.equilibrium_options`): on the
#: oracle matrix's conv net (float64) twice as many move the gradient by 0.2 % (PC) and 0.7 % (MAC), on its ReLU
#: MLP by 6-7 %: there the kinks keep fixed steps from settling, so the reference is that precise
EQUILIBRIUM_STEPS = 3000
EQUILIBRIUM_SWEEPS = 2000


@dataclass
class SolveInfo:
    """What a solve did: one record for the lifted-network solvers here and the argmin layer's solves.

    Attributes:
        solver: solver name (``"cd"``, ``"block-pg"``, ``"pc-steps"``, ``"reference"``, ``"lpom"``; for the argmin
            layer of :mod:`inferlearn.bilevel`, ``"fista"``, ``"projected-gradient"``, ``"closed-form"``, ``"cg"``).
        iterations: sweeps (or iterations) performed (0 for a closed form).
        residual: optimality residual at the returned point, 0 at the exact minimiser: for lifted
            networks the max over rows of :meth:`LiftedProblem.residuals` (in activation units); for
            the argmin layer ``max|z − Π_C(z − ∇E(z))|`` (``‖b − Hv‖`` for its CG solve). Solvers that
            measure it as a by-product of their last step report that step's size instead (block-pg's
            ``residual="step"``, predictive coding's ``η max|∂E/∂z|`` at the last step's start, LPOM's
            largest move of the last sweep).
        converged: whether the residual met ``tol``. A closed form is converged; a solver run for a fixed
            number of steps without a tolerance is judged against :data:`CONVERGED_RTOL` (1e-3) times
            ``initial_residual`` (at least :func:`residual_floor`), never converged by construction.
        tol: the tolerance the residual was judged against: the solver's own, or for a fixed number of steps
            the relative one above (``None`` for a closed form, or where no starting residual was measured).
        initial_residual: the residual at the start (the forward pass, also for warm-started solves), the
            scale of the relative criteria: how much signal inference had to resolve.
        far: whether the solve stopped *far* from equilibrium by its solver's criterion (``far_rtol`` of
            :class:`CoordinateDescent` and :class:`BlockProjectedGradient`, ``far_rtol`` and ``far_layer`` of
            :class:`GradientSteps`, ``FAR_RTOL`` of LPOM), which warns once per solver (or rule), i.e. once per run.
    """

    solver: str
    iterations: int
    residual: float
    converged: bool
    tol: float | None = None
    initial_residual: float | None = None
    far: bool = False


_WARNED: dict[int, set[str]] = {}


def first_time(owner, what: str) -> bool:
    """True the first time ``owner`` (a solver, rule or layer: one run) asks about ``what`` (a kind of warning), False
    after: the warned-once bookkeeping, kept here rather than on the owner (frozen rules hold no flags)."""
    key = id(owner)
    seen = _WARNED.get(key)
    if seen is None:
        seen = _WARNED[key] = set()
        weakref.finalize(owner, _WARNED.pop, key, None)
    if what in seen:
        return False
    seen.add(what)
    return True


def max_abs(tensors) -> list[torch.Tensor]:
    """``[max|t|]`` of each tensor as 0-d tensors: two fused operations over the list in eager mode (a fused
    infinity norm is several times slower on CPU), one reduction per tensor inside a compiled graph (which fuses them;
    ``torch.compile`` cannot trace ``_foreach_max``)."""
    if torch.compiler.is_compiling():
        return [t.abs().amax() for t in tensors]
    return list(torch._foreach_max(torch._foreach_abs(tensors)))


def residual_floor(hidden) -> float:
    """The smallest residual the dtype of ``hidden`` (a tensor or a list of them) resolves:
    ``20 ε (1 + max|z|)`` (≈ 4.8e-6 for float32 activations of order 1, ≈ 9e-15 for float64)."""
    zs = [hidden] if torch.is_tensor(hidden) else [z for z in hidden if z is not None and z.numel()]
    if not zs:
        return 0.0
    big = float(torch.stack(max_abs([z.detach() for z in zs])).max())   # one synchronisation
    return residual_floor_of(big, zs[0].dtype)


def last_step_stats(stats: list[float], eta: float, dtype: torch.dtype) -> tuple[list, float]:
    """Read a checked last step's statistics, laid out as ``[max|Δz_k|…, ‖Δz_k‖…, ‖ε_k‖…, max|z_k|…]`` over the
    ``n`` hidden layers: ``(layers, floor)``, the ``(max|Δz_k|, ‖∂E/∂z_k‖, ‖ε_k‖)`` per layer that
    :meth:`GradientSteps.report` judges (``‖∂E/∂z_k‖ = ‖Δz_k‖ / η``) and the :func:`residual_floor` of the nodes."""
    n = len(stats) // 4
    layers = [(big, g / eta, e) for big, g, e in zip(stats[:n], stats[n:2 * n], stats[2 * n:3 * n])]
    return layers, residual_floor_of(max(stats[3 * n:], default=0.0), dtype)


def residual_floor_of(big: float, dtype: torch.dtype) -> float:
    """:func:`residual_floor` from the largest activation ``big = max|z|`` already measured."""
    return 20.0 * torch.finfo(dtype).eps * (1.0 + (big if math.isfinite(big) else 0.0))


def act_on_failure(message: str, on_fail: str, stacklevel: int = 2) -> None:
    """Act on a failed solve as ``on_fail`` says: ``"raise"`` raises :class:`~inferlearn.errors.ConvergenceError`,
    ``"warn"`` issues a :class:`~inferlearn.errors.ConvergenceWarning` (``stacklevel`` counted from the caller),
    ``"ignore"`` does nothing (the returned verdict records it)."""
    if on_fail == "raise":
        raise ConvergenceError(message)
    if on_fail == "warn":
        warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel + 1)


def warn_far(owner, info: SolveInfo, message: str, on_fail: str = "warn", stacklevel: int = 3) -> None:
    """Mark ``info`` far from equilibrium and act on it (``on_fail``): ``"warn"`` issues ``message`` as a
    :class:`~inferlearn.errors.ConvergenceWarning` once per ``owner`` (the solver or rule: once per run),
    ``"raise"`` raises :class:`~inferlearn.errors.ConvergenceError`, ``"ignore"`` only records it."""
    info.far = True
    if on_fail == "raise":
        raise ConvergenceError(message)
    if on_fail == "warn" and first_time(owner, "far"):
        warnings.warn(message + " (warned once per run)", ConvergenceWarning, stacklevel=stacklevel + 1)


def fixed_steps_verdict(name: str, residual: float, iterations: int, initial: float | None, floor: float,
                        tol: float | None = None) -> SolveInfo:
    """The :class:`SolveInfo` of a solve that ran its steps (``tol``: the early-stopping tolerance it had, if
    any): converged when the residual met ``tol``, or without one ``CONVERGED_RTOL × initial`` (≥ ``floor``)."""
    if tol is None:
        if initial is None:
            return SolveInfo(name, iterations, residual, True, None, None)
        tol = max(CONVERGED_RTOL * initial, floor)
    return SolveInfo(name, iterations, residual, residual <= tol, tol, initial)


def far_from(info: SolveInfo, far_rtol: float | None, floor: float) -> bool:
    """``residual > far_rtol × initial_residual`` (and above ``floor``): the relative criterion of the sweep solvers."""
    if far_rtol is None or info.initial_residual is None or info.converged:
        return False
    return info.residual > max(far_rtol * info.initial_residual, floor)


def check_options(max_iter: int, tol: float | None, on_fail: str) -> None:
    if not isinstance(max_iter, int) or isinstance(max_iter, bool) or max_iter < 1:
        raise ValueError(f"Invalid max_iter: {max_iter}")
    if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"Invalid tol: {tol}")
    if on_fail not in ON_FAIL:
        raise ValueError(f"Invalid on_fail: {on_fail!r}; choose one of {list(ON_FAIL)}")


def judge_far(solver, info: SolveInfo, hidden, done: str, fix: str) -> SolveInfo:
    """Apply a sweep solver's relative criterion (``solver.far_rtol``) to a solve without ``tol``: warn once
    (``solver.on_fail``) when its residual stayed above ``far_rtol`` times the starting one."""
    if far_from(info, getattr(solver, "far_rtol", None), residual_floor(hidden)):
        warn_far(solver, info, f"{info.solver}: inference far from equilibrium after {done}: optimality residual "
                 f"{info.residual:.3g} is {info.residual / info.initial_residual:.2g} of the starting one "
                 f"{info.initial_residual:.3g} (> {solver.far_rtol:g}), so activations and gradients are not those of "
                 f"the energy's minimiser; {fix}", solver.on_fail, stacklevel=4)
    return info


def finish(name: str, problem, hidden: list[torch.Tensor], iterations: int, tol: float | None,
           on_fail: str, residual: float | None = None, initial: float | None = None, owner=None) -> SolveInfo:
    """The :class:`SolveInfo` of a finished solve; warns or raises (``on_fail``) when ``tol`` was missed.

    ``residual`` is the solver's own measure; ``None`` evaluates ``problem.residuals(hidden)``. A
    non-finite residual always raises :class:`ConvergenceError`. Without ``tol``, ``initial`` (the residual at
    the start) gives the relative verdict of :func:`fixed_steps_verdict` (no warning here: whether that is *far*
    is the solver's criterion, :func:`far_from`). With ``owner`` (the solver), the missed-``tol`` warning is
    issued once per owner, not once per batch: a run's log keeps one line.
    """
    if residual is None:
        residual = float(problem.residuals(hidden).max()) if hidden else 0.0
    if not math.isfinite(residual):   # NaN/inf anywhere in the iterate propagates into the residual
        raise NonFiniteError(f"{name}: non-finite activations after {iterations} iterations "
                               "(weights too large or inputs non-finite?)")
    if tol is None:
        return fixed_steps_verdict(name, residual, iterations, initial, residual_floor(hidden))
    converged = residual <= tol
    info = SolveInfo(name, iterations, residual, converged, tol, initial)
    if not converged:
        msg = (f"{name} stopped after {iterations} iterations with optimality residual {residual:.3g} > tol {tol:.3g}; "
               "raise max_iter or tol")
        if on_fail == "raise":
            raise ConvergenceError(msg)
        if on_fail == "warn" and owner is None:
            warnings.warn(msg, ConvergenceWarning, stacklevel=3)
        elif on_fail == "warn" and first_time(owner, "tol"):
            warnings.warn(msg + " (warned once per run)", ConvergenceWarning, stacklevel=3)
    return info


class Solver(abc.ABC):
    """An inference solver: ``solve(problem, init=None) -> (hidden, SolveInfo)``."""

    name: str = ""

    def solve(self, problem: Problem, init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], SolveInfo]:
        """Minimise the problem's energy over its hidden layers.

        Args:
            problem: the batch of problems.
            init: starting hidden layers (feasible; checked); default the forward pass.

        Returns:
            ``(hidden, info)`` with ``hidden = [z_1, …, z_{L-1}]`` (new tensors; ``init`` is not modified).
        """
        if problem.depth == 1:
            return [], SolveInfo(self.name, 0, 0.0, True, None)
        if init is None:
            hidden, pre = problem.forward_state()
        else:
            problem.check_feasible(init)
            hidden = list(init)
            pre = problem.pre_of(hidden)
        hidden = [z.clone() for z in hidden] if self.in_place else list(hidden)
        with torch.no_grad():
            return self.solve_from(problem, hidden, list(pre))

    @abc.abstractmethod
    def solve_from(self, problem: Problem, hidden: list[torch.Tensor],
               pre: list[torch.Tensor | None]) -> tuple[list[torch.Tensor], SolveInfo]:
        """Solve from ``hidden`` (copies when ``in_place``), ``pre[k] = a_k`` of that point (k = 1 … L)."""

    in_place: bool = True
