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
from .layered import LayeredProblem, gram_norm_bound, operator_norm_sq
from ..errors import ConvergenceError, ConvergenceWarning

ON_FAIL = ("warn", "raise", "ignore")


@dataclass
class SolveInfo:
    """What a solve did: one record for the lifted-network solvers here and the argmin layer's solves.

    Attributes:
        solver: solver name (``"cd"``, ``"block-pg"``, ``"reference"``; for the argmin layer of
            :mod:`inferlearn.bilevel`, ``"fista"``, ``"projected-gradient"``, ``"closed-form"``, ``"cg"``).
        iterations: sweeps (or iterations) performed (0 for a closed form).
        residual: optimality residual at the returned point, 0 at the exact minimiser: for lifted
            networks the max over rows of :meth:`LiftedProblem.residuals` (in activation units); for
            the argmin layer ``max|z − Π_C(z − ∇E(z))|`` (``‖b − Hv‖`` for its CG solve).
        converged: whether the tolerance was met (always True for a fixed number of sweeps
            without tolerance, and for a closed form).
        tol: the tolerance used (``None`` for a fixed number of sweeps or a closed form).
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


def finish(name: str, problem, hidden: list[torch.Tensor], iterations: int, tol: float | None,
           on_fail: str, residual: float | None = None) -> SolveInfo:
    """The :class:`SolveInfo` of a finished solve; warns or raises (``on_fail``) when ``tol`` was missed.

    ``residual`` is the solver's own measure; ``None`` evaluates ``problem.residuals(hidden)``. A
    non-finite residual always raises :class:`ConvergenceError`.
    """
    if residual is None:
        residual = float(problem.residuals(hidden).max()) if hidden else 0.0
    if not math.isfinite(residual):   # NaN/inf anywhere in the iterate propagates into the residual
        raise ConvergenceError(f"{name}: non-finite activations after {iterations} iterations "
                               "(weights too large or inputs non-finite?)")
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
            sweeps, as in the paper, with the residual reported but not enforced.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"``.

    References:
        Zach & Estellers (2019), Sec. 5: "each activation z_kj is updated 15 times".
    """

    name = "cd"

    def __init__(self, sweeps: int = 15, tol: float | None = None, on_fail: str = "warn"):
        _check_options(sweeps, tol, on_fail)
        self.sweeps, self.tol, self.on_fail = sweeps, tol, on_fail

    def _solve(self, problem, hidden, pre):
        e, L = problem.energy, problem.depth
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
        return hidden, finish(self.name, problem, hidden, it, self.tol, self.on_fail)


def gram_lambda_max(W: torch.Tensor) -> float:
    """``λ_max(WᵀW) = ‖W‖₂²``, bounded from above within a few per cent (:func:`gram_norm_bound`).

    A pure function of ``W`` (no state carried between calls, so a resumed run takes the same steps).
    Raises :class:`ConvergenceError` for non-finite weights.
    """
    lam = gram_norm_bound(W)
    if not math.isfinite(lam):
        raise ConvergenceError("Cannot solve the inference problem: non-finite weights")
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
            activation units) is at most ``tol``; ``None`` runs exactly ``max_iter`` sweeps.
        check_every: test the stopping criterion every this many sweeps.
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` when ``max_iter`` is reached first.
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
                 residual: str = "step", relaxation: float = 1.2, safe_steps: bool = False):
        _check_options(max_iter, tol, on_fail)
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
                raise ConvergenceError(f"{self.name}: non-finite weights (‖W_{k}‖₂² = {lam}); cannot solve")
            if self.safe_steps:
                out.append(self.relaxation / (1.0 + rho * lam))
            else:
                lam = 1.1 * lam   # margin for power iteration, which approaches λ_max from below
                out.append(min(self.relaxation * 2.0 / (2.0 + rho * lam), 1.9 / (1.0 + rho * lam)))
        return out

    def _sweeps(self, sweep) -> tuple[int, float]:
        """Run ``sweep(check)`` up to ``max_iter`` times; stop when a checked sweep's largest step is ≤ tol.

        Returns ``(sweeps done, last checked step)``; one synchronisation per checked sweep.
        """
        it, move = 0, math.inf
        for it in range(1, self.max_iter + 1):
            check = self.tol is not None and (it % self.check_every == 0 or it == self.max_iter)
            moves = sweep(check)
            if check:
                move = float(moves[0] if len(moves) == 1 else torch.stack(moves).max())
                if move <= self.tol:
                    break
        return it, move

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

        it, move = self._sweeps(sweep)
        res = move if (self.residual == "step" and self.tol is not None) else None
        return hidden, finish(self.name, problem, hidden, it, self.tol, self.on_fail, residual=res)

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

        it, move = self._sweeps(sweep)
        hidden = state["h"]
        res = move if (self.residual == "step" and self.tol is not None) else None
        return hidden, finish(self.name, problem, hidden, it, self.tol, self.on_fail, residual=res)

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

        it, move = self._sweeps(sweep)
        hidden, a = state["h"], [None] + state["a"]
        problem.remember_pre(hidden, a)
        res = move if (self.residual == "step" and self.tol is not None) else None
        return hidden, finish(self.name, problem, hidden, it, self.tol, self.on_fail, residual=res)


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
        info = finish(self.name, p64, h64, info.iterations + n_newton, self.tol, self.on_fail, residual=res)
        return [z.to(dtype) for z in h64], info

    def _solve_layered(self, problem: LayeredProblem, hidden, pre):
        """Generic chains: float64 block sweeps to a residual of ``1e-11`` (no dense Hessian to polish with)."""
        if problem.x.dtype != torch.float64:
            raise ValueError("The reference solver needs a float64 model and input for a non-dense chain "
                             "(model.double(), x.double())")
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-11, check_every=10, on_fail="ignore", residual="exact")
        hidden, info = bpg._solve_layered(problem, hidden, pre)
        res = float(problem.residuals(hidden).max())
        return hidden, finish(self.name, problem, hidden, info.iterations, self.tol, self.on_fail, residual=res)

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

    Args:
        steps: the number of steps ``T`` (PCX's benchmark setting: 15); 0 keeps the forward pass.
        step_size: the inference rate ``η``.
        tol: optional early-stopping tolerance (activation units); with ``tol`` set, stopping at
            ``steps`` before reaching it warns (``on_fail``).
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"``.

    References:
        Whittington & Bogacz (2017); PCX (Pinchetti et al. 2024), T = 15.
    """

    name = "pc-steps"
    in_place = True    # Solver.solve hands over copies; the steps update them in place

    def __init__(self, steps: int = 15, step_size: float = 0.1, tol: float | None = None, on_fail: str = "warn"):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"Invalid steps: {steps}")
        if not (isinstance(step_size, (int, float)) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"Invalid step_size: {step_size}")
        _check_options(max(steps, 1), tol, on_fail)
        self.steps, self.step_size, self.tol, self.on_fail = steps, float(step_size), tol, on_fail

    def _solve(self, problem, hidden, pre):
        if not isinstance(problem, LayeredProblem):
            raise TypeError("GradientSteps solves LayeredProblem instances")
        eta = self.step_size
        if self.steps == 0:
            return hidden, SolveInfo(self.name, 0, 0.0, True, self.tol)
        it, move = 0, math.inf
        for it in range(1, self.steps + 1):
            check = self.tol is not None and (it % 5 == 0 or it == self.steps)
            old = [z.clone() for z in hidden] if check else None
            hidden = problem.gradient_step(hidden, eta)
            if check:
                move = max(float((n - z).abs().max()) for n, z in zip(hidden, old))
            if move <= self.tol if self.tol is not None else False:
                break
        if self.tol is None:
            return hidden, SolveInfo(self.name, it, move if math.isfinite(move) else 0.0, True, None)
        return hidden, finish(self.name, problem, hidden, it, self.tol, self.on_fail, residual=move)


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
