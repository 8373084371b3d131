"""The paper's coordinate descent over the hidden units of a lifted network (Zach & Estellers 2019, Sec. 5)."""
from __future__ import annotations

import torch

from .info import CONVERGED_RTOL, Solver, check_options, finish, judge_far


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
        check_options(sweeps, tol, on_fail)
        self.sweeps, self.tol, self.on_fail, self.far_rtol = sweeps, tol, on_fail, far_rtol

    def solve_from(self, problem, hidden, pre):
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
