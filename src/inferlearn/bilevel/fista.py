"""Solvers of the argmin layer's inner problem ``min_{z ∈ C} E(z)``: FISTA with restart and backtracking
(:class:`AcceleratedProjectedGradient`; :func:`ProjectedGradient`), the closed forms, :func:`solve`, and the
conjugate-gradient solve of the implicit backward. Every solve reports the engine's
:class:`~inferlearn.engine.solvers.SolveInfo` and fails by the engine's vocabulary ``on_fail`` (``"warn"``,
``"raise"``, ``"ignore"``).

References:
    Beck & Teboulle (2009) (FISTA); O'Donoghue & Candès (2015) (adaptive restart).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..engine.solvers import ON_FAIL, SolveInfo, act_on_failure, residual_floor
from ..errors import ConvergenceError
from ..units import Box, get_units
from .energies import Energy, Shifted


@dataclass
class AcceleratedProjectedGradient:
    """FISTA with adaptive restart and backtracking for ``min_{z ∈ box} E(z)``.

    Iterates ``z ← Π_C(y − ∇E(y)/L)``, ``y ← z + ((t−1)/t')(z − z_prev)``, restarting the momentum
    when the energy goes up (O'Donoghue & Candès 2015). ``L`` is the energy's Lipschitz constant or
    found by backtracking on the sufficient-decrease condition (doubling). Stops when the residual
    ``max|z − Π_C(z − ∇E(z))| ≤ tol``.

    Failures raise :class:`~inferlearn.errors.ConvergenceError` (``on_fail="raise"``, default), warn with
    :class:`~inferlearn.errors.ConvergenceWarning` (``"warn"``) or are only recorded in the returned ``SolveInfo``
    (``"ignore"``), the engine solvers' vocabulary (:data:`~inferlearn.engine.solvers.ON_FAIL`): non-finite iterates or an
    energy that decreases without bound (not convex / unbounded below), backtracking that cannot
    find a step, and the iteration limit (with ``on_limit="report"`` only reported, ``converged=False``
    in the returned ``SolveInfo``: the caller judges it, as :class:`ArgminLayer` does).

    The tolerance is never below what the dtype resolves at the current iterate, :func:`precision_floor`
    ``(z)``, re-evaluated at every check (a float32 solve started from zeros whose solution has entries of 8
    stalls at 3.5e-6, above the starting point's floor 2.4e-6 and below the solution's 2.2e-5), but the
    floor never accepts a residual above 1e-3 of the starting one (a diverging iterate's floor grows with it).

    Called as ``solver(energy, box, z0, inputs)``, it returns ``(z, info)`` with the engine's
    :class:`~inferlearn.engine.solvers.SolveInfo`: ``solver`` is ``"fista"`` (or
    ``"projected-gradient"`` without momentum), ``residual`` is ``max|z − Π_C(z − ∇E(z))|``
    (:meth:`Box.normal_cone_violation`; ``inf`` after a failure) and ``tol`` is this solver's ``tol``.

    Args:
        max_iter: iteration limit.
        tol: residual tolerance.
        momentum: ``False`` gives plain projected gradient descent.
        on_fail: ``"raise"``, ``"warn"`` or ``"ignore"``.
        on_limit: ``None`` (the iteration limit is a failure, as above) or ``"report"``.
    """

    max_iter: int = 2000
    tol: float = 1e-6
    momentum: bool = True
    on_fail: str = "raise"
    on_limit: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_iter, int) and self.max_iter >= 1):
            raise ValueError(f"Invalid max_iter: {self.max_iter}")
        if not (math.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"Invalid tol: {self.tol}")
        if self.on_fail not in ON_FAIL:
            raise ValueError(f"Invalid on_fail: {self.on_fail!r}; choose one of {list(ON_FAIL)}")
        if self.on_limit not in (None, "report"):
            raise ValueError(f"Invalid on_limit: {self.on_limit!r} (choose None or 'report')")

    def _fail(self, msg: str) -> None:
        act_on_failure(msg, self.on_fail, stacklevel=4)

    @torch.no_grad()
    def __call__(self, energy: Energy, box: Box, z0: torch.Tensor, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, SolveInfo]:
        method = "fista" if self.momentum else "projected-gradient"
        lip = energy.lipschitz(*inputs)
        backtrack = lip is None or lip <= 0
        L = 1.0 if backtrack else float(lip)

        def f(z):
            return energy.value(z, *inputs).sum()

        z = box.project(z0.detach())
        y, t = z, 1.0
        e0 = abs(float(f(z))) + 1.0
        tol = start_floor = max(self.tol, precision_floor(z))   # float32 cannot resolve residuals below its rounding
        g_next, res0 = None, math.inf

        def tolerance(z) -> float:   # the floor at z, but never above 1e-3 of the starting residual
            return max(start_floor, min(precision_floor(z), 1e-3 * res0))

        for it in range(1, self.max_iter + 1):
            gy = energy.grad_z(y, *inputs) if g_next is None else g_next
            if it == 1:
                res0 = _residual(box, z, gy) if z.numel() else 0.0
            g_next = None
            for _ in range(60):
                z_new = box.project(y - gy / L)
                if not backtrack:
                    break
                # Local Lipschitz test on gradients rather than on energies: energy differences
                # vanish in rounding near the solution and would let L shrink until the steps diverge.
                d = z_new - y
                dn = float(d.pow(2).sum().sqrt())
                g_new = energy.grad_z(z_new, *inputs)
                if dn == 0.0 or float((g_new - gy).pow(2).sum().sqrt()) <= L * dn:
                    break
                L *= 2.0
            else:
                self._fail(f"{method}: backtracking found no step (L > {L:.3g}) at iteration {it}; "
                           "is the energy smooth in z?")
                return z, SolveInfo(method, it, float("inf"), False, tol)
            if self.momentum:
                # gradient-based restart (O'Donoghue & Candès): drop momentum that points uphill
                if float(((y - z_new) * (z_new - z)).sum()) > 0:
                    t_new, y = 1.0, z_new
                else:
                    t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                    y = z_new + ((t - 1.0) / t_new) * (z_new - z)
                t = t_new
            else:
                y = z_new
                if backtrack:
                    g_next = g_new
            z = z_new
            if it % 5 == 0 or it == self.max_iter:
                fz = f(z)
                if not (torch.isfinite(z).all() and torch.isfinite(fz)) or float(fz) < -1e12 * e0:
                    self._fail(f"{method}: iterates diverged at iteration {it} (energy {float(fz):.3g}); "
                               "the energy is not convex or not bounded below on the constraint set")
                    return z, SolveInfo(method, it, float("inf"), False, tol)
                res = _residual(box, z, energy.grad_z(z, *inputs)) if z.numel() else 0.0
                tol = tolerance(z)
                if res <= tol:
                    return z, SolveInfo(method, it, res, True, tol)
            if backtrack:
                L *= 0.9        # let the step grow again
        res = _residual(box, z, energy.grad_z(z, *inputs)) if z.numel() else 0.0
        tol = tolerance(z)
        if res <= tol:
            return z, SolveInfo(method, self.max_iter, res, True, tol)
        if self.on_limit != "report":
            self._fail(f"{method}: no convergence in {self.max_iter} iterations (residual {res:.3g} > tol {tol:.3g}); "
                       "raise max_iter, or check that the energy is convex in z")
        return z, SolveInfo(method, self.max_iter, res, False, tol)


def as_box(box) -> Box:
    """``None`` → the unconstrained box, a name → its unit set, a :class:`Box` → itself."""
    if box is None:
        return Box()
    if isinstance(box, str):
        return get_units(box)
    if not isinstance(box, Box):
        raise TypeError(f"box must be an inferlearn.units.Box (inferlearn.bilevel.Box) or a unit-set name, "
                        f"got {type(box).__name__}")
    return box


def _residual(box: Box, z: torch.Tensor, g: torch.Tensor) -> float:
    """``max|z − Π(z − g)|`` evaluated in float64: in float32 a large ``z`` absorbs the step (``z − g == z``)
    and an unbounded energy would look converged."""
    return float(box.normal_cone_violation(z.double(), g.double()).abs().max())


def precision_floor(z: torch.Tensor) -> float:
    """The smallest optimality residual ``z``'s dtype can resolve: ``20 ε (1 + max|z|)``
    (≈ 2.4e-6 for float32 values of order 1, ≈ 4e-15 for float64): the lifted solvers'
    :func:`~inferlearn.engine.solvers.residual_floor`."""
    return residual_floor(z) if z.numel() else 20.0 * torch.finfo(z.dtype).eps


def ProjectedGradient(max_iter: int = 5000, tol: float = 1e-6, on_fail: str = "raise") -> AcceleratedProjectedGradient:
    """Plain projected gradient descent (no momentum), the slow reference solver."""
    return AcceleratedProjectedGradient(max_iter=max_iter, tol=tol, momentum=False, on_fail=on_fail)


def solve(energy: Energy, inputs: Sequence[torch.Tensor], box: Box | None = None, solver=None,
          init: torch.Tensor | None = None, shift: torch.Tensor | None = None) -> tuple[torch.Tensor, SolveInfo]:
    """``argmin_{z ∈ box} E(z; inputs) + shiftᵀz``: the closed form when the energy has one, else ``solver``.

    ``box`` is a :class:`~inferlearn.units.Box` (any unit set, e.g. ``RELU``), a unit-set name
    (``"relu"``, ``"hard-sigmoid"``) or ``None`` (unconstrained).

    Returns:
        ``(z, info)``: the minimiser and a :class:`~inferlearn.engine.solvers.SolveInfo` (``solver``
        ``"closed-form"`` with 0 iterations and ``tol=None`` when the energy's closed form was used).

    Raises:
        ValueError: constraints whose shape does not match ``z``.
        ConvergenceError: the solver did not converge (see :class:`AcceleratedProjectedGradient`).
    """
    box = as_box(box)
    inputs = [x.detach() for x in inputs]
    z0 = init.detach() if init is not None else energy.initial(*inputs)
    box.check(z0.shape)
    if shift is not None and shift.shape != z0.shape:
        raise ValueError(f"Shift of shape {tuple(shift.shape)} does not match z of shape {tuple(z0.shape)}")
    with torch.no_grad():
        z = energy.closed_form(box, shift, *inputs)
    if z is not None:
        return z, SolveInfo("closed-form", 0, 0.0, True, None)
    solver = solver or AcceleratedProjectedGradient()
    return solver(Shifted(energy, shift), box, z0, inputs)


def conjugate_gradient(apply_h: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, tol: float = 1e-10,
                       max_iter: int = 1000) -> tuple[torch.Tensor, SolveInfo]:
    """Solve ``H v = b`` for symmetric positive definite ``H`` given as ``apply_h``.

    Returns:
        ``(v, info)`` with a :class:`~inferlearn.engine.solvers.SolveInfo` (``solver="cg"``,
        ``residual = ‖b − Hv‖``, ``tol`` the relative tolerance on it).

    Raises:
        ConvergenceError: on negative or zero curvature ``pᵀHp ≤ 0`` (the energy is not strongly
            convex at the solution: implicit differentiation is undefined there), or no convergence.
    """
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = float((r * r).sum())
    b_norm = math.sqrt(float((b * b).sum()))
    if b_norm == 0.0:
        return x, SolveInfo("cg", 0, 0.0, True, tol)
    for it in range(1, max_iter + 1):
        hp = apply_h(p)
        curv = float((p * hp).sum())
        if not curv > 1e-14 * float((p * p).sum()):
            raise ConvergenceError(f"Implicit differentiation: the Hessian of the energy is not positive definite at "
                                   f"the solution (curvature {curv:.3g} along a CG direction); the energy is not "
                                   "strongly convex in z there")
        alpha = rr / curv
        x = x + alpha * p
        r = r - alpha * hp
        rr_new = float((r * r).sum())
        if math.sqrt(rr_new) <= tol * b_norm:
            return x, SolveInfo("cg", it, math.sqrt(rr_new), True, tol)
        p = r + (rr_new / rr) * p
        rr = rr_new
    raise ConvergenceError(f"Implicit differentiation: conjugate gradient did not converge in {max_iter} iterations "
                           f"(relative residual {math.sqrt(rr) / b_norm:.3g})")
