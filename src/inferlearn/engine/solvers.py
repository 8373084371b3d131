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

The problem is a strongly convex QP with box constraints (docs/maths.md §A), so every convergent method
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

from .compiled import CompiledStep
from .dense import LiftedProblem
from .error_inference import ErrorProblem
from .layered import LayeredProblem, gram_norm_bound, operator_norm_sq
from ..errors import ConvergenceError, ConvergenceWarning, NonFiniteError

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


def warn_far(owner, info: SolveInfo, message: str, on_fail: str = "warn", stacklevel: int = 3) -> None:
    """Mark ``info`` far from equilibrium and act on it (``on_fail``): ``"warn"`` issues ``message`` as a
    :class:`~inferlearn.errors.ConvergenceWarning` once per ``owner`` (the solver or rule: once per run),
    ``"raise"`` raises :class:`~inferlearn.errors.ConvergenceError`, ``"ignore"`` only records it."""
    info.far = True
    if on_fail == "raise":
        raise ConvergenceError(message)
    if on_fail == "warn" and not getattr(owner, "_far_warned", False):
        owner._far_warned = True
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


def _check_options(max_iter: int, tol: float | None, on_fail: str) -> None:
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
        elif on_fail == "warn" and not getattr(owner, "_tol_warned", False):
            owner._tol_warned = True
            warnings.warn(msg + " (warned once per run)", ConvergenceWarning, stacklevel=3)
    return info


class Solver(abc.ABC):
    """An inference solver: ``solve(problem, init=None) -> (hidden, SolveInfo)``."""

    name: str = ""

    def solve(self, problem: LiftedProblem, init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], SolveInfo]:
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
            return self._solve(problem, hidden, list(pre))

    @abc.abstractmethod
    def _solve(self, problem: LiftedProblem, hidden: list[torch.Tensor],
               pre: list[torch.Tensor | None]) -> tuple[list[torch.Tensor], SolveInfo]:
        """Solve from ``hidden`` (copies when ``in_place``), ``pre[k] = a_k`` of that point (k = 1 … L)."""

    in_place: bool = True


class CoordinateDescent(Solver):
    """The paper's coordinate descent: each hidden unit in turn, in closed form, ``sweeps`` times.

    For unit ``j`` of hidden layer ``k``, with ``w_j`` the j-th column of ``W_k``, ``ρ_k = w_{k+1}/w_k``
    (``= γ``) and ``r = z_{k+1} − a_{k+1}`` the residual of the layer above::

        z_kj ← Π_{C_k}( (a_kj + ρ_k (w_jᵀ r + ‖w_j‖² z_kj)) / (1 + ρ_k ‖w_j‖²) )

    the exact minimiser over ``z_kj`` (docs/maths.md §A). Layers are traversed bottom-up, units in index
    order, and ``a_{k+1}`` and ``r`` are updated after every unit (rank-one updates), so the sweep is
    exactly sequential. A free output is re-optimised implicitly (its residual stays constant).

    Args:
        sweeps: number of sweeps (the paper: 15).
        tol: optional; stop early when a sweep moves no unit by more than ``tol`` and warn (or
            raise) if the final residual is above ``tol``. ``None`` (default): exactly ``sweeps``
            sweeps, as in the paper; the residual (:meth:`LiftedProblem.residuals`, evaluated at the start
            and at the end) is then judged relative to the starting one: converged when it fell by
            :data:`CONVERGED_RTOL` (1e-3), *far* when it did not fall by ``far_rtol``.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` when ``tol`` is missed, or without ``tol`` when the
            sweeps end far from the minimiser (warned once per solver, i.e. once per run).
        far_rtol: the *far* threshold of a run without ``tol`` (``None``: never far). 1e-3: on the library's
            standard runs (MNIST and digits MLPs, ReLU and hard-sigmoid, γ = 1/16 … 1/2, float32) 15 sweeps
            bring the residual to the float32 floor, 2e-6 … 3e-5 of its start; at γ = 0.5 with weights × 2
            (MLP 20-16-16-5) they stop at 2e-3 … 0.1 of it, with activations off by 0.01 … 0.34
            (``benchmarks/investigations/convergence_checks.py``).

    References:
        Zach & Estellers (2019), Sec. 5: "each activation z_kj is updated 15 times".
    """

    name = "cd"

    def __init__(self, sweeps: int = 15, tol: float | None = None, on_fail: str = "warn",
                 far_rtol: float | None = CONVERGED_RTOL):
        _check_options(sweeps, tol, on_fail)
        self.sweeps, self.tol, self.on_fail, self.far_rtol = sweeps, tol, on_fail, far_rtol

    def _solve(self, problem, hidden, pre):
        e, L = problem.energy, problem.depth
        initial = float(problem.residuals(hidden).max()) if self.tol is None else None   # one gradient, ≪ a sweep
        zs = [problem.x, *hidden]
        a = [None, problem.a1] + [pre[k].clone() for k in range(2, L)]
        a_top = pre[L].clone()
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
        info = finish(self.name, problem, hidden, it, self.tol, self.on_fail, initial=initial, owner=self)
        judge_far(self, info, hidden, f"{self.sweeps} sweeps", "raise max_iter (the sweeps), or use solver "
                  "'block-pg' (it stops on a tolerance)")
        return hidden, info


def gram_lambda_max(W: torch.Tensor) -> float:
    """``λ_max(WᵀW) = ‖W‖₂²``, bounded from above within a few per cent (:func:`gram_norm_bound`).

    A pure function of ``W`` (no state carried between calls, so a resumed run takes the same steps).
    Raises :class:`ConvergenceError` for non-finite weights.
    """
    lam = gram_norm_bound(W)
    if not math.isfinite(lam):
        raise NonFiniteError("Cannot solve the inference problem: non-finite weights")
    return lam


def _norm_sq(problem, k: int, hidden) -> float:
    """``λ_max(A_{k+1}ᵀA_{k+1})`` for the step sizes (on a graph the bound ``Σ_c ρ_{kc} (Σ_{e: k→c} ‖A_e‖₂)²`` of the
    block's scaled curvature over its children ``c``, divided by ``ρ_k``), remembered on the energy for the weights'
    current version.

    EqProp solves its free and nudged phases on one energy: the second solve reuses the first one's bounds
    (for a conv net, 30 power iterations per layer). Keyed on the parameters' version counters, which every
    in-place update (an optimiser step) bumps, so an energy kept across updates never reuses a stale value.
    """
    e = problem.energy
    cache = e.__dict__.setdefault("_norm_sq_cache", {})
    if isinstance(problem, LayeredProblem):
        z = hidden[k - 1]
        if e.chain.is_chain:
            link = e.link(k + 1)
            key = (k, tuple(z.shape[1:]), z.dtype, z.device, tuple((id(p), p._version) for p in link.parameters()))
            if key not in cache:
                cache[key] = operator_norm_sq(link, z.shape[1:], z.dtype, z.device)
            return cache[key]
        skip_top = problem.n_clamped == 0   # a free output is eliminated: its term is constant in z_k
        total = 0.0
        for c in sorted({c for c, _ in e.out_edges(k)}):
            if c == problem.depth and skip_top:
                continue
            norm = 0.0
            for cc, edge in e.out_edges(k):
                if cc != c:
                    continue
                key = (id(edge), tuple(z.shape[1:]), z.dtype, z.device,
                       tuple((id(p), p._version) for p in edge.parameters()))
                if key not in cache:
                    cache[key] = operator_norm_sq(edge, z.shape[1:], z.dtype, z.device)
                norm += math.sqrt(max(cache[key], 0.0))
            total += e.feedback(k, c) * norm ** 2
        return total / e.feedback(k)
    else:
        W = e.weights[k]
        key = (k, W.data_ptr(), W._version, tuple(W.shape), W.dtype)
        if key not in cache:
            cache[key] = gram_lambda_max(W)
    return cache[key]


class BlockProjectedGradient(Solver):
    """Layer-wise projected-gradient sweeps (block Gauss-Seidel), the fast default solver.

    One sweep visits the hidden layers bottom-up; layer ``k`` takes one projected-gradient step on
    its block, with the other layers fixed and its pre-activation ``a_k`` fresh from the layer below::

        z_k ← Π_{C_k}( z_k − t_k [(z_k − a_k) + ρ_k W_kᵀ (W_k z_k + b_k − z_{k+1})] )
        t_k = min(ω · 2 / (2 + ρ_k Λ_k), 1.9 / (1 + ρ_k Λ_k)),   Λ_k = 1.1 λ̂_k,  λ̂_k ≈ λ_max(W_kᵀW_k) (from above)

    ``2 / (2 + ρ_k λ_max)`` is the step minimising the contraction factor of the block (the
    eigenvalues of its scaled Hessian lie in ``[1, 1 + ρ_k λ_max]``); ``ω = 1.2`` over-relaxes it
    (as in SOR: the layers are coupled, and over-relaxed block Gauss-Seidel needs fewer sweeps --
    measured 6-7 instead of 9-10 for ``tol = 1e-5``; ω = 1.4 is already worse), and the cap keeps
    every step below the descent limit ``2/(1 + ρ_k λ_max)``, so every step decreases the energy:
    block coordinate gradient descent on a strongly convex QP converges (Tseng & Yun 2009). A free output is eliminated, so the top
    block of a free row is ``w_k I`` and its step is exact (``t = 1``). The updated layer's forward
    product ``a_{k+1}`` is what the next layer needs, so a sweep costs about one forward and one
    backward pass over the hidden layers (``W_0`` is not involved: the input is fixed).

    Speed (``benchmarks/results/lifted_speed.md``): rows are independent, so free and clamped
    phases are solved as one stacked batch; weak feedback makes the forward pass a near-solution,
    so few sweeps are needed; ``λ`` comes from a few squarings of the small Gram matrix (:func:`gram_norm_bound`);
    the stopping test runs every ``check_every`` sweeps.

    Args:
        max_iter: maximum number of sweeps.
        tol: stop when the largest projected-gradient step of a sweep (``max |Δz_k| / t_k``, in
            activation units) is at most ``tol``; ``None`` runs exactly ``max_iter`` sweeps and judges the
            exact residual at the end against the first sweep's step (the residual at the start): converged
            below :data:`CONVERGED_RTOL` (1e-3) of it, *far* above ``far_rtol`` of it.
        check_every: test the stopping criterion every this many sweeps.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` when ``max_iter`` is reached first (or, without
            ``tol``, when the sweeps end far from the minimiser: warned once per solver, i.e. once per run).
        far_rtol: the *far* threshold without ``tol`` (``None``: never far); 1e-3, as :class:`CoordinateDescent`
            (the lifted-Fenchel rule's 15 sweeps end at 1e-6 … 3e-6 of the starting residual on MNIST and
            digits MLPs).
        residual: ``"step"`` (default) reports the last checked sweep's step, a by-product of the
            iteration; ``"exact"`` evaluates :meth:`LiftedProblem.residuals` at the returned point
            (one more gradient evaluation).
        relaxation: the over-relaxation factor ``ω ∈ (0, 2)`` (1 = plain block steps).

    Note:
        Not in the paper, which uses unit-wise coordinate descent (:class:`CoordinateDescent`); both
        reach the same minimiser (tested against :class:`ReferenceSolver`).
    """

    name = "block-pg"
    in_place = False

    def __init__(self, max_iter: int = 100, tol: float | None = 1e-5, check_every: int = 2, on_fail: str = "warn",
                 residual: str = "step", relaxation: float = 1.2, safe_steps: bool = False,
                 far_rtol: float | None = CONVERGED_RTOL):
        _check_options(max_iter, tol, on_fail)
        self.far_rtol = far_rtol
        if not (isinstance(relaxation, (int, float)) and 0 < relaxation < 2):
            raise ValueError(f"Invalid relaxation: {relaxation}")
        self.relaxation = float(relaxation)
        if not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"Invalid check_every: {check_every}")
        if residual not in ("step", "exact"):
            raise ValueError(f"Invalid residual: {residual!r}; choose 'step' or 'exact'")
        self.max_iter, self.tol, self.check_every, self.on_fail = max_iter, tol, check_every, on_fail
        self.residual, self.safe_steps = residual, safe_steps

    def steps(self, problem: LiftedProblem | LayeredProblem, hidden: list[torch.Tensor] | None = None) -> list[float]:
        """Step sizes ``t_k`` (in units of ``∂E/∂z_k / w_k``) for hidden layers ``k = 1 … L−1``.

        ``safe_steps``: ``ω / (1 + ρ_k λ_k)`` (the Lipschitz step times ``ω``), else the over-relaxed
        contraction-optimal step above. ``λ_k = ‖A_{k+1}‖₂²`` (for a generic chain by power iteration on
        the map, for which ``hidden`` gives the shapes).
        """
        e = problem.energy
        out = []
        for k in range(1, problem.depth):
            rho = e.feedback(k)
            only_top = all(c == problem.depth for c, _ in e.out_edges(k)) if isinstance(problem, LayeredProblem) \
                else k == problem.depth - 1
            if only_top and problem.n_clamped == 0 and not self.safe_steps:
                out.append(1.0)   # a free output is eliminated: the top block's Hessian is w_k I
                continue
            lam = _norm_sq(problem, k, hidden)
            if not math.isfinite(lam):
                raise NonFiniteError(f"{self.name}: non-finite weights (‖W_{k}‖₂² = {lam}); cannot solve")
            if self.safe_steps:
                out.append(self.relaxation / (1.0 + rho * lam))
            else:
                lam = 1.1 * lam   # margin for power iteration, which approaches λ_max from below
                out.append(min(self.relaxation * 2.0 / (2.0 + rho * lam), 1.9 / (1.0 + rho * lam)))
        return out

    def _sweeps(self, sweep) -> tuple[int, float, float | None]:
        """Run ``sweep(check)`` up to ``max_iter`` times; stop when a checked sweep's largest step is ≤ tol.

        Returns ``(sweeps done, last checked step, first sweep's step)``; one synchronisation per checked sweep.
        Without ``tol`` only the first sweep is checked: its step is the residual at the start, the scale of
        the relative verdict (:meth:`_finish`); with ``tol`` the third value is ``None``.
        """
        it, move, first = 0, math.inf, None
        for it in range(1, self.max_iter + 1):
            check = (it % self.check_every == 0 or it == self.max_iter) if self.tol is not None else it == 1
            moves = sweep(check)
            if check:
                move = float(moves[0] if len(moves) == 1 else torch.stack(moves).max())
                if self.tol is None:
                    first = move
                elif move <= self.tol:
                    break
        return it, move, first

    def _finish(self, problem, hidden, it: int, move: float, first: float | None) -> SolveInfo:
        res = move if (self.residual == "step" and self.tol is not None) else None
        info = finish(self.name, problem, hidden, it, self.tol, self.on_fail, residual=res, initial=first, owner=self)
        return judge_far(self, info, hidden, f"{it} sweeps", "raise the sweeps (max_iter), or give a tol")

    def _solve_layered(self, problem: LayeredProblem, hidden, pre):
        """The same sweeps on a generic chain: forwards and adjoints through the layer maps."""
        e, L = problem.energy, problem.depth
        t = self.steps(problem, hidden)
        if LIFTED_SWEEP.active(problem.x.device) and e.chain.is_chain and all(
                e.link(k)._lone_linear for k in range(2, L + 1)) and all(h.dim() == 2 for h in hidden):
            return self._solve_layered_linear(problem, hidden, pre, t)
        adj = problem.adjoints(hidden)
        units = [e.link(k).units for k in range(1, L)]
        links = e.chain.links
        children = [None] + [sorted({c for c, _ in e.out_edges(k)}) for k in range(1, L)]
        zs = [problem.x, *hidden]
        chain = e.chain.is_chain

        def sweep(check: bool) -> list[torch.Tensor]:
            moves = []
            for k in range(1, L):
                z = hidden[k - 1]
                new = problem.block_step(k, hidden, pre, adj[k], t[k - 1], units[k - 1])
                if check:
                    moves.append((new - z).abs_().max() / t[k - 1])
                hidden[k - 1] = zs[k] = new
                if chain:
                    pre[k + 1] = links[k].edges[0].map(new)
                    continue
                for c in children[k]:   # the children's pre-activations, fresh for the next blocks
                    pre[c] = links[c - 1].pre(zs)
            return moves

        it, move, first = self._sweeps(sweep)
        return hidden, self._finish(problem, hidden, it, move, first)

    def _solve_layered_linear(self, problem: LayeredProblem, hidden, pre, t):
        """The compiled sweep on a generic chain whose maps above the first are lone ``nn.Linear`` layers."""
        e, L = problem.energy, problem.depth
        lins = [e.link(k).maps[0] for k in range(2, L + 1)]
        Ws = [None] + [lin.weight.detach() for lin in lins]       # Ws[k]: z_k → a_{k+1}
        bs = [None] + [None if lin.bias is None else lin.bias.detach() for lin in lins]
        Wts = [None] + [W.t() for W in Ws[1:]]
        bounds = tuple(_plain_bounds(e.link(k).units, hidden[k - 1]) for k in range(1, L))
        mask = None
        if 0 < problem.n_clamped < problem.batch:
            mask = problem.clamped.reshape(-1, 1)
        top = ("layered", problem.n_clamped == 0, problem.target if problem.n_clamped else None, mask,
               problem._free_res)
        dev, dt = problem.x.device, problem.x.dtype
        tt = torch.tensor(t, dtype=dt, device=dev)
        alpha = tt * torch.tensor([e.feedback(k) for k in range(1, L)], dtype=dt, device=dev)
        state = {"h": list(hidden), "a": list(pre[1:])}

        def sweep(check: bool):
            h, a, move = LIFTED_SWEEP(state["h"], state["a"], Ws, Wts, bs, tt, alpha, e.kind, bounds, top, True)
            state["h"], state["a"] = h, a
            return [move] if check else []

        it, move, first = self._sweeps(sweep)
        hidden = state["h"]
        return hidden, self._finish(problem, hidden, it, move, first)

    def _solve(self, problem, hidden, pre):
        if isinstance(problem, LayeredProblem):
            return self._solve_layered(problem, hidden, pre)
        e, L = problem.energy, problem.depth
        t = self.steps(problem)
        alpha = [t[k - 1] * e.feedback(k) for k in range(1, L)]
        bounds = tuple(_plain_bounds(u, problem.x) for u in e.units)
        Ws, bs = e.weights, e.biases
        Wts = [W.t() for W in Ws]
        top = ("dense", problem.n_clamped == 0, problem.target if problem.n_clamped else None,
               problem._clamp_col, problem._free_res)
        if LIFTED_SWEEP.active(problem.x.device):   # compiled: step sizes as tensors, the step test always on
            t = torch.tensor(t, dtype=problem.x.dtype, device=problem.x.device)
            alpha = t * torch.tensor([e.feedback(k) for k in range(1, L)], dtype=t.dtype, device=t.device)
            always = True
        else:
            always = False
        state = {"h": hidden, "a": list(pre[1:])}

        def sweep(check: bool):
            h, a, move = LIFTED_SWEEP(state["h"], state["a"], Ws, Wts, bs, t, alpha, "lifted", bounds, top,
                                   check or always)
            state["h"], state["a"] = h, a
            return [move] if check else []

        it, move, first = self._sweeps(sweep)
        hidden, a = state["h"], [None] + state["a"]
        problem.remember_pre(hidden, a)
        return hidden, self._finish(problem, hidden, it, move, first)


def _plain_bounds(units, like: torch.Tensor) -> tuple:
    """``(lower, upper)`` of a box as ``torch.clamp`` takes them for ``like`` (``None`` where unbounded)."""
    return tuple(units.clamp_bounds(like))


def _top_residual(a_top: torch.Tensor, top: tuple) -> torch.Tensor | None:
    """``r_L = z_L − a_L`` of a dense (``LiftedProblem.top_residual``) or layered (``output − a``) problem."""
    style, free, target, mask, free_res = top
    if style == "dense":
        if free:
            return free_res
        r = target - a_top
        if mask is not None:
            r = r * mask
        return r if free_res is None else r + free_res
    out = a_top if free_res is None else a_top + free_res
    if mask is not None:
        out = torch.where(mask, target, out)
    elif target is not None:
        out = target
    return out - a_top


def _lifted_sweep(hidden: list, a: list, Ws: list, Wts: list, bs: list, t, alpha, kind: str, bounds: tuple,
                  top: tuple, check: bool):
    """One block projected-gradient sweep over the hidden layers of a chain of ``nn.Linear`` maps::

        z_k ← Π_k( lerp(z_k, a_k, t_k) + α_k W_kᵀ r_{k+1} ),   a_{k+1} ← W_k z_k + b_k       (k = 1 … L−1)

    ``hidden = [z_1 … z_{L-1}]``, ``a = [a_1 … a_L]`` (0-based lists; new lists are returned), ``Ws[k]``
    (``Wts[k] = Ws[k]ᵀ``, transposed once per solve), ``bs[k]`` the map from ``z_k`` to ``a_{k+1}``; ``r_{k+1} = z_{k+1} − a_{k+1}`` (``kind="lifted"``) or
    ``z_{k+1} − Π(a_{k+1})`` (``"fenchel"``) below the output, the output residual from ``top``.
    ``t``, ``alpha``: Python floats (eager) or 1-D tensors (compiled: they change with the weights).
    Returns ``(hidden, a, largest step / t_k or None)``.
    """
    L = len(a)
    hidden, a = list(hidden), list(a)
    moves = []
    for k in range(1, L):
        z = hidden[k - 1]
        if k < L - 1:
            up = a[k] if kind == "lifted" else _clamp(a[k], bounds[k])
            r = hidden[k] - up
        else:
            r = _top_residual(a[L - 1], top)
        tk, ak = t[k - 1], alpha[k - 1]
        new = z.lerp(a[k - 1], tk)
        if r is not None:
            new = torch.addmm(new, r, Ws[k], alpha=ak) if not isinstance(ak, torch.Tensor) else \
                torch.addmm(new, r * ak, Ws[k])
        lo, hi = bounds[k - 1]
        if lo is not None or hi is not None:
            new = new.clamp_(min=lo, max=hi)   # Π_C in place (new is a fresh tensor)
        if check:
            moves.append((new - z).abs_().max() / tk)   # vector_norm(inf) is ~10x slower on CPU
        hidden[k - 1] = new
        b = bs[k]
        a[k] = torch.addmm(b, new, Wts[k]) if b is not None else new.mm(Wts[k])
    move = (torch.stack(moves).max() if len(moves) > 1 else moves[0]) if check else None
    return hidden, a, move


def _clamp(v: torch.Tensor, bounds: tuple) -> torch.Tensor:
    lo, hi = bounds
    return v if lo is None and hi is None else v.clamp(min=lo, max=hi)


LIFTED_SWEEP = CompiledStep(_lifted_sweep, "the lifted block sweep")


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
    in_place = False

    def __init__(self, sweeps: int = 5000, newton_steps: int = 30, tol: float = 1e-9, on_fail: str = "raise"):
        _check_options(sweeps, tol, on_fail)
        self.sweeps, self.newton_steps, self.tol, self.on_fail = sweeps, newton_steps, tol, on_fail

    def _solve(self, problem, hidden, pre):
        if isinstance(problem, LayeredProblem):
            return self._solve_layered(problem, hidden, pre)
        dtype = problem.x.dtype
        p64 = problem.to(torch.float64)
        h64 = [z.to(torch.float64) for z in hidden]
        pre64 = [None] + [a.to(torch.float64) for a in pre[1:]]
        pre64[1] = p64.a1
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-10, check_every=10, on_fail="ignore",
                                     residual="exact")
        h64, info = bpg._solve(p64, h64, pre64)
        h64, n_newton = self._polish(p64, h64)
        res = float(p64.residuals(h64).max())
        info = finish(self.name, p64, h64, info.iterations + n_newton, self.tol, self.on_fail, residual=res, owner=self)
        return [z.to(dtype) for z in h64], info

    def _solve_layered(self, problem: LayeredProblem, hidden, pre):
        """Generic chains: float64 block sweeps to a residual of ``1e-11`` (no dense Hessian to polish with)."""
        if problem.x.dtype != torch.float64:
            raise ValueError("The reference solver needs a float64 model and input for a non-dense chain "
                             "(model.double(), x.double())")
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-11, check_every=10, on_fail="ignore", residual="exact")
        hidden, info = bpg._solve_layered(problem, hidden, pre)
        res = float(problem.residuals(hidden).max())
        return hidden, finish(self.name, problem, hidden, info.iterations, self.tol, self.on_fail, residual=res,
                              owner=self)

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
            try:
                d = torch.linalg.solve(Hf, (-g * fm).unsqueeze(2)).squeeze(2)
            except torch.linalg.LinAlgError:   # numerically singular (e.g. enormous weights): keep sweeping
                d = torch.zeros_like(z)
            cand = torch.minimum(torch.maximum(z + d, lo), hi)
            better = p.value(split(cand)) <= p.value(hs) + 1e-15 * (1 + p.value(hs).abs())
            better = better & torch.isfinite(cand).all(dim=1) & (d != 0).any(dim=1)
            z = torch.where(better.unsqueeze(1), cand, z)
            if not bool(better.any()):
                # the Newton step failed everywhere (wrong active set): a few more sweeps, then retry
                bpg = BlockProjectedGradient(max_iter=50, tol=None, on_fail="ignore")
                hs = split(z)
                pre = [None, p.a1] + [e.pre(k, hs[k - 2]) for k in range(2, p.depth + 1)]
                z = torch.cat(bpg._solve(p, hs, pre)[0], dim=1)
        return split(z), steps


class GradientSteps(Solver):
    """Predictive coding's inference: simultaneous (projected) gradient steps on every hidden layer::

        z_k ← Π_k( z_k − η ∂E/∂z_k ),   k = 1 … L−1, all from the same point

    with ``∂E/∂z`` by autograd through each layer's forward (any differentiable map), ``steps``
    times, or until the largest step ``max |η ∂E/∂z|`` is at most ``tol`` (checked every 5 steps).

    **Convergence check** (every solve, by-products of two steps): the first step gives the signal
    ``r_0 = η max|∂E/∂z|`` at the forward pass (for a warm start, ``init``, one more gradient evaluation there);
    the last step gives, at its start, the residual ``r_T`` (the same measure, reported as
    ``SolveInfo.residual``) and per hidden layer the ratio ``q_k = ‖∂E/∂z_k‖ / ‖ε_k‖`` of its remaining
    gradient to its prediction error ``ε_k = z_k − f_k(a_k)`` (the error its weight gradient is made of; one
    forward pass). Without ``tol`` the solve is *converged* when ``r_T ≤ 1e-3 r_0``
    (:data:`CONVERGED_RTOL`), and *far* from equilibrium — warned once per solver, i.e. once per run — when

    * ``r_T > far_rtol · r_0`` (1): more residual left than the forward pass had, i.e. the steps did not
      relax the starting point (MAC's coordinates stored in an earlier epoch, at a smaller μ: measured
      4.8 … 37× the forward pass's after 30 steps in the digits demo, epochs 13-22, with a W-step gradient
      9 … 26× away from the Z-minimiser's); or
    * ``max_k q_k > far_layer`` (2): continuing would change some layer's error by more than twice its size,
      so its weight gradient reflects how far the output error propagated in ``T`` steps, not the equilibrium
      (the small-step limit, where layer ``d`` below the output receives ``(ηT)^d/d!`` of it).

    Predictive coding is not at equilibrium at its defaults by design (``T = 20`` steps of ``η = 0.1``; with
    ReLU units the steps never settle: the residual stalls at 0.1 of ``r_0`` even after 8000 steps, the
    kinks of ``f``), so "converged" is False there and the *far* thresholds sit above what the library's
    standard runs reach: ``max q_k`` ≤ 0.6 on the MNIST and digits MLPs, 0.8 on ``conv:8-16/64``, 1.4 on
    ``vgg5:width=0.25``, and ``r_T / r_0`` ≤ 0.5 (``benchmarks/investigations/convergence_checks.py``). PCX's
    setting (T = 15, η = 0.3) stays below 0.5; ``T = 5`` (``q`` up to 6.7), ``η ≤ 0.02`` (up to 15),
    ``vgg7`` (2.8) and ``resnet20`` (up to 24) warn.

    Args:
        steps: the number of steps ``T`` (PCX's benchmark setting: 15); 0 keeps the forward pass.
        step_size: the inference rate ``η``.
        tol: optional early-stopping tolerance (activation units); with ``tol`` set, stopping at
            ``steps`` before reaching it warns (``on_fail``).
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` (a missed ``tol``, or a solve far from equilibrium).
        far_rtol: the *far* threshold on ``r_T / r_0`` (``None``: off).
        far_layer: the *far* threshold on ``max_k q_k`` (``None``: off).
        label: the name the warnings give (e.g. ``"pc"``, ``"mac Z-step"``).
        advice: appended to the fix that a *far* warning suggests (a rule's own remedy).

    References:
        Whittington & Bogacz (2017); PCX (Pinchetti et al. 2024), T = 15.
    """

    name = "pc-steps"
    in_place = True    # Solver.solve hands over copies; the steps update them in place
    #: the reading and fix of a last step larger than the first (``{step_size}`` is filled in); ``None``: PC's (the
    #: steps did not relax the start); ePC sets it: there the steps overshoot
    growth_fix: str | None = None

    def __init__(self, steps: int = 15, step_size: float = 0.1, tol: float | None = None, on_fail: str = "warn",
                 far_rtol: float | None = 1.0, far_layer: float | None = 2.0, label: str | None = None,
                 advice: str = ""):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"Invalid steps: {steps}")
        if not (isinstance(step_size, (int, float)) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"Invalid step_size: {step_size}")
        _check_options(max(steps, 1), tol, on_fail)
        self.steps, self.step_size, self.tol, self.on_fail = steps, float(step_size), tol, on_fail
        self.far_rtol, self.far_layer, self.label, self.advice = far_rtol, far_layer, label or self.name, advice

    def solve(self, problem: LayeredProblem, init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], SolveInfo]:
        """As :meth:`Solver.solve`; from a warm start ``init`` the signal ``r_0`` is measured at the forward pass."""
        if not isinstance(problem, (LayeredProblem, ErrorProblem)):
            raise TypeError("GradientSteps solves LayeredProblem and ErrorProblem instances")
        if problem.depth == 1:
            return [], SolveInfo(self.name, 0, 0.0, True, None)
        signal = None
        if init is None:
            hidden = problem.forward_state()[0]
        else:
            problem.check_feasible(init)
            hidden = list(init)
            if self.steps:
                fwd = problem.forward_state()[0]
                with torch.no_grad():
                    grads = problem.gradients(fwd)
                    signal = self.step_size * float(torch.stack(max_abs(grads)).max())
        with torch.no_grad():
            return self._run(problem, [z.clone() for z in hidden], signal)

    def _solve(self, problem, hidden, pre):
        return self._run(problem, hidden, None)

    def _run(self, problem: LayeredProblem, hidden: list[torch.Tensor], signal: float | None):
        eta = self.step_size
        if self.steps == 0:
            return hidden, SolveInfo(self.name, 0, 0.0, True, self.tol)
        it, move, first, ratios = 0, math.inf, None, None
        for it in range(1, self.steps + 1):
            last = it == self.steps
            check = it == 1 or last or (self.tol is not None and it % 5 == 0)
            old = [z.clone() for z in hidden] if check else None
            errors = [] if last else None
            hidden = problem.gradient_step(hidden, eta, errors)
            if last and not errors:   # not handed back by the step: one forward pass at the old point
                errors = torch._foreach_norm(problem.layer_errors(old))
            if check:   # one fused reduction per quantity over all layers, one synchronisation
                steps = torch._foreach_sub(hidden, old)
                big = max_abs(steps)
                if not last:
                    move = float(torch.stack(big).max())
                else:
                    n = len(steps)
                    stats = torch.stack([*big, *torch._foreach_norm(steps), *errors,
                                         *max_abs(hidden)]).tolist()
                    move = max(stats[:n])
                    ratios, floor = last_step_stats(stats, eta, hidden[0].dtype)
                first = move if it == 1 else first
            if self.tol is not None and check and move <= self.tol:
                break
        if ratios is None:
            floor = residual_floor(hidden)
        return hidden, self.report(it, move, first if signal is None else signal, ratios, floor)

    def report(self, iterations: int, residual: float, initial: float | None, layers: list | None,
               floor: float) -> SolveInfo:
        """The verdict of a solve (also for the fused predictive-coding loop, which measures the same quantities).

        Args:
            iterations: steps done.
            residual: ``r_T`` (the last step's size).
            initial: ``r_0`` (the signal).
            layers: per hidden layer ``(max|step_k|, ‖∂E/∂z_k‖, ‖ε_k‖)`` at the last step's start, or ``None``
                (stopped early by ``tol``).
            floor: :func:`residual_floor` of the value nodes.
        """
        if not math.isfinite(residual):   # diverged: the rules raise with the fix (lower step_size)
            return SolveInfo(self.name, iterations, residual, False, self.tol, initial)
        info = fixed_steps_verdict(self.name, residual, iterations, initial, floor, self.tol)
        if self.tol is not None and not info.converged:
            msg = (f"{self.label}: stopped after {iterations} iterations with largest step {residual:.3g} > tol {self.tol:.3g}; "
                   "raise steps or tol")
            if self.on_fail == "raise":
                raise ConvergenceError(msg)
            if self.on_fail == "warn":
                warnings.warn(msg, ConvergenceWarning, stacklevel=4)
            return info
        if info.converged or not initial:
            return info
        fix = f"raise steps (now {self.steps}) or step_size (now {self.step_size:g}){self.advice}"
        rho = residual / initial
        if self.far_rtol is not None and rho > self.far_rtol:
            grew = self.growth_fix.format(step_size=self.step_size) if self.growth_fix else (
                f"the gradient follows the starting point, not the equilibrium; {fix}")
            warn_far(self, info, f"{self.label}: inference far from equilibrium after {iterations} steps: the largest step "
                     f"left, {residual:.3g}, is {rho:.2g}x the forward pass's {initial:.3g} (> {self.far_rtol:g}), so "
                     f"{grew}", self.on_fail)
            return info
        if self.far_layer is not None and layers:
            negligible = max(CONVERGED_RTOL * initial, floor)
            q = [0.0 if big <= negligible else (g / e if e > 0 else math.inf) for big, g, e in layers]
            k = max(range(len(q)), key=q.__getitem__)
            if q[k] > self.far_layer:
                warn_far(self, info, f"{self.label}: inference far from equilibrium after {iterations} steps: value node "
                         f"{k + 1}'s remaining gradient is {q[k]:.2g}x its prediction error (> {self.far_layer:g}), so its "
                         f"weight gradient reflects how far the output error propagated in {iterations} steps of "
                         f"{self.step_size:g}, not the equilibrium; {fix}", self.on_fail)
        return info


class OptimizerSteps(GradientSteps):
    """Inference by an optimiser on the value nodes: heavy-ball momentum or Adam on ``∂E/∂z`` (PCX's optax
    optimisers on the value nodes, Pinchetti et al. 2024), with the updates of ``torch.optim.SGD`` (momentum,
    no dampening) and ``torch.optim.Adam``, all layers from the same point, the state fresh on every solve::

        momentum   m_k ← μ m_k + g_k,                         z_k ← z_k − η m_k
        adam       m_k ← β₁ m_k + (1 − β₁) g_k,  v_k ← β₂ v_k + (1 − β₂) g_k²,
                   z_k ← z_k − η m̂_k / (√v̂_k + ε),  m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)

    with ``g_k = ∂E/∂z_k`` (:meth:`LayeredProblem.gradients`) and the projection ``Π_k`` after the update.

    **What the convergence check measures**: the step is no longer ``−η ∂E/∂z`` (momentum carries the past, Adam
    normalises each coordinate), so its size says little about equilibrium (Adam's steps stay near ``η`` while the
    signs of ``g`` agree). The checks measure the *gradient* instead, in the plain steps' units: ``r = η max|∂E/∂z|``
    at a checked step's start (the step :class:`GradientSteps` would take there), ``r_0`` at the forward pass and
    ``r_T`` at the last step's start, and per hidden layer ``(η max|g_k|, ‖g_k‖, ‖ε_k‖)``; the verdicts
    (converged, *far*, ``tol``) are :meth:`GradientSteps.report`'s. ``tol`` stops when ``r ≤ tol`` (every fifth step).

    Args:
        optimizer: ``"momentum"`` or ``"adam"``.
        momentum: ``μ`` (momentum) or ``β₁`` (Adam), in ``[0, 1)``.
        beta2: Adam's ``β₂`` (0.999, torch's and optax's default).
        eps: Adam's ``ε`` (1e-8).

    The other arguments are :class:`GradientSteps`'s (``step_size`` is the optimiser's learning rate ``η``).
    """

    OPTIMIZERS = ("momentum", "adam")

    def __init__(self, steps: int = 15, step_size: float = 0.1, tol: float | None = None, optimizer: str = "momentum",
                 momentum: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, **kwargs):
        super().__init__(steps, step_size, tol, **kwargs)
        if optimizer not in self.OPTIMIZERS:
            raise ValueError(f"Invalid optimizer: {optimizer!r}; choose one of {list(self.OPTIMIZERS)}")
        for key, v in (("momentum", momentum), ("beta2", beta2)):
            if not (isinstance(v, (int, float)) and 0 <= v < 1):
                raise ValueError(f"Invalid {key}: {v}")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"Invalid eps: {eps}")
        self.optimizer, self.momentum, self.beta2, self.eps = optimizer, float(momentum), float(beta2), float(eps)

    def _run(self, problem: LayeredProblem, hidden: list[torch.Tensor], signal: float | None):
        eta, e = self.step_size, problem.energy
        if self.steps == 0:
            return hidden, SolveInfo(self.name, 0, 0.0, True, self.tol)
        m = [torch.zeros_like(z) for z in hidden]
        v = [torch.zeros_like(z) for z in hidden] if self.optimizer == "adam" else None
        it, residual, first, layers = 0, math.inf, None, None
        for it in range(1, self.steps + 1):
            grads = problem.gradients(hidden)
            last = it == self.steps
            if it == 1 or last or (self.tol is not None and it % 5 == 0):
                big = [float(g.abs().max()) for g in grads]
                residual = eta * max(big)
                first = residual if it == 1 else first
                if last:
                    layers = [(eta * b, float(g.norm()), float(err.norm()))
                              for b, g, err in zip(big, grads, problem.layer_errors(hidden))]
                if self.tol is not None and residual <= self.tol:
                    break
            new = []
            for k, (z, g, mk) in enumerate(zip(hidden, grads, m), start=1):
                if v is None:
                    step = mk.mul_(self.momentum).add_(g)
                else:
                    mk.lerp_(g, 1.0 - self.momentum)
                    v[k - 1].mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
                    denom = (v[k - 1] / (1.0 - self.beta2 ** it)).sqrt_().add_(self.eps)
                    step = mk / (1.0 - self.momentum ** it) / denom
                new.append(e.project(k, z - eta * step))
            hidden = new
        return hidden, self.report(it, residual, first if signal is None else signal, layers, residual_floor(hidden))


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
