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

The energies are in :mod:`~inferlearn.bilevel.energies`, the inner solvers in :mod:`~inferlearn.bilevel.fista`.

References:
    Zach, "Bilevel programs meet deep learning: a unifying view on inference learning methods",
    Definition 1 (contrastive surrogate), Prop. 1-3, Eq. 37 (linearised surrogate); docs/maths.md §B.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..engine.phases import check_beta, check_nudging, nudged_phases
from ..engine.solvers import SolveInfo
from ..errors import ConvergenceError, ConvergenceWarning
from ..units import Box
from .energies import Energy, FunctionEnergy
from .fista import AcceleratedProjectedGradient, as_box, conjugate_gradient, precision_floor, solve

BACKWARDS = ("contrastive", "implicit")



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

    Example:
        >>> import torch
        >>> from inferlearn.bilevel import ArgminLayer, Box, ProximalEnergy
        >>> layer = ArgminLayer(ProximalEnergy(), Box(0, 1))     # argmin_{0 ≤ z ≤ 1} ½‖z − a‖²: the hard sigmoid
        >>> a = torch.tensor([[-0.5, 0.25, 2.0]], dtype=torch.float64, requires_grad=True)
        >>> z = layer(a)
        >>> z.detach()
        tensor([[0.0000, 0.2500, 1.0000]], dtype=torch.float64)
        >>> z.sum().backward()              # the contrastive backward: the clamp's derivative, to the nudge's O(β²)
        >>> torch.allclose(a.grad, torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64), atol=1e-6)
        True
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
        self.energy, self.box, self.nudging, self.backward_mode = energy, as_box(box), nudging, backward
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
    nudged = FunctionEnergy(lambda z, *xs: energy.value(z, *xs) + beta * per_sample_loss(loss, z))
    z_hat, _ = solve(nudged, inputs, box, solver, init=z_star)
    z_star, z_hat = z_star.detach(), z_hat.detach()
    return loss(z_hat) + (energy.value(z_hat, *inputs) - energy.value(z_star, *inputs)).sum() / beta


def per_sample_loss(loss, z):
    # The solver sums per-sample energies, so spreading the scalar loss over samples is exact.
    total = loss(z)
    return total.expand(z.shape[:-1]) / max(1, math.prod(z.shape[:-1]))
