"""Layer-wise projected-gradient sweeps (block Gauss-Seidel): the fast default solver of the lifted energies."""
from __future__ import annotations

import math

import torch

from ...errors import NonFiniteError
from .info import CONVERGED_RTOL, SolveInfo, Solver, check_options, finish, judge_far


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
        check_options(max_iter, tol, on_fail)
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

    def steps(self, problem, hidden: list[torch.Tensor] | None = None) -> list[float]:
        """Step sizes ``t_k`` (in units of ``∂E/∂z_k / w_k``) for hidden layers ``k = 1 … L−1``.

        ``safe_steps``: ``ω / (1 + ρ_k λ_k)`` (the Lipschitz step times ``ω``), else the over-relaxed
        contraction-optimal step above. ``λ_k`` is the problem's :meth:`block_curvature` (``‖A_{k+1}‖₂²`` on a chain;
        for a generic map by power iteration, for which ``hidden`` gives the shapes).
        """
        e = problem.energy
        out = []
        for k in range(1, problem.depth):
            rho = e.feedback(k)
            if problem.feeds_only_output(k) and problem.n_clamped == 0 and not self.safe_steps:
                out.append(1.0)   # a free output is eliminated: the top block's Hessian is w_k I
                continue
            lam = problem.block_curvature(k, hidden)
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

    def solve_from(self, problem, hidden, pre):
        """The sweeps of the problem's :meth:`block_sweeps` with this solver's steps, stopping rule and verdict."""
        sweep, result = problem.block_sweeps(hidden, pre, self.steps(problem, hidden))
        it, move, first = self._sweeps(sweep)
        hidden = result()
        return hidden, self._finish(problem, hidden, it, move, first)
