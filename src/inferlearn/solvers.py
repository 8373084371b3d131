"""Inference solvers for lifted networks: ``min_z E(z)`` over the hidden layers of a :class:`LiftedProblem`.

Three solvers, all started from the forward pass (the γ → 0 solution) and all returning the hidden
layers plus a :class:`SolveInfo`:

* :class:`CoordinateDescent` (``"cd"``) -- the paper's solver: every hidden unit in turn, in closed
  form, 15 sweeps. Vectorised over the batch, but a Python loop over units: the faithful reference.
* :class:`BlockProjectedGradient` (``"block-pg"``, the default for training) -- layer-wise
  (block Gauss-Seidel) projected-gradient sweeps with the block-optimal step size, both phases of a
  contrastive step fused into one batch, stopped by a tolerance on the step.
* :class:`ReferenceSolver` (``"reference"``) -- float64, block sweeps to a tight tolerance followed
  by active-set Newton polishing with the dense Hessian: machine-precision minimisers for tests.

The problem is a strongly convex QP with box constraints (MATH.md §A), so every convergent method
reaches the same minimiser. Non-convergence (iteration limit before the tolerance) warns with
:class:`~inferlearn.errors.ConvergenceWarning` or raises :class:`~inferlearn.errors.ConvergenceError`
(``on_fail``); a non-finite iterate always raises. Nothing loops without a bound.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Sec. 5 (coordinate
    descent, 15 sweeps, forward-pass initialisation); Tseng & Yun (2009) for block coordinate
    gradient descent.
"""
from __future__ import annotations

import abc
import math
import warnings
from dataclasses import dataclass

import torch

from .energies import LiftedProblem
from .errors import ConvergenceError, ConvergenceWarning

ON_FAIL = ("warn", "raise", "ignore")


@dataclass
class SolveInfo:
    """What a solve did.

    Attributes:
        solver: solver name.
        iterations: sweeps (or iterations) performed.
        residual: max over rows of the optimality residual at the returned point
            (:meth:`LiftedProblem.residuals`; 0 at the exact minimiser, in activation units).
        converged: whether the tolerance was met (always True for a fixed number of sweeps
            without tolerance).
        tol: the tolerance used (``None`` for a fixed number of sweeps).
    """

    solver: str
    iterations: int
    residual: float
    converged: bool
    tol: float | None = None


def _check_options(max_iter: int, tol: float | None, on_fail: str) -> None:
    if not isinstance(max_iter, int) or isinstance(max_iter, bool) or max_iter < 1:
        raise ValueError(f"Invalid max_iter: {max_iter}")
    if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"Invalid tol: {tol}")
    if on_fail not in ON_FAIL:
        raise ValueError(f"Invalid on_fail: {on_fail!r}; choose one of {list(ON_FAIL)}")


def _finish(name: str, problem: LiftedProblem, hidden: list[torch.Tensor], iterations: int, tol: float | None,
            on_fail: str, residual: float | None = None) -> SolveInfo:
    for k, z in enumerate(hidden, start=1):
        if not torch.isfinite(z).all():
            raise ConvergenceError(f"{name}: non-finite activations in hidden layer {k} after {iterations} iterations "
                                   "(weights too large or inputs non-finite?)")
    if residual is None:
        residual = float(problem.residuals(hidden).max()) if hidden else 0.0
    converged = tol is None or residual <= tol
    info = SolveInfo(name, iterations, residual, converged, tol)
    if not converged:
        msg = (f"{name} stopped after {iterations} iterations with optimality residual {residual:.3g} > tol {tol:.3g}; "
               "raise max_iter or tol")
        if on_fail == "raise":
            raise ConvergenceError(msg)
        if on_fail == "warn":
            warnings.warn(msg, ConvergenceWarning, stacklevel=3)
    return info


class Solver(abc.ABC):
    """An inference solver: ``solve(problem, init=None) -> (hidden, SolveInfo)``."""

    name: str = ""

    def solve(self, problem: LiftedProblem, init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], SolveInfo]:
        """Minimise the problem's energy over its hidden layers.

        Args:
            problem: the batch of problems.
            init: starting hidden layers (feasible); default the forward pass.

        Returns:
            ``(hidden, info)`` with ``hidden = [z_1, …, z_{L-1}]`` (new tensors; ``init`` is not modified).
        """
        if init is None:
            hidden = problem.forward_init()
        else:
            problem.check_feasible(init)
            hidden = [z.clone() for z in init]
        if problem.depth == 1:
            return [], SolveInfo(self.name, 0, 0.0, True, None)
        return self._solve(problem, hidden)

    @abc.abstractmethod
    def _solve(self, problem: LiftedProblem, hidden: list[torch.Tensor]) -> tuple[list[torch.Tensor], SolveInfo]:
        """Solve in place from the (copied) starting point ``hidden``."""


class CoordinateDescent(Solver):
    """The paper's coordinate descent: each hidden unit in turn, in closed form, ``sweeps`` times.

    For unit ``j`` of hidden layer ``k``, with ``w_j`` the j-th column of ``W_k``, ``ρ_k = w_{k+1}/w_k``
    (``= γ``) and ``r = z_{k+1} − a_{k+1}`` the residual of the layer above::

        z_kj ← Π_{C_k}( (a_kj + ρ_k (w_jᵀ r + ‖w_j‖² z_kj)) / (1 + ρ_k ‖w_j‖²) )

    the exact minimiser over ``z_kj`` (MATH.md §A). Layers are traversed bottom-up, units in index
    order, and ``a_{k+1}`` and ``r`` are updated after every unit (rank-one updates), so the sweep is
    exactly sequential. A free output is re-optimised implicitly (its residual stays constant).

    Args:
        sweeps: number of sweeps (the paper: 15).
        tol: optional; stop early when a sweep moves no unit by more than ``tol`` and warn (or
            raise) if the final residual is above ``tol``. ``None`` (default): exactly ``sweeps``
            sweeps, as in the paper, with the residual reported but not enforced.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"``.

    References:
        Zach & Estellers (2019), Sec. 5: "each activation z_kj is updated 15 times".
    """

    name = "cd"

    def __init__(self, sweeps: int = 15, tol: float | None = None, on_fail: str = "warn"):
        _check_options(sweeps, tol, on_fail)
        self.sweeps, self.tol, self.on_fail = sweeps, tol, on_fail

    def _solve(self, problem, hidden):
        e, L = problem.energy, problem.depth
        zs = [problem.x, *hidden]
        a = [None, problem.a1] + [e.pre(k, zs[k - 1]) for k in range(2, L)]
        a_top = e.pre(L, zs[L - 1])
        # r[k] = z_k − a_k for k = 2..L (the residuals seen by the layer below)
        r = [None, None] + [zs[k] - a[k] for k in range(2, L)]
        top = problem.top_residual(a_top)
        r.append(torch.zeros_like(a_top) if top is None else top)
        clamp_col = None
        if problem.n_clamped:
            clamp_col = problem.clamped.to(a_top.dtype).unsqueeze(1)
        cols = []
        for k in range(1, L):
            W = e.weights[k]
            cols.append([(W[:, j].contiguous(), float(W[:, j] @ W[:, j])) for j in range(W.shape[1])])
        it = 0
        for it in range(1, self.sweeps + 1):
            max_move = 0.0
            for k in range(1, L):
                rho, units, z = e.feedback(k), e.units[k - 1], zs[k]
                a_up = a_top if k == L - 1 else a[k + 1]
                for j, (w, w2) in enumerate(cols[k - 1]):
                    old = z[:, j]
                    num = a[k][:, j] + rho * (r[k + 1] @ w + w2 * old)
                    new = units.project(num / (1.0 + rho * w2))
                    d = new - old
                    if self.tol is not None:
                        max_move = max(max_move, float(d.abs().max()))
                    z[:, j] = new
                    if k >= 2:
                        r[k][:, j] += d                     # r_k = z_k − a_k seen by the layer below
                    if k < L - 1:
                        a_up.addr_(d, w)
                        r[k + 1].addr_(d, w, alpha=-1.0)   # r_{k+1} = z_{k+1} − a_{k+1}, a_{k+1} moved
                    else:
                        if clamp_col is not None:
                            r[L].add_(clamp_col * torch.outer(d, w), alpha=-1.0)   # free rows: r_L constant
                        a_top.addr_(d, w)
            if self.tol is not None and max_move <= self.tol:
                break
        return hidden, _finish(self.name, problem, hidden, it, self.tol, self.on_fail)


class _SpectralCache:
    """Largest eigenvalue of ``WᵀW`` by power iteration, warm-started across calls.

    Weights change little between mini-batches, so a few power iterations from the previous
    singular vector track ``‖W‖₂²`` at the cost of a few mat-vecs instead of an SVD.
    """

    def __init__(self, iters: int = 3, cold_iters: int = 30):
        self.iters, self.cold_iters = iters, cold_iters
        self._vecs: dict[tuple, torch.Tensor] = {}

    def __call__(self, W: torch.Tensor) -> float:
        key = (W.data_ptr(), tuple(W.shape), W.dtype, W.device)
        v = self._vecs.get(key)
        n = self.iters
        if v is None:
            g = torch.Generator(device="cpu").manual_seed(0)
            v = torch.randn(W.shape[1], generator=g, dtype=torch.float64).to(W.device, W.dtype)
            n = self.cold_iters
        for _ in range(n):
            v = W.t() @ (W @ v)
            v = v / v.norm().clamp_min(1e-30)
        lam = float((W @ v).pow(2).sum())
        self._vecs[key] = v
        return lam


class BlockProjectedGradient(Solver):
    """Layer-wise projected-gradient sweeps (block Gauss-Seidel), the fast default solver.

    One sweep visits the hidden layers bottom-up; layer ``k`` takes one projected-gradient step on
    its block, with the other layers fixed and its pre-activation ``a_k`` fresh from the layer below::

        z_k ← Π_{C_k}( z_k − t_k [(z_k − a_k) + ρ_k W_kᵀ (W_k z_k + b_k − z_{k+1})] )
        t_k = 2 / (2 + ρ_k · 1.1 λ̂_k),   λ̂_k ≈ λ_max(W_kᵀW_k) (warm-started power iteration)

    ``t_k`` is the step minimising the contraction factor of the block (eigenvalues of its
    Hessian lie in ``[1, 1 + ρ_k λ_max]``) and stays below the descent limit ``2/(1 + ρ_k λ_max)``, so
    every step decreases the energy: block coordinate gradient descent on a strongly convex QP
    converges (Tseng & Yun 2009). The step for ``a_{k+1}`` needed by the next layer is the forward
    product of the updated layer, so a sweep costs about one forward and one backward pass over the
    hidden layers (``W_0`` is not involved: the input is fixed).

    Speed (see ``benchmarks/results/lifted_speed.md``): the problem's rows are independent, so free
    and clamped phases are solved as one stacked batch (half the operations); weak feedback makes
    the forward pass a near-solution, so few sweeps are needed; the stopping test costs a
    reduction per layer and runs every ``check_every`` sweeps.

    Args:
        max_iter: maximum number of sweeps.
        tol: stop when the largest change of a unit in one sweep (divided by ``t_k``: the projected-
            gradient residual) is below ``tol``; then the exact residual is checked against ``tol``.
        check_every: test the stopping criterion every this many sweeps.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` when ``max_iter`` is reached first.

    Note:
        Not in the paper, which uses unit-wise coordinate descent (:class:`CoordinateDescent`); both
        reach the same minimiser (tested against :class:`ReferenceSolver`).
    """

    name = "block-pg"

    def __init__(self, max_iter: int = 100, tol: float | None = 1e-5, check_every: int = 2, on_fail: str = "warn"):
        _check_options(max_iter, tol, on_fail)
        if not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"Invalid check_every: {check_every}")
        self.max_iter, self.tol, self.check_every, self.on_fail = max_iter, tol, check_every, on_fail
        self._spectral = _SpectralCache()

    def steps(self, problem: LiftedProblem) -> list[float]:
        """Step sizes ``t_k`` for hidden layers ``k = 1 … L−1``."""
        e = problem.energy
        out = []
        for k in range(1, problem.depth):
            rho = e.feedback(k)
            if k == problem.depth - 1 and problem.n_clamped == 0:
                out.append(1.0)   # a free output is eliminated: the top block's Hessian is w_k I
            else:
                out.append(2.0 / (2.0 + rho * 1.1 * self._spectral(e.weights[k])))
        return out

    def _solve(self, problem, hidden):
        e, L = problem.energy, problem.depth
        t = self.steps(problem)
        a = [None, problem.a1] + [None] * (L - 1)
        for k in range(2, L + 1):
            a[k] = e.pre(k, hidden[k - 2])
        units = [None] + list(e.units)
        it, move = 0, math.inf
        for it in range(1, self.max_iter + 1):
            check = self.tol is not None and (it % self.check_every == 0 or it == self.max_iter)
            move = 0.0
            for k in range(1, L):
                z = hidden[k - 1]
                if k < L - 1:
                    r = hidden[k] - a[k + 1]
                else:
                    r = problem.top_residual(a[L])
                base = z.lerp(a[k], t[k - 1])
                new = base if r is None else torch.addmm(base, r, e.weights[k], alpha=t[k - 1] * e.feedback(k))
                new = units[k].project(new)
                if check:
                    move = max(move, float((new - z).abs().max()) / t[k - 1])
                hidden[k - 1] = new
                a[k + 1] = e.pre(k + 1, new)
            if check and move <= self.tol:
                break
        return hidden, _finish(self.name, problem, hidden, it, self.tol, self.on_fail)


class ReferenceSolver(Solver):
    """High-accuracy reference: float64 block sweeps, then active-set Newton polishing.

    After ``sweeps`` block projected-gradient sweeps (or earlier, once the residual is below
    ``1e-10``), each Newton step fixes the active set ``A`` (units at a bound whose gradient points
    outward), solves the reduced system ``H_FF d_F = −g_F`` with the dense Hessian
    (:meth:`LiftedEnergy.hessian`) per row, projects onto the box and keeps the step where it lowers
    the energy. At the exact active set this is the exact minimiser, so the residual reaches
    rounding level (``≈ 1e-13``). Returns tensors in the problem's dtype.

    Args:
        sweeps: maximum number of preliminary block sweeps.
        newton_steps: maximum number of polishing steps.
        tol: required final residual (default ``1e-9``).
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"``.
    """

    name = "reference"

    def __init__(self, sweeps: int = 5000, newton_steps: int = 30, tol: float = 1e-9, on_fail: str = "raise"):
        _check_options(sweeps, tol, on_fail)
        self.sweeps, self.newton_steps, self.tol, self.on_fail = sweeps, newton_steps, tol, on_fail

    def _solve(self, problem, hidden):
        dtype = problem.x.dtype
        p64 = problem.to(torch.float64)
        h64 = [z.to(torch.float64) for z in hidden]
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-10, check_every=10, on_fail="ignore")
        h64, info = bpg._solve(p64, h64)
        h64, n_newton = self._polish(p64, h64)
        res = float(p64.residuals(h64).max())
        info = _finish(self.name, p64, h64, info.iterations + n_newton, self.tol, self.on_fail, residual=res)
        return [z.to(dtype) for z in h64], info

    def _polish(self, p: LiftedProblem, hidden: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        e = p.energy
        sizes = e.sizes[1:e.depth]
        lo = torch.cat([torch.full((n,), u.lower, dtype=torch.float64) for n, u in zip(sizes, e.units)]).to(p.x.device)
        hi = torch.cat([torch.full((n,), u.upper, dtype=torch.float64) for n, u in zip(sizes, e.units)]).to(p.x.device)
        H_free, H_clamp = e.hessian(False), e.hessian(True)
        H = torch.where(p.clamped.view(-1, 1, 1), H_clamp, H_free)
        eye = torch.eye(H.shape[1], dtype=torch.float64, device=p.x.device)
        z = torch.cat(hidden, dim=1)

        def split(v):
            return list(torch.split(v, sizes, dim=1))

        steps = 0
        for steps in range(1, self.newton_steps + 1):
            hs = split(z)
            if float(p.residuals(hs).max()) < 1e-13:
                steps -= 1
                break
            g = torch.cat(p.gradients(hs), dim=1)
            active = ((z <= lo) & (g > 0)) | ((z >= hi) & (g < 0))
            free = ~active
            fm = free.to(torch.float64)
            Hf = H * fm.unsqueeze(2) * fm.unsqueeze(1) + torch.diag_embed(active.to(torch.float64)) * eye
            d = torch.linalg.solve(Hf, (-g * fm).unsqueeze(2)).squeeze(2)
            cand = torch.minimum(torch.maximum(z + d, lo), hi)
            better = p.value(split(cand)) <= p.value(hs) + 1e-15 * (1 + p.value(hs).abs())
            z = torch.where(better.unsqueeze(1), cand, z)
            if not bool(better.any()):
                # the Newton step failed everywhere (wrong active set): a few more sweeps, then retry
                bpg = BlockProjectedGradient(max_iter=50, tol=None, on_fail="ignore")
                z = torch.cat(bpg._solve(p, split(z))[0], dim=1)
        return split(z), steps


SOLVERS = {"cd": CoordinateDescent, "block-pg": BlockProjectedGradient, "reference": ReferenceSolver}
DEFAULT_SOLVER = "block-pg"


def get_solver(name: str | Solver = DEFAULT_SOLVER, **options) -> Solver:
    """A solver by name (``cd``, ``block-pg``, ``reference``); options go to its constructor.

    Options set to ``None`` are dropped (the solver's default applies).
    """
    if isinstance(name, Solver):
        return name
    if name not in SOLVERS:
        raise ValueError(f"Unknown solver {name!r}; choose one of {sorted(SOLVERS)}")
    options = {k: v for k, v in options.items() if v is not None}
    if name == "cd" and "max_iter" in options:
        options["sweeps"] = options.pop("max_iter")
    return SOLVERS[name](**options)
