"""Online block-ADMM (Algorithm 2, docs/maths.md §C, reconstructed): per mini-batch ``(x, y)``, a forward pass, ``z_steps``
safeguarded gradient steps on the decoupling variables of the batch, ``primal_steps`` Θ steps on

    J + Σ_t (λ_t h_t + (ρ_t/2) h_t²),   h_t = mean_i ‖z_{t,i} − f_t(z_{t-1,i})‖²,

then ``λ_t ← λ_t + ρ_t h_t`` (or, adaptive, a larger ρ). One scalar dual per block: no per-sample memory. The
functions take the :class:`~inferlearn.admm.trainer.BlockADMM` whose blocks, duals and optimiser they update.
"""
from __future__ import annotations

import math

import torch

from ..errors import DivergenceError
from .config import loss_sum, sqnorm_rows


def online_objective(tr, zs: list[torch.Tensor], y: torch.Tensor, per_sample: bool):
    """``J + Σ_t (λ_t h_t + (ρ_t/2) h_t²)`` (batch mean), and the ``h_t``."""
    B = zs[0].shape[0]
    hs = []
    total = loss_sum(tr.cfg.loss, tr.blocks[-1](zs[-1]), y) / B
    for t in range(1, tr.T):
        h = sqnorm_rows(zs[t] - tr.blocks[t - 1](zs[t - 1])).mean()
        hs.append(h)
        total = total + tr.lam[t - 1] * h + 0.5 * tr.beta[t - 1] * h * h
    return (total * B if per_sample else total), hs

def online_z(tr, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """``[x, z_1, …, z_{T-1}]``: a forward pass, then ``z_steps`` safeguarded gradient steps."""
    with torch.no_grad():
        zs = [x]
        for t in range(1, tr.T):
            zs.append(tr.blocks[t - 1](zs[-1]))
    for _ in range(tr.cfg.z_steps if tr.T > 1 else 0):
        vars_ = [z.detach().requires_grad_(True) for z in zs[1:]]
        obj, hs = online_objective(tr, [x, *vars_], y, per_sample=True)
        grads = torch.autograd.grad(obj, vars_)
        # Safeguarded step ζ/(1 + ζ c_t), c_t = 2(λ_t + ρ_t h_t) + 2(λ_{t+1} + ρ_{t+1} h_{t+1}) the
        # per-sample curvature of the two penalties containing z_t (taking f_{t+1} as 1-Lipschitz):
        # the duals only grow, and a plain step ζ diverges once ζ c_t > 2.
        curv = [2 * (lam + rho * float(h.detach())) for lam, rho, h in zip(tr.lam, tr.beta, hs)] + [0.0]
        steps = [zeta / (1 + zeta * (curv[i] + curv[i + 1])) for i, zeta in enumerate(tr.zeta)]
        zs = [x] + [v.detach() - step * g for v, g, step in zip(vars_, grads, steps)]
    return zs

def online_gradient(tr, x: torch.Tensor, y: torch.Tensor, zs: list[torch.Tensor] | None = None):
    """Online mode: fill the blocks' ``.grad`` with the Θ gradient of ``J + Σ_t (λ_t h_t + (ρ_t/2) h_t²)``
    on the mini-batch ``(x, y)`` after the ``z`` steps (``zs`` from them, if already taken); no
    optimiser step. Returns the objective (a tensor) and the ``h_t``."""
    if zs is None:
        zs = online_z(tr, x, y)
    tr.optimizer.zero_grad(set_to_none=True)
    obj, hs = online_objective(tr, zs, y, per_sample=False)
    if not torch.isfinite(obj):
        raise DivergenceError(f"non-finite online objective {float(obj.detach())}")
    obj.backward()
    return obj, hs

def online_batch(tr, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[float]]:
    """One mini-batch of Algorithm 2: the ``z`` steps, ``primal_steps`` Θ steps, then the duals or the penalty
    (adaptive). Returns the objective and the ``h_t``."""
    zs = online_z(tr, x, y)
    hs = []
    obj = torch.zeros(())
    for _ in range(tr.cfg.primal_steps):
        obj, hs = online_gradient(tr, x, y, zs)
        tr.optimizer.step()
    h_vals = [float(h.detach()) for h in hs]
    k = tr.iteration
    if tr.cfg.adaptive and math.sqrt(sum(h_vals)) > tr.cfg.eta0 * tr.cfg.eta_decay ** k:
        tr.beta = [min(b * tr.cfg.penalty_growth, tr.cfg.beta_max) for b in tr.beta]
    else:
        tr.lam = [lam + rho * h for lam, rho, h in zip(tr.lam, tr.beta, h_vals)]
    return float(obj.detach()), h_vals

def online_epoch(tr, X, Y, transform) -> dict:
    """One pass of mini-batches of Algorithm 2 over ``(X, Y)`` (``transform(x, generator)`` per batch); its metrics."""
    N = X.shape[0]
    perm = torch.randperm(N, generator=tr.generator)
    bs = tr.cfg.batch_size
    total, hsum, count = 0.0, [0.0] * (tr.T - 1), 0
    for a in range(0, N, bs):
        idx = perm[a:a + bs]
        x = X[idx].to(tr.device, tr.dtype)
        if transform is not None:
            x = transform(x, tr.generator)
        obj, h_last = online_batch(tr, x, Y[idx].to(tr.device))
        total += obj * len(idx)
        hsum = [s + h * len(idx) for s, h in zip(hsum, h_last)]
        count += len(idx)
    return {"admm_objective": total / count, **{f"h_{t + 1}": s / count for t, s in enumerate(hsum)},
            **{f"lambda_{t + 1}": lam for t, lam in enumerate(tr.lam)},
            **{f"rho_{t + 1}": b for t, b in enumerate(tr.beta)}}
