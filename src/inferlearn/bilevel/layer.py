"""Argmin layers: ``z* = argmin_z E(z; θ, inputs)`` inside any PyTorch model, with a contrastive backward.

The layer is the bilevel paper in one ``torch.autograd.Function``. Forward solves the inner problem
(optionally under box constraints, e.g. ``z ≥ 0``). Backward receives ``g = ∂ℓ/∂z*`` and uses ``g`` as
the linearised outer loss ``ℓ̄(z) = gᵀz`` of the contrastive surrogate (docs/maths.md §B, Definition 1)::

    positive   ẑ₊ = argmin_z E(z) + β gᵀz,   ∇ = [∇E(ẑ₊) − ∇E(z*)] / β      (a lower bound of ℓ̄)
    negative   ẑ₋ = argmin_z E(z) − β gᵀz,   ∇ = [∇E(z*) − ∇E(ẑ₋)] / β      (an upper bound)
    symmetric                                ∇ = [∇E(ẑ₊) − ∇E(ẑ₋)] / (2β)    (error O(β²))

where ``∇`` is the gradient with respect to every input and parameter of the energy (Danskin's
theorem: ``z`` is held at the minimiser). As ``β → 0⁺`` this is implicit differentiation
``−∇²_{θz}E (∇²_{zz}E)^{-1} g`` (Prop. 1), and it stays defined where constraints are *weakly*
active (the multiplier is zero at the bound), where implicit differentiation has no derivative
(Prop. 2). ``backward="implicit"`` gives the implicit-differentiation reference: a conjugate-
gradient solve with Hessian-vector products on the coordinates away from their bounds; coordinates
at a bound get zero derivative (the convention ``ReLU'(0) = 0``), and weakly active ones are
counted in :attr:`ArgminLayer.last_backward` so that the failure is visible.

The layer carries no machinery of its own for what the lifted engine already has: the phases and
their weights come from :func:`inferlearn.engine.phases.nudged_phases` (the gradient is
``Σ weight · ∇E(ẑ_phase) / β``, sign 0 being the free solution ``z*``), the constraint set is the
engine's :class:`~inferlearn.units.Box` (the unit sets ``RELU``, ``HARD_SIGMOID``, ... are boxes;
tensor bounds give per-coordinate constraints), and solves report the engine's
:class:`~inferlearn.engine.solvers.SolveInfo`.

Energies return one value per sample (shape ``(batch,)``); the problem is separable over the batch,
and solvers treat the batch as one problem (sums of energies). Shipped energies:
:class:`QuadraticEnergy` (``½ zᵀQz − cᵀz``), :class:`LeastSquaresEnergy` (non-negative least squares
with ``Box.nonnegative()``), :class:`ProximalEnergy` (``½‖z − a‖²``: with ``Box(0, 1)`` its argmin is
the hard-sigmoid unit) and :class:`FunctionEnergy` (any Python function of ``z`` and the inputs).

References:
    Zach, "Bilevel programs meet deep learning: a unifying view on inference learning methods",
    Definition 1 (contrastive surrogate), Prop. 1-3, Eq. 37 (linearised surrogate); docs/maths.md §B.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..engine.phases import check_beta, check_nudging, nudged_phases
from ..engine.solvers import SolveInfo, residual_floor
from ..errors import ConvergenceError, ConvergenceWarning
from ..units import Box, get_units

BACKWARDS = ("contrastive", "implicit")


# --------------------------------------------------------------------------------------------------
# Energies
# --------------------------------------------------------------------------------------------------

class Energy(abc.ABC):
    """An inner objective ``E(z; inputs)``, one value per sample.

    Subclasses implement :meth:`value`; the others have generic defaults (autograd, backtracking).
    Parameters an energy owns (when it is also an ``nn.Module``) receive gradients from the layer.

    Attributes:
        convex: whether ``E`` is claimed convex in ``z``; solvers check what they can (divergence,
            a nudged solution with lower energy than the free one) whatever this says.
    """

    convex: bool = True

    @abc.abstractmethod
    def value(self, z: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``E(z; inputs)`` per sample, shape ``(batch,)``."""

    def grad_z(self, z: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``∇_z E`` (autograd by default; override with a closed form for speed)."""
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            e = self.value(zz, *[x.detach() for x in inputs]).sum()
            (g,) = torch.autograd.grad(e, zz)
        return g

    def lipschitz(self, *inputs: torch.Tensor) -> float | None:
        """A Lipschitz constant of ``∇_z E`` (``None``: solvers backtrack)."""
        return None

    def closed_form(self, box: Box, shift: torch.Tensor | None, *inputs: torch.Tensor) -> torch.Tensor | None:
        """``argmin_{z ∈ box} E(z) + shiftᵀz`` in closed form, or ``None`` when there is none."""
        return None

    def conjugate(self, s: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``E*(s) = sup_z sᵀz − E(z)`` per sample (of ``E`` without its box): the dual of the inner problem
        (:mod:`inferlearn.bilevel.duality`). Energies without a closed form raise ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no convex conjugate; pass conjugate= to FunctionEnergy "
                                  "or use an energy that has one")

    def initial(self, *inputs: torch.Tensor) -> torch.Tensor:
        """A starting point whose shape is the variable's shape."""
        raise ValueError(f"{type(self).__name__} cannot infer the shape of z; pass init= to the layer's forward")

    def parameters_for_grad(self) -> list[torch.Tensor]:
        """Tensors the energy owns that need gradients (its ``nn.Module`` parameters)."""
        if isinstance(self, nn.Module):
            return [p for p in self.parameters() if p.requires_grad]
        return []


class QuadraticEnergy(Energy):
    """``E(z; Q, c) = ½ zᵀ Q z − cᵀ z`` with ``Q`` (n, n) symmetric positive definite, ``c`` (batch, n).

    With ``Q = I`` and ``c = a`` this is the proximal energy whose box-constrained argmin is the
    clamp (hard sigmoid for ``[0, 1]``). Unconstrained problems and diagonal ``Q`` are solved in
    closed form; the others by an accelerated projected-gradient method.
    """

    def value(self, z, Q, c):
        return 0.5 * ((z @ Q) * z).sum(-1) - (c * z).sum(-1)

    def grad_z(self, z, Q, c):
        return z @ (0.5 * (Q + Q.mT)) - c

    def lipschitz(self, Q, c):
        return float(torch.linalg.eigvalsh(0.5 * (Q + Q.mT).detach().double()).abs().max())

    def conjugate(self, s, Q, c):
        """``E*(s) = ½ (s + c)ᵀ Q⁻¹ (s + c)``."""
        v = s + c
        return 0.5 * (v * torch.linalg.solve(0.5 * (Q + Q.mT), v.mT).mT).sum(-1)

    def strong_convexity(self, Q, c) -> float:
        """``μ = λ_min(Q)`` (Prop. 3)."""
        return float(torch.linalg.eigvalsh(0.5 * (Q + Q.mT).detach().double()).min())

    def closed_form(self, box, shift, Q, c):
        rhs = c if shift is None else c - shift
        if box.is_unconstrained:
            return torch.linalg.solve(0.5 * (Q + Q.mT), rhs.mT).mT
        if bool((Q == torch.diag_embed(torch.diagonal(Q))).all()):
            return box.project(rhs / torch.diagonal(Q))
        return None

    def initial(self, Q, c):
        return torch.zeros_like(c)


class ProximalEnergy(Energy):
    """``E(z; a) = ½‖z − a‖²``; its argmin over a box is ``Π_C(a)`` (ReLU, hard sigmoid, hard tanh).

    The nudged problem ``argmin ½‖z − a‖² + β gᵀz = Π_C(a − βg)`` is the Fenchel / proximal layer of
    Fenchel back-propagation (docs/maths.md §B), so a stack of these layers with the contrastive backward is
    :class:`inferlearn.rules.fenchel.FenchelBackProp`.
    """

    def value(self, z, a):
        return 0.5 * (z - a).pow(2).sum(-1)

    def grad_z(self, z, a):
        return z - a

    def lipschitz(self, a):
        return 1.0

    def conjugate(self, s, a):
        """``E*(s) = ½‖s‖² + sᵀa``."""
        return 0.5 * s.pow(2).sum(-1) + (s * a).sum(-1)

    def closed_form(self, box, shift, a):
        return box.project(a if shift is None else a - shift)

    def initial(self, a):
        return torch.zeros_like(a)


class LeastSquaresEnergy(nn.Module, Energy):
    """``E(z; y) = ½‖D z − y‖² + (ridge/2)‖z‖²`` with a learnable dictionary ``D`` (m, k).

    With ``Box.nonnegative()`` this is non-negative least squares (NNLS): the layer maps a signal
    ``y`` (batch, m) to non-negative codes ``z`` (batch, k). ``D`` is a parameter of this module and
    receives gradients from the layer's backward.

    Args:
        dictionary: initial ``D`` (m, k).
        ridge: ``ridge ≥ 0``; ``ridge > 0`` makes ``E`` strongly convex (unique codes).
    """

    def __init__(self, dictionary: torch.Tensor, ridge: float = 0.0):
        super().__init__()
        if dictionary.dim() != 2:
            raise ValueError(f"Expected a dictionary of shape (m, k), got {tuple(dictionary.shape)}")
        if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
            raise ValueError(f"Invalid ridge: {ridge}")
        self.D = nn.Parameter(dictionary.clone())
        self.ridge = float(ridge)

    def value(self, z, y):
        return 0.5 * (z @ self.D.mT - y).pow(2).sum(-1) + 0.5 * self.ridge * z.pow(2).sum(-1)

    def grad_z(self, z, y):
        D = self.D.detach()
        return (z @ D.mT - y) @ D + self.ridge * z

    def lipschitz(self, y):
        return float(torch.linalg.matrix_norm(self.D.detach().double(), ord=2) ** 2) + self.ridge

    def conjugate(self, s, y):
        """``E*(s) = ½ (s + Dᵀy)ᵀ (DᵀD + ridge·I)⁻¹ (s + Dᵀy) − ½‖y‖²`` (needs ``ridge > 0`` or ``D`` of full
        column rank)."""
        P = self.D.mT @ self.D + self.ridge * torch.eye(self.D.shape[1], dtype=self.D.dtype, device=self.D.device)
        v = s + y @ self.D
        return 0.5 * (v * torch.linalg.solve(P, v.mT).mT).sum(-1) - 0.5 * y.pow(2).sum(-1)

    def initial(self, y):
        return y.new_zeros(y.shape[:-1] + (self.D.shape[1],))


class FunctionEnergy(Energy):
    """A user-supplied energy ``fn(z, *inputs) -> (batch,)`` (gradients by autograd).

    Args:
        fn: the energy, per sample; must be differentiable in ``z`` and the inputs.
        init: ``init(*inputs) -> z0`` giving the starting point (and the shape of ``z``); otherwise
            pass ``init=`` to the layer's forward.
        lipschitz: a Lipschitz constant of ``∇_z fn`` if known (else backtracking).
        convex: whether ``fn`` is convex in ``z`` (informational; non-convexity that the solvers
            notice is reported either way).
        conjugate: ``conjugate(s, *inputs) -> (batch,)``, the convex conjugate ``fn*`` if known (for the
            dual, min–min–min form of :mod:`inferlearn.bilevel.duality`).
    """

    def __init__(self, fn: Callable[..., torch.Tensor], init: Callable[..., torch.Tensor] | None = None,
                 lipschitz: float | None = None, convex: bool = True,
                 conjugate: Callable[..., torch.Tensor] | None = None):
        if not callable(fn):
            raise TypeError(f"FunctionEnergy needs a callable, got {type(fn).__name__}")
        if lipschitz is not None and not (math.isfinite(lipschitz) and lipschitz > 0):
            raise ValueError(f"Invalid lipschitz: {lipschitz}")
        if conjugate is not None and not callable(conjugate):
            raise TypeError(f"conjugate must be callable, got {type(conjugate).__name__}")
        self.fn, self._init, self._lipschitz, self.convex, self._conjugate = fn, init, lipschitz, convex, conjugate

    def conjugate(self, s, *inputs):
        if self._conjugate is None:
            return super().conjugate(s, *inputs)
        return self._conjugate(s, *inputs)

    def value(self, z, *inputs):
        e = self.fn(z, *inputs)
        if e.shape != z.shape[:-1]:
            raise ValueError(f"The energy function must return one value per sample, shape {tuple(z.shape[:-1])}; "
                             f"got {tuple(e.shape)}")
        return e

    def lipschitz(self, *inputs):
        return self._lipschitz

    def initial(self, *inputs):
        if self._init is None:
            return super().initial(*inputs)
        return self._init(*inputs)


class _Shifted(Energy):
    """``E(z) + sᵀz`` with a fixed shift ``s`` (the nudged problem ``E + β gᵀz``)."""

    def __init__(self, energy: Energy, shift: torch.Tensor | None):
        self.energy, self.shift = energy, shift

    def value(self, z, *inputs):
        e = self.energy.value(z, *inputs)
        return e if self.shift is None else e + (self.shift * z).sum(-1)

    def grad_z(self, z, *inputs):
        g = self.energy.grad_z(z, *inputs)
        return g if self.shift is None else g + self.shift

    def lipschitz(self, *inputs):
        return self.energy.lipschitz(*inputs)


# --------------------------------------------------------------------------------------------------
# Solvers
# --------------------------------------------------------------------------------------------------

@dataclass
class AcceleratedProjectedGradient:
    """FISTA with adaptive restart and backtracking for ``min_{z ∈ box} E(z)``.

    Iterates ``z ← Π_C(y − ∇E(y)/L)``, ``y ← z + ((t−1)/t')(z − z_prev)``, restarting the momentum
    when the energy goes up (O'Donoghue & Candès 2015). ``L`` is the energy's Lipschitz constant or
    found by backtracking on the sufficient-decrease condition (doubling). Stops when the residual
    ``max|z − Π_C(z − ∇E(z))| ≤ tol``.

    Failures raise :class:`~inferlearn.errors.ConvergenceError` (``on_fail="raise"``, default) or
    warn with :class:`~inferlearn.errors.ConvergenceWarning` (``"warn"``): non-finite iterates or an
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
        on_fail: ``"raise"`` or ``"warn"``.
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
        if self.on_fail not in ("raise", "warn"):
            raise ValueError(f"Invalid on_fail: {self.on_fail!r} (choose 'raise' or 'warn')")
        if self.on_limit not in (None, "report"):
            raise ValueError(f"Invalid on_limit: {self.on_limit!r} (choose None or 'report')")

    def _fail(self, msg: str) -> None:
        if self.on_fail == "raise":
            raise ConvergenceError(msg)
        warnings.warn(msg, ConvergenceWarning, stacklevel=4)

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


def _as_box(box) -> Box:
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
    box = _as_box(box)
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
    return solver(_Shifted(energy, shift), box, z0, inputs)


# --------------------------------------------------------------------------------------------------
# The argmin layer
# --------------------------------------------------------------------------------------------------

@dataclass
class BackwardInfo:
    """Diagnostics of the last backward of an :class:`ArgminLayer`.

    Attributes:
        solves: the :class:`~inferlearn.engine.solvers.SolveInfo` of each nudged solve, in the
            order of :func:`~inferlearn.engine.phases.nudged_phases` (contrastive), or of the CG
            solve (implicit, ``solver="cg"``).
        active: number of coordinates at a bound.
        weakly_active: coordinates at a bound whose multiplier is (numerically) zero: implicit
            differentiation has no derivative there (Prop. 2) and the reference returns 0.
        energy_gap: ``(E(ẑ) − E(z*))`` summed over the batch for each nudge (≥ 0 for a convex energy).
    """

    solves: list = field(default_factory=list)
    active: int = 0
    weakly_active: int = 0
    energy_gap: list = field(default_factory=list)


class _ArgminFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer, n_inputs, init, *tensors):
        inputs = tensors[:n_inputs]
        z, info = solve(layer.energy, inputs, layer.box, layer.solver, init=init)
        layer._check_solve(info, "forward")
        layer.last_forward = info
        ctx.layer, ctx.n_inputs = layer, n_inputs
        ctx.save_for_backward(z, *tensors)
        return z

    @staticmethod
    def backward(ctx, g):
        z, *tensors = ctx.saved_tensors
        z = z.detach()      # the saved output carries this Function as grad_fn; Danskin holds z fixed
        layer, n = ctx.layer, ctx.n_inputs
        inputs, params = tensors[:n], tensors[n:]
        needs = ctx.needs_input_grad[3:]
        grads = layer._backward(z, g, inputs, params, needs)
        return (None, None, None, *grads)


class ArgminLayer(nn.Module):
    """``z* = argmin_{z ∈ box} E(z; inputs)`` as a module, with a contrastive or implicit backward.

    Args:
        energy: the inner objective (an :class:`Energy`; if it is an ``nn.Module`` its parameters
            are this layer's parameters and receive gradients).
        box: optional constraint ``z ∈ C``: a :class:`~inferlearn.units.Box` (``Box.nonnegative()``,
            ``Box(0, 1)``, per-coordinate tensor bounds, or any unit set such as ``HARD_SIGMOID``) or
            a unit-set name (``"relu"``).
        beta: nudging strength ``β > 0`` of the contrastive backward
            (:func:`~inferlearn.engine.phases.check_beta`), measured against the per-sample loss
            gradient: a batch of ``B`` rows is nudged by ``β B g`` (so β does not depend on the batch size).
        nudging: one of :data:`~inferlearn.engine.phases.NUDGINGS`: ``"positive"`` (``E + βgᵀz``,
            lower bound), ``"negative"`` (``E − βgᵀz``, upper bound) or ``"symmetric"`` (both;
            gradient error O(β²)); the phases are :func:`~inferlearn.engine.phases.nudged_phases`.
        backward: ``"contrastive"`` (the surrogate) or ``"implicit"`` (implicit differentiation,
            the reference; CG with Hessian-vector products on the free coordinates).
        solver: called as ``solver(energy, box, z0, inputs)``; default
            :class:`AcceleratedProjectedGradient` (closed forms are used when the energy has one). With the
            default (``on_limit="report"``), a solve that stops at its iteration limit does not stop training:
            the layer warns once (:class:`~inferlearn.errors.ConvergenceWarning`, naming the residual and the
            fix) and carries on; a diverging solve still raises :class:`~inferlearn.errors.ConvergenceError`
            in one line. A solver you pass keeps its own settings (``on_limit="report"`` gives the same).
        check_energy_gap: raise ``ConvergenceError`` when a nudged solution has *lower* energy than
            the free one (then ``z*`` was not a global minimiser: the energy is not convex, or the
            forward solve stopped early).
        bound_tol: distance to a bound within which a coordinate counts as active.
        cg_tol: relative residual of the implicit backward's conjugate-gradient solve.
        cg_max_iter: iteration limit of that solve.

    References:
        Zach, bilevel paper, Definition 1 and the linearised surrogate (Eq. 37); docs/maths.md §B.

    Note:
        ``β`` is per sample (the nudge is ``β B g`` for ``B`` rows, see :meth:`_beta_rows`), so a
        batch-mean loss does not shrink it. The symmetric linearised surrogate is exact for a quadratic
        energy only while no coordinate switches between active and free under the nudge; with a box,
        switches at the boundary add an O(β) bias (a non-negative least-squares layer: 2.2 % from implicit
        differentiation at β = 1e-2, 0.6 % at 1e-3; ``benchmarks/results/limits.md``), so β trades that bias
        and the curvature of non-quadratic energies against floating-point cancellation.
    """

    def __init__(self, energy: Energy, box: Box | None = None, beta: float = 1e-3, nudging: str = "symmetric",
                 backward: str = "contrastive", solver: Callable | None = None, check_energy_gap: bool = True, bound_tol: float = 1e-9,
                 cg_tol: float = 1e-10, cg_max_iter: int = 1000):
        super().__init__()
        if not isinstance(energy, Energy):
            raise TypeError(f"energy must be an inferlearn.bilevel.Energy, got {type(energy).__name__}; "
                            "wrap a Python function in FunctionEnergy")
        check_nudging(nudging)
        if backward not in BACKWARDS:
            raise ValueError(f"Invalid backward: {backward!r} (choose one of {list(BACKWARDS)})")
        self.beta = check_beta(beta)
        self.energy, self.box, self.nudging, self.backward_mode = energy, _as_box(box), nudging, backward
        self.solver = solver or AcceleratedProjectedGradient(on_limit="report")
        # a solver that reports its iteration limit leaves the verdict to the layer: warn once, carry on
        self._judge = getattr(self.solver, "on_limit", None) == "report"
        self.check_energy_gap, self.bound_tol = check_energy_gap, bound_tol
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self.last_forward: SolveInfo | None = None
        self.last_backward: BackwardInfo | None = None

    def forward(self, *inputs: torch.Tensor, init: torch.Tensor | None = None) -> torch.Tensor:
        for x in inputs:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"ArgminLayer inputs must be tensors, got {type(x).__name__}")
            if x.is_floating_point() and not torch.isfinite(x).all():
                raise ValueError("ArgminLayer input contains NaN or inf values")
        params = tuple(self.energy.parameters_for_grad())
        try:
            return _ArgminFunction.apply(self, len(inputs), init, *inputs, *params)
        except RuntimeError as exc:
            text = str(exc)
            if not any(k in text for k in ("must match the size", "shapes cannot be multiplied", "size mismatch",
                                           "broadcast", "Expected size")):
                raise
            shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
            raise ValueError(f"ArgminLayer inputs of shapes {shapes} do not fit its energy {type(self.energy).__name__} "
                             f"({text.splitlines()[0][:200]}); check the inputs' widths") from None

    def _check_solve(self, info: SolveInfo, phase: str) -> None:
        """With the default solver: a diverged solve raises one line, one stopped short warns once per layer."""
        if not self._judge or info.converged:
            return
        if not math.isfinite(info.residual):
            raise ConvergenceError(f"ArgminLayer: the {phase} solve ({info.solver}) diverged after {info.iterations} "
                                   "iterations; check that the energy is convex in z and bounded below on the box")
        if not getattr(self, "_far_warned", False):
            self._far_warned = True
            warnings.warn(f"ArgminLayer: the {phase} solve ({info.solver}) stopped after {info.iterations} iterations "
                          f"with optimality residual {info.residual:.3g} > tol {info.tol:.3g}; training carries on with "
                          "this point, whose gradient is approximate: raise the solver's max_iter, or use float64 "
                          "(warned once per layer)", ConvergenceWarning, stacklevel=5)

    # -- backward ----------------------------------------------------------------------------------
    def _beta_rows(self, z: torch.Tensor) -> float:
        """``β' = β · B``: β is measured against the per-sample loss gradient (``B`` rows of ``z``), so a
        batch-mean loss, whose gradient ``g`` is ``∝ 1/B``, nudges each sample by the same amount at
        any batch size (as Fenchel back-propagation does)."""
        return self.beta * (z.shape[0] if z.dim() > 1 else 1)

    def _phase_grads(self, zs, phases, inputs, params, needs):
        """Gradients of ``Σ_phase weight · Σ_batch E(ẑ_phase; ·) / β`` w.r.t. inputs and parameters (Danskin)."""
        with torch.enable_grad():
            xs = [x.detach().requires_grad_(need and x.is_floating_point()) for x, need in zip(inputs, needs)]
            diff = sum(p.weight * self.energy.value(zp, *xs) for zp, p in zip(zs, phases)).sum() * (1.0 / self._beta_rows(zs[0]))
            targets = [x for x in xs if x.requires_grad] + [p for p, need in zip(params, needs[len(inputs):]) if need]
            grads = torch.autograd.grad(diff, targets, allow_unused=True) if targets else []
        it = iter(grads)
        out = [next(it) if x.requires_grad else None for x in xs]
        out += [next(it) if need else None for need in needs[len(inputs):]]
        return [torch.zeros_like(t) if (o is None and t is not None and need) else o
                for o, t, need in zip(out, list(inputs) + list(params), needs)]

    def _nudged(self, z, g, sign, inputs, info):
        """``ẑ = argmin_{z ∈ box} E(z) + sign · β gᵀz`` from ``z*``, with the energy-gap check of convexity.

        The nudge moves ``z`` by about ``β B ‖g‖``, so the solve must be accurate to a fraction of that:
        the solver's tolerance is tightened to ``10⁻² β B max|g|``. Where the nudge is within 10× of what
        the dtype resolves, the layer warns (:class:`ConvergenceWarning`).
        """
        solver = self.solver
        beta = self._beta_rows(z)
        nudge = beta * float(g.abs().max()) if g.numel() else 0.0
        floor = precision_floor(z)
        if 0 < nudge < 10 * floor:
            warnings.warn(f"ArgminLayer: the nudge β·B·max|g| = {nudge:.2g} is within 10× the precision of {z.dtype} "
                          f"(residual floor {floor:.2g}); the contrastive gradient is inaccurate: increase beta "
                          "or use float64", ConvergenceWarning, stacklevel=4)
        if isinstance(solver, AcceleratedProjectedGradient) and 0 < 1e-2 * nudge < solver.tol:
            solver = dataclasses.replace(solver, tol=max(1e-2 * nudge, floor))
        ẑ, s = solve(self.energy, inputs, self.box, solver, init=z, shift=sign * beta * g)
        self._check_solve(s, "nudged")
        info.solves.append(s)
        with torch.no_grad():
            gap = float((self.energy.value(ẑ, *inputs) - self.energy.value(z, *inputs)).sum())
        info.energy_gap.append(gap)
        scale = float(self.energy.value(z, *inputs).abs().sum()) + 1.0
        tol = max(1e-6 * scale, 10 * self.solver.tol * float(z.abs().sum() + 1) if hasattr(self.solver, "tol") else 0)
        stopped_short = self.last_forward is not None and not self.last_forward.converged   # warned already
        if self.check_energy_gap and gap < -tol and not stopped_short:
            raise ConvergenceError(f"The nudged solution has lower energy than the free solution (by {-gap:.3g}): "
                                   "z* is not a global minimiser, so the energy is not convex in z (or the "
                                   "forward solve stopped early)")
        return ẑ

    def _backward(self, z, g, inputs, params, needs):
        info = BackwardInfo()
        self.last_backward = info
        with torch.no_grad():
            active = self.box.at_bound(z, self.bound_tol)
            info.active = int(active.sum())
            if info.active:
                gz = self.energy.grad_z(z, *inputs)
                info.weakly_active = int((active & (gz.abs() <= 1e3 * self.bound_tol + 1e-12)).sum())
        if self.backward_mode == "implicit":
            return self._implicit(z, g, inputs, params, needs, active, info)
        phases = nudged_phases(self.nudging)
        zs = [z if p.sign == 0 else self._nudged(z, g, float(p.sign), inputs, info) for p in phases]
        return self._phase_grads(zs, phases, inputs, params, needs)

    def _implicit(self, z, g, inputs, params, needs, active, info):
        """``∇ = −∇²_{θz}E · v`` with ``H_FF v_F = g_F`` on the free coordinates ``F``, ``v = 0`` elsewhere."""
        free = (~active).to(z.dtype)
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            xs_det = [x.detach() for x in inputs]
            (gz,) = torch.autograd.grad(self.energy.value(zz, *xs_det).sum(), zz, create_graph=True)

            def hvp(v):
                (hv,) = torch.autograd.grad(gz, zz, grad_outputs=v, retain_graph=True)
                return hv

            v, s = conjugate_gradient(lambda v: free * hvp(free * v), free * g, tol=self.cg_tol, max_iter=self.cg_max_iter)
        info.solves.append(s)
        v = v.detach()
        with torch.enable_grad():
            xs = [x.detach().requires_grad_(need and x.is_floating_point()) for x, need in zip(inputs, needs)]
            zz = z.detach().requires_grad_(True)
            (gz,) = torch.autograd.grad(self.energy.value(zz, *xs).sum(), zz, create_graph=True)
            cross = -(gz * v).sum()
            targets = [x for x in xs if x.requires_grad] + [p for p, need in zip(params, needs[len(inputs):]) if need]
            grads = torch.autograd.grad(cross, targets, allow_unused=True) if targets else []
        it = iter(grads)
        out = [next(it) if x.requires_grad else None for x in xs]
        out += [next(it) if need else None for need in needs[len(inputs):]]
        return [torch.zeros_like(t) if (o is None and need) else o
                for o, t, need in zip(out, list(inputs) + list(params), needs)]

    def extra_repr(self) -> str:
        return (f"energy={type(self.energy).__name__}, box={self.box!r}, backward={self.backward_mode!r}, "
                f"nudging={self.nudging!r}, beta={self.beta:g}")


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


def argmin(energy: Energy, *inputs: torch.Tensor, box: Box | None = None, beta: float = 1e-3,
           nudging: str = "symmetric", backward: str = "contrastive", solver=None, init=None) -> torch.Tensor:
    """Functional form of :class:`ArgminLayer` (builds a layer and applies it)."""
    return ArgminLayer(energy, box, beta=beta, nudging=nudging, backward=backward, solver=solver)(*inputs, init=init)


def contrastive_surrogate(energy: Energy, loss: Callable[[torch.Tensor], torch.Tensor], *inputs: torch.Tensor,
                          beta: float, box: Box | None = None, solver=None, init=None) -> torch.Tensor:
    """The contrastive surrogate ``L^β = (1/β)[min_z (E + βℓ) − min_z E]`` with the *full* loss ``ℓ``.

    ``beta`` may be negative (``L^{−β}``, nudging away). Returns a scalar whose value is
    ``ℓ(ẑ_β) + (E(ẑ_β) − E(z*))/β`` and whose gradient with respect to the inputs (and the
    energy's parameters) is Danskin's ``[∇E(ẑ_β) − ∇E(z*)]/β``.

    Args:
        loss: ``ℓ(z)``, a scalar (summed over the batch).

    References:
        Zach, bilevel paper, Definition 1; Prop. 3 gives ``ℓ(z*) − β‖∇ℓ(z*)‖²/(2μ) ≤ L^β ≤ ℓ(z*)``.
    """
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta != 0):
        raise ValueError(f"Invalid beta: {beta}")
    z_star, _ = solve(energy, inputs, box, solver, init=init)
    nudged = FunctionEnergy(lambda z, *xs: energy.value(z, *xs) + beta * _per_sample_loss(loss, z))
    z_hat, _ = solve(nudged, inputs, box, solver, init=z_star)
    z_star, z_hat = z_star.detach(), z_hat.detach()
    return loss(z_hat) + (energy.value(z_hat, *inputs) - energy.value(z_star, *inputs)).sum() / beta


def _per_sample_loss(loss, z):
    # The solver sums per-sample energies, so spreading the scalar loss over samples is exact.
    total = loss(z)
    return total.expand(z.shape[:-1]) / max(1, math.prod(z.shape[:-1]))
