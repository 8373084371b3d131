"""The reference solver: float64 block sweeps to a tight tolerance, then active-set Newton polishing."""
from __future__ import annotations

import torch

from .block_pg import BlockProjectedGradient
from .info import Solver, check_options, finish


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
        check_options(sweeps, tol, on_fail)
        self.sweeps, self.newton_steps, self.tol, self.on_fail = sweeps, newton_steps, tol, on_fail

    def solve_from(self, problem, hidden, pre):
        if not problem.dense_hessian:
            return self._solve_generic(problem, hidden, pre)
        dtype = problem.x.dtype
        p64 = problem.to(torch.float64)
        h64 = [z.to(torch.float64) for z in hidden]
        pre64 = [None] + [a.to(torch.float64) for a in pre[1:]]
        pre64[1] = p64.a1
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-10, check_every=10, on_fail="ignore",
                                     residual="exact")
        h64, info = bpg.solve_from(p64, h64, pre64)
        h64, n_newton = self._polish(p64, h64)
        res = float(p64.residuals(h64).max())
        info = finish(self.name, p64, h64, info.iterations + n_newton, self.tol, self.on_fail, residual=res, owner=self)
        return [z.to(dtype) for z in h64], info

    def _solve_generic(self, problem, hidden, pre):
        """Generic chains: float64 block sweeps to a residual of ``1e-11`` (no dense Hessian to polish with)."""
        if problem.x.dtype != torch.float64:
            raise ValueError("The reference solver needs a float64 model and input for a non-dense chain "
                             "(model.double(), x.double())")
        bpg = BlockProjectedGradient(max_iter=self.sweeps, tol=1e-11, check_every=10, on_fail="ignore", residual="exact")
        hidden, info = bpg.solve_from(problem, hidden, pre)
        res = float(problem.residuals(hidden).max())
        return hidden, finish(self.name, problem, hidden, info.iterations, self.tol, self.on_fail, residual=res,
                              owner=self)

    def _polish(self, p, hidden: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
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
                z = torch.cat(bpg.solve_from(p, hs, pre)[0], dim=1)
        return split(z), steps
