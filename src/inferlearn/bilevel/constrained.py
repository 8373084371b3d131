"""Lower-level constraints that depend on θ: the contrastive surrogate with its multiplier terms.

The bilevel paper (Section 2, after Prop. 2: "This result can be extended if the constraints depend on θ
by incorporating the multipliers λ*") treats inner problems

    z*(θ) = argmin_z E(z; θ)   s.t.   g(z; θ) ≤ 0   (and optionally z ∈ C, a fixed box)

whose feasible set moves with θ: box bounds ``lo(θ) ≤ z``, affine constraints ``A(θ) z ≤ b(θ)``, a
ball ``‖z‖² ≤ r(θ)²``. The contrastive surrogate (Definition 1; docs/maths.md §B) is unchanged,

    L^β(θ) = (1/β) [ min_{g(z;θ) ≤ 0} (E(z;θ) + β ℓ(z)) − min_{g(z;θ) ≤ 0} E(z;θ) ],

but each ``min`` is now the value of a *constrained* problem, whose θ-gradient is the gradient of its
Lagrangian at the primal–dual solution (the envelope theorem for constrained programs; Danskin with
multipliers): for ``V(θ) = min_{g(z;θ) ≤ 0} F(z;θ)`` with KKT pair ``(z, λ)``,
``∇_θ V = ∇_θ F(z;θ) + λᵀ ∇_θ g(z;θ)``. Hence

    ∇_θ L^β = (1/β) [ ∇_θ E(ẑ_β) + λ̂_βᵀ ∇_θ g(ẑ_β)  −  ∇_θ E(z*) − λ*ᵀ ∇_θ g(z*) ],

the multiplier terms ``λ·∂g/∂θ`` taken at the nudged and at the free solution. Dropping them is the
gradient of the surrogate with the constraint set frozen, which is wrong whenever an active bound moves
with θ (tested). As β → 0 this is implicit differentiation of the KKT system on the active set where the
constraints are strongly active (tested against the KKT system solved in float64); the one-sided limit
stays defined at weakly active constraints like Prop. 2.

Two entry points, both differentiable with respect to every input of the energy and of the constraints
and to the parameters of either (when they are ``nn.Module`` objects):

* :func:`constrained_surrogate` evaluates ``L^β`` with the *full* loss ``ℓ`` (value and gradient);
* :class:`ConstrainedArgminLayer` is the argmin layer for such problems: forward ``z*``, backward the
  linearised surrogate (``ℓ̄ = gᵀz``) with the phases of :func:`~inferlearn.engine.phases.nudged_phases`.

Solves use :class:`AugmentedLagrangian` (the method of multipliers; each subproblem is minimised over the
fixed box by the argmin layer's FISTA, :class:`~inferlearn.bilevel.layer.AcceleratedProjectedGradient`),
which returns the multipliers ``λ`` with the primal solution.

References:
    Zach, "Bilevel programs meet deep learning", Definition 1, Prop. 1-2 and the remark after Eq. 19;
    Gould et al. (2016/2021), implicit differentiation of constrained argmin problems; docs/maths.md §B.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.phases import check_beta, check_nudging, nudged_phases
from ..engine.solvers import ON_FAIL, SolveInfo, act_on_failure
from ..errors import ConvergenceWarning
from ..units import Box
from .energies import Energy, FunctionEnergy
from .fista import AcceleratedProjectedGradient, as_box, precision_floor
from .layer import per_sample_loss


class Constraints:
    """Inequality constraints ``g(z; inputs) ≤ 0``, ``m`` per sample: ``fn(z, *inputs) -> (batch, m)``.

    The constraints may depend on θ through their inputs (tensors that require gradients) or, when
    ``fn`` is an ``nn.Module``, through its parameters. ``g`` must be convex in ``z`` for the solver's
    guarantees (affine, boxes, balls).

    Args:
        fn: the constraint function.
    """

    def __init__(self, fn: Callable[..., torch.Tensor]):
        if not callable(fn):
            raise TypeError(f"Constraints needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def value(self, z: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``g(z; inputs)``, shape ``(batch, m)``."""
        g = self.fn(z, *inputs)
        if g.dim() != 2 or g.shape[0] != z.shape[0]:
            raise ValueError(f"The constraint function must return shape (batch, m) = ({z.shape[0]}, m); "
                             f"got {tuple(g.shape)}")
        return g

    def parameters_for_grad(self) -> list[torch.Tensor]:
        """Parameters of ``fn`` (when it is an ``nn.Module``) that need gradients."""
        return [p for p in self.fn.parameters() if p.requires_grad] if isinstance(self.fn, nn.Module) else []

    @classmethod
    def lower_bounds(cls) -> "Constraints":
        """``lo − z ≤ 0`` with the bound ``lo`` (batch, n) as the constraints' one input."""
        return cls(lambda z, lo: lo - z)

    @classmethod
    def affine(cls) -> "Constraints":
        """``A z − b ≤ 0`` with inputs ``A`` (m, n) and ``b`` (batch, m) or (m,)."""
        return cls(lambda z, A, b: z @ A.mT - b)


@dataclass
class KKTInfo:
    """A constrained solve: the multipliers and how well the KKT conditions hold.

    Attributes:
        solve: the :class:`~inferlearn.engine.solvers.SolveInfo` (``solver="augmented-lagrangian"``,
            ``iterations`` = outer multiplier updates, ``residual`` = the largest of the primal violation
            ``max(g, 0)``, the complementarity ``|λ g|`` and the last subproblem's residual).
        inner_iterations: total subproblem iterations.
    """

    solve: SolveInfo
    inner_iterations: int = 0


@dataclass
class AugmentedLagrangian:
    """The method of multipliers for ``min_{z ∈ C} F(z)  s.t.  g(z) ≤ 0`` (convex ``F``, ``g``).

    Each outer iteration minimises over the fixed box ``C`` the augmented Lagrangian
    ``F(z) + (1/2ρ) Σ_i (max(0, λ_i + ρ g_i(z))² − λ_i²)`` with ``inner`` (FISTA), then updates
    ``λ ← max(0, λ + ρ g(z))``. Stops when the primal violation, the complementarity ``|λ g|`` and the
    subproblem's residual are all at most ``tol``.

    Args:
        rho: penalty parameter ``ρ > 0``.
        tol: KKT tolerance.
        max_outer: outer iteration limit.
        inner: the subproblem solver (its tolerance is tightened to ``tol``).
        on_fail: ``"raise"`` (:class:`~inferlearn.errors.ConvergenceError`), ``"warn"`` or ``"ignore"`` (recorded in the
            returned info only), as every solver of the library.
    """

    rho: float = 100.0
    tol: float = 1e-9
    max_outer: int = 200
    inner: AcceleratedProjectedGradient = dataclasses.field(
        default_factory=lambda: AcceleratedProjectedGradient(max_iter=20000, tol=1e-10))
    on_fail: str = "raise"

    def __post_init__(self) -> None:
        if not (isinstance(self.rho, (int, float)) and math.isfinite(self.rho) and self.rho > 0):
            raise ValueError(f"Invalid rho: {self.rho}")
        if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and self.tol > 0):
            raise ValueError(f"Invalid tol: {self.tol}")
        if not (isinstance(self.max_outer, int) and self.max_outer >= 1):
            raise ValueError(f"Invalid max_outer: {self.max_outer}")
        if self.on_fail not in ON_FAIL:
            raise ValueError(f"Invalid on_fail: {self.on_fail!r}; choose one of {list(ON_FAIL)}")

    @torch.no_grad()
    def __call__(self, objective: Energy, constraints: Constraints, inputs: Sequence[torch.Tensor],
                 c_inputs: Sequence[torch.Tensor], box: Box, z0: torch.Tensor,
                 lam0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, KKTInfo]:
        rho = float(self.rho)
        z = box.project(z0)
        lam = torch.zeros_like(constraints.value(z, *c_inputs)) if lam0 is None else lam0.clone()
        tol = max(self.tol, precision_floor(z))
        n_inner, res = 0, math.inf
        for it in range(1, self.max_outer + 1):
            lam_k = lam

            def augmented(zz, *xs, lam_k=lam_k):
                g = constraints.value(zz, *c_inputs)
                pen = (lam_k + rho * g).clamp(min=0).pow(2) - lam_k.pow(2)
                return objective.value(zz, *xs) + pen.sum(-1) / (2 * rho)

            # inexact subproblems: a tenth of the last KKT residual, down to tol (the final ones are exact)
            inner = dataclasses.replace(self.inner, tol=max(min(self.inner.tol, tol), min(1e-3, 0.1 * res)),
                                        on_fail="warn")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)   # judged below on the KKT residual
                z, s = inner(FunctionEnergy(augmented), box, z, inputs)
            n_inner += s.iterations
            g = constraints.value(z, *c_inputs)
            lam = (lam + rho * g).clamp(min=0)
            res = max(float(g.clamp(min=0).abs().max()) if g.numel() else 0.0,
                      float((lam * g).abs().max()) if g.numel() else 0.0, s.residual)
            if not math.isfinite(res):
                break
            if res <= tol and s.residual <= tol and float((lam - lam_k).abs().max() if g.numel() else 0.0) <= tol * (1 + rho):
                return z, lam, KKTInfo(SolveInfo("augmented-lagrangian", it, res, True, tol), n_inner)
        msg = (f"augmented Lagrangian: KKT residual {res:.3g} > tol {tol:.3g} after {self.max_outer} outer "
               "iterations; the constraints may be infeasible, or raise max_outer")
        act_on_failure(msg, self.on_fail, stacklevel=3)
        return z, lam, KKTInfo(SolveInfo("augmented-lagrangian", self.max_outer, res, False, tol), n_inner)


def _check_inputs(*groups: Sequence[torch.Tensor]) -> None:
    for group in groups:
        for x in group:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"Inputs must be tensors, got {type(x).__name__}")
            if x.is_floating_point() and not torch.isfinite(x).all():
                raise ValueError("Input contains NaN or inf values")


def solve_constrained(energy: Energy, constraints: Constraints, inputs: Sequence[torch.Tensor] = (),
                      constraint_inputs: Sequence[torch.Tensor] = (), box: Box | None = None, solver=None,
                      init: torch.Tensor | None = None, shift: torch.Tensor | None = None,
                      loss: Callable[[torch.Tensor], torch.Tensor] | None = None, beta: float = 0.0,
                      init_multipliers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, KKTInfo]:
    """``argmin_{z ∈ box, g(z) ≤ 0} E(z; inputs) + shiftᵀz + β ℓ(z)`` and its multipliers ``λ`` (batch, m).

    ``init`` and ``init_multipliers`` warm-start the solve (nudged solves start from the free KKT pair).

    Returns:
        ``(z, λ, info)``.

    Raises:
        ValueError: non-finite inputs, a shift whose shape is not ``z``'s.
        ConvergenceError: no KKT point found (see :class:`AugmentedLagrangian`).
    """
    if not isinstance(constraints, Constraints):
        raise TypeError(f"constraints must be inferlearn.bilevel.Constraints, got {type(constraints).__name__}")
    _check_inputs(inputs, constraint_inputs)
    box = as_box(box)
    inputs = [x.detach() for x in inputs]
    c_inputs = [x.detach() for x in constraint_inputs]
    z0 = init.detach() if init is not None else energy.initial(*inputs)
    box.check(z0.shape)
    if shift is not None and shift.shape != z0.shape:
        raise ValueError(f"Shift of shape {tuple(shift.shape)} does not match z of shape {tuple(z0.shape)}")

    def objective(z, *xs):
        v = energy.value(z, *xs)
        if shift is not None:
            v = v + (shift * z).sum(-1)
        if loss is not None and beta != 0:
            v = v + beta * per_sample_loss(loss, z)
        return v

    solver = solver or AugmentedLagrangian()
    return solver(FunctionEnergy(objective), constraints, inputs, c_inputs, box, z0, init_multipliers)


def _lagrangian(energy: Energy, constraints: Constraints, z: torch.Tensor, lam: torch.Tensor,
                inputs: Sequence[torch.Tensor], c_inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``Σ_batch E(z; inputs) + λᵀ g(z; c_inputs)`` (z, λ held fixed: Danskin with multipliers)."""
    return energy.value(z, *inputs).sum() + (lam * constraints.value(z, *c_inputs)).sum()


def constrained_surrogate(energy: Energy, constraints: Constraints, loss: Callable[[torch.Tensor], torch.Tensor],
                          inputs: Sequence[torch.Tensor] = (), constraint_inputs: Sequence[torch.Tensor] = (), *,
                          beta: float, box: Box | None = None, solver=None, init=None) -> torch.Tensor:
    """``L^β = (1/β)[min_{g ≤ 0} (E + βℓ) − min_{g ≤ 0} E]`` with the full loss, constraints ``g(z; θ) ≤ 0``.

    Returns a scalar whose value is ``ℓ(ẑ) + (E(ẑ) − E(z*))/β`` (the multiplier terms vanish in the value
    by complementary slackness) and whose gradient with respect to the inputs of the energy and of the
    constraints (and their parameters) is ``(1/β)[∇(E + λ̂ᵀg)(ẑ) − ∇(E + λ*ᵀg)(z*)]``.
    ``beta`` may be negative (``L^{−β}``, an upper bound).

    Args:
        loss: ``ℓ(z)``, a scalar (summed over the batch).
    """
    if not (isinstance(beta, (int, float)) and not isinstance(beta, bool) and math.isfinite(beta) and beta != 0):
        raise ValueError(f"Invalid beta: {beta}")
    z_star, lam_star, _ = solve_constrained(energy, constraints, inputs, constraint_inputs, box, solver, init)
    z_hat, lam_hat, _ = solve_constrained(energy, constraints, inputs, constraint_inputs, box, solver, z_star,
                                          loss=loss, beta=beta, init_multipliers=lam_star)
    z_star, z_hat = z_star.detach(), z_hat.detach()
    diff = (_lagrangian(energy, constraints, z_hat, lam_hat, inputs, constraint_inputs)
            - _lagrangian(energy, constraints, z_star, lam_star, inputs, constraint_inputs))
    with torch.no_grad():   # λᵀg = 0 at a KKT point: remove the solver's residual complementarity from the value
        slack = ((lam_hat * constraints.value(z_hat, *constraint_inputs)).sum()
                 - (lam_star * constraints.value(z_star, *constraint_inputs)).sum())
    return loss(z_hat) + (diff - slack) / beta


class _ConstrainedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer, n_inputs, n_c, init, *tensors):
        inputs, c_inputs = tensors[:n_inputs], tensors[n_inputs:n_inputs + n_c]
        z, lam, info = solve_constrained(layer.energy, layer.constraints, inputs, c_inputs, layer.box, layer.solver,
                                         init)
        layer.last_forward, layer.last_multipliers = info, lam
        ctx.layer, ctx.n, ctx.n_c = layer, n_inputs, n_c
        ctx.save_for_backward(z, lam, *tensors)
        return z

    @staticmethod
    def backward(ctx, g):
        z, lam, *tensors = ctx.saved_tensors
        return (None, None, None, None, *ctx.layer._backward(z.detach(), lam, g, tensors, ctx.n, ctx.n_c,
                                                             ctx.needs_input_grad[4:]))


class ConstrainedArgminLayer(nn.Module):
    """``z* = argmin_{z ∈ box} E(z; inputs)  s.t.  g(z; constraint_inputs) ≤ 0`` with a contrastive backward.

    Backward receives ``g_out = ∂ℓ/∂z*`` and, for each phase of
    :func:`~inferlearn.engine.phases.nudged_phases`, solves ``ẑ = argmin E ± β' g_outᵀz`` under the same
    constraints with multipliers ``λ̂``; the gradient with respect to every input (of the energy and of the
    constraints) and parameter is ``Σ_phase weight · ∇[E(ẑ) + λ̂ᵀ g(ẑ)] / β'`` (β per sample,
    ``β' = β · batch``, as :class:`~inferlearn.bilevel.layer.ArgminLayer`).

    Args:
        energy: the inner objective.
        constraints: the θ-dependent constraints (:class:`Constraints`).
        box: an optional fixed box ``z ∈ C`` handled by projection.
        beta: nudging strength ``β > 0``.
        nudging: ``"positive"``, ``"negative"`` or ``"symmetric"``.
        solver: an :class:`AugmentedLagrangian`.

    Attributes:
        last_multipliers: ``λ*`` of the last forward (batch, m).
        last_backward: ``[(ẑ, λ̂), …]`` of the last backward's nudged solves.
    """

    def __init__(self, energy: Energy, constraints: Constraints, box: Box | None = None, beta: float = 1e-3,
                 nudging: str = "symmetric", solver: AugmentedLagrangian | None = None):
        super().__init__()
        if not isinstance(energy, Energy):
            raise TypeError(f"energy must be an inferlearn.bilevel.Energy, got {type(energy).__name__}")
        if not isinstance(constraints, Constraints):
            raise TypeError(f"constraints must be inferlearn.bilevel.Constraints, got {type(constraints).__name__}")
        self.beta, self.nudging = check_beta(beta), check_nudging(nudging)
        self.energy, self.constraints, self.box = energy, constraints, as_box(box)
        self.solver = solver or AugmentedLagrangian()
        if isinstance(constraints.fn, nn.Module):
            self.constraint_fn = constraints.fn     # its parameters are this layer's (the energy registers itself)
        self.last_forward: KKTInfo | None = None
        self.last_multipliers: torch.Tensor | None = None
        self.last_backward: list = []

    def forward(self, *inputs: torch.Tensor, constraint_inputs: Sequence[torch.Tensor] = (),
                init: torch.Tensor | None = None) -> torch.Tensor:
        _check_inputs(inputs, constraint_inputs)
        params = tuple(self.energy.parameters_for_grad()) + tuple(self.constraints.parameters_for_grad())
        return _ConstrainedFunction.apply(self, len(inputs), len(constraint_inputs), init, *inputs,
                                          *constraint_inputs, *params)

    def _backward(self, z, lam, g, tensors, n, n_c, needs):
        inputs, c_inputs, params = tensors[:n], tensors[n:n + n_c], tensors[n + n_c:]
        beta = self.beta * (z.shape[0] if z.dim() > 1 else 1)
        solver = self.solver
        nudge = beta * float(g.abs().max()) if g.numel() else 0.0
        if 0 < 1e-2 * nudge < solver.tol:   # the solve must resolve a fraction of the nudge
            solver = dataclasses.replace(solver, tol=max(1e-2 * nudge, precision_floor(z)))
        self.last_backward = []
        sols = []
        for p in nudged_phases(self.nudging):
            if p.sign == 0:
                sols.append((z, lam))
                continue
            zh, lh, _ = solve_constrained(self.energy, self.constraints, inputs, c_inputs, self.box, solver, z,
                                          shift=float(p.sign) * beta * g, init_multipliers=lam)
            self.last_backward.append((zh, lh))
            sols.append((zh, lh))
        m = n + n_c
        with torch.enable_grad():
            xs = [x.detach().requires_grad_(need and x.is_floating_point()) for x, need in zip(tensors[:m], needs[:m])]
            total = sum(p.weight * _lagrangian(self.energy, self.constraints, zp, lp, xs[:n], xs[n:])
                        for (zp, lp), p in zip(sols, nudged_phases(self.nudging))) / beta
            targets = [x for x in xs if x.requires_grad] + [q for q, need in zip(params, needs[m:]) if need]
            grads = torch.autograd.grad(total, targets, allow_unused=True) if targets else []
        it = iter(grads)
        out = [next(it) if x.requires_grad else None for x in xs]
        out += [next(it) if need else None for need in needs[m:]]
        return [torch.zeros_like(t) if (o is None and need) else o for o, t, need in zip(out, tensors, needs)]

    def extra_repr(self) -> str:
        return f"energy={type(self.energy).__name__}, box={self.box!r}, nudging={self.nudging!r}, beta={self.beta:g}"
