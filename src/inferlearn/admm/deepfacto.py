"""DeepFacto's updates inside block-ADMM (Khorram et al., Sec. 4): an :class:`~inferlearn.admm.nmf.NMF` block ``t``
between two ordinary blocks, whose decoupling variable ``Z_t`` is the score matrix ``S``, its constraint
``Z_{t-1} = S Mᵀ`` with penalty ``γ = β_t`` and scaled multipliers ``U_t``. The functions take the
:class:`~inferlearn.admm.trainer.BlockADMM` whose state they update.
"""
from __future__ import annotations

import torch

from .nmf import nnls_gram


@torch.no_grad()
def nmf_basis_update(tr) -> None:
    """The bases ``M`` of every NMF block by NNLS on all samples: ``min_{M≥0} ‖Z_{t-1} + U_t − S Mᵀ‖²`` in Gram form."""
    for t in range(1, tr.T):
        if not tr.is_nmf[t - 1]:
            continue
        blk = tr.blocks[t - 1]
        n = blk.n_features
        G = torch.zeros(blk.rank, blk.rank, dtype=tr.dtype, device=tr.device)
        C = torch.zeros(n, blk.rank, dtype=tr.dtype, device=tr.device)
        for a, b in tr.state.chunks(tr.X.shape[0]):
            S = tr.state.get(t, slice(a, b))
            target = (tr.state.get(t - 1, slice(a, b)) + tr.state.u(t, slice(a, b))).reshape(b - a, -1)
            G += S.T @ S
            C += target.T @ S
        M, _ = nnls_gram(G, C, blk.M, max_sweeps=tr.cfg.nmf_sweeps, tol=blk.tol)
        blk.M.copy_(M)


def score_update(tr, t: int, sl) -> torch.Tensor:
    """NMF scores: prox-linear NNLS step ``S ← argmin_{S≥0} (γ/2)‖P + V − S Mᵀ‖² + ⟨g, S⟩ + ‖S − S⁰‖²/(2ζ)``.

    ``g`` is the gradient of the next block's term at ``S⁰`` (the term that makes the scores
    useful for the task); the problem is a strongly convex NNLS in Gram form.
    """
    blk = tr.blocks[t - 1]
    gamma, zeta = tr.beta[t - 1], tr.zeta[t - 1]
    with torch.no_grad():
        target = (tr.state.get(t - 1, sl) + tr.state.u(t, sl)).reshape(sl.stop - sl.start, -1)
        MtM = blk.M.T @ blk.M
        G = gamma * MtM + torch.eye(blk.rank, dtype=MtM.dtype, device=MtM.device) / zeta
        base = gamma * target @ blk.M
    S = tr.state.get(t, sl)
    for _ in range(tr.cfg.z_steps):
        s = S.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(tr.next_term_sum(t, s, sl), s)
        with torch.no_grad():
            S, _ = nnls_gram(G, base + S / zeta - g, S, max_sweeps=tr.cfg.nmf_sweeps)
    return S
