"""Differential phases: solve a clamped or nudged phase for its *difference* from the free equilibrium.

A two-phase rule (contrastive J_1, equilibrium propagation) divides a difference of two equilibria by a
small number (``γ^{L-1}``, ``β γ^{L-1}``). Solved directly, each phase carries the round-off of its own
O(1) activations, and once the difference falls below about a hundred machine epsilons the gradient of
the first layers is round-off (in float32 that happens at γ^{L-1} ≈ 1e-5: Table 3 with ReLU units at
γ = 1/16 collapsed in float32 and trained in float64). Here the second phase is solved for
``δ = z⁺ − z⁰`` itself, starting from ``δ = 0`` at the free minimiser ``z⁰``, and the weight gradient is
formed from ``δ``, so the signal is resolved relative to its own size.

The lifted energy is quadratic in the hidden layers (plus the box constraints), so with
``Δa_k = W_{k-1} δ_{k-1}`` (``δ_0 = 0``), ``Δr_k = δ_k − Δa_k`` and the free residuals
``r⁰_k = z⁰_k − a⁰_k`` the phase's block gradient at ``z⁰ + δ`` is exactly::

    ∂E⁺/∂z_k / w_k = s_k + Δr_k − ρ_k W_kᵀ Δr_{k+1}                    (k < L − 1)
    ∂E⁺/∂z_k / w_k = s_k + Δr_k − ρ_k W_kᵀ r⁺_L(δ)                      (k = L − 1, the phase's output residual)

where ``s_k = ∂E⁰/∂z_k / w_k`` is the free phase's own gradient at ``z⁰``. At an exact free minimiser it is
zero on every unit strictly inside its box and points outward on units at a bound; it is taken so (zero
inside the box, as computed at the bounds) — the free solve's tolerance then leaves no trace in ``δ``.
The block projected-gradient sweeps of :class:`~inferlearn.engine.solvers.BlockProjectedGradient` (same
step sizes) run on ``δ`` with the box ``[lo − z⁰, hi − z⁰]`` and stop on a tolerance *relative to* each
layer's own ``|δ_k|`` (the phase's signal, ``γ^{L-1-k}`` times the top layer's), not an absolute one.

The envelope gradients follow from ``δ`` without forming either phase's gradient::

    ∇_{W_k}[E⁺(z⁰ + δ) − E⁰(z⁰)] = −w_{k+1} [Δr_{k+1} (z⁰_k + δ_k)ᵀ + r⁰_{k+1} δ_kᵀ]       (hidden terms)
    ∇_{W_{L-1}}[…]                = −w_L r⁺_L (z⁰_{L-1} + δ_{L-1})ᵀ                       (the output term)

(biases: the same without the right factor), with ``r⁺_L = y − a⁰_L − W_{L-1} δ_{L-1}`` for a clamped
output and ``−b g / w_L`` for an output nudged by ``b gᵀ z_L`` (the free phase's output term is zero).

References:
    Zach & Estellers (2019), Eq. 9 (J_1); Scellier & Bengio (2017) (nudged phase); docs/maths.md §A.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .problems import LiftedEnergy

#: default relative tolerance of a differential solve: the largest step of a sweep against the largest |δ|
RELATIVE_TOL = 1e-4


def _top_residual(energy: LiftedEnergy, pre0: Sequence[torch.Tensor], target: torch.Tensor | None,
                  nudge: torch.Tensor | None, b: float) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """``δ_{L-1} ↦ r⁺_L``: the clamped (``target``) or nudged (``nudge``, strength ``b``) output residual."""
    L = energy.depth
    if target is not None:
        base = target - pre0[L]
        W = energy.weights[L - 1]
        return lambda d: base if d is None else base - d.mm(W.t())
    r = (-b / energy.term_weights[L]) * nudge
    return lambda d: r


@torch.no_grad()
def solve_difference(energy: LiftedEnergy, x: torch.Tensor, hidden0: Sequence[torch.Tensor],
                     pre0: Sequence[torch.Tensor | None], steps: Sequence[float], *,
                     target: torch.Tensor | None = None, nudge: torch.Tensor | None = None, b: float = 0.0,
                     tol: float | None = None, max_iter: int = 200, check_every: int = 2) -> tuple[list[torch.Tensor], int, float]:
    """``δ = z⁺ − z⁰`` of the clamped (``target``) or nudged (``nudge``, strength ``b``) phase (module docstring).

    Args:
        hidden0, pre0: the free minimiser ``[z⁰_1 … z⁰_{L-1}]`` and its pre-activations ``[None, a⁰_1 … a⁰_L]``.
        steps: block step sizes ``t_k`` of the phase's problem (:meth:`BlockProjectedGradient.steps`).
        tol: stop when, in a checked sweep, every layer's step ``max |Δδ_k| / t_k`` is at most ``tol · max |δ_k|``
            (``None``: :data:`RELATIVE_TOL`).

    Returns:
        ``(δ, sweeps, relative step)`` with ``δ = [δ_1 … δ_{L-1}]``.
    """
    L = energy.depth
    if L == 1:
        return [], 0, 0.0
    tol = RELATIVE_TOL if tol is None else tol
    Ws = energy.weights
    top = _top_residual(energy, pre0, target, nudge, b)
    # s_k: the free phase's scaled gradient, zero strictly inside the box (stationarity), kept at the bounds
    r0 = [None] + [hidden0[k - 1] - pre0[k] for k in range(1, L)]
    lo, hi, s = [None], [None], [None]
    for k in range(1, L):
        u, z = energy.units[k - 1], hidden0[k - 1]
        g = r0[k] if k == L - 1 else torch.addmm(r0[k], r0[k + 1], Ws[k], alpha=-energy.feedback(k))
        inside = torch.ones_like(z, dtype=torch.bool)
        lo_k = hi_k = None
        if math.isfinite(u.lower):
            inside &= z > u.lower
            lo_k = u.lower - z
        if math.isfinite(u.upper):
            inside &= z < u.upper
            hi_k = u.upper - z
        s.append(g.masked_fill(inside, 0.0))
        lo.append(lo_k)
        hi.append(hi_k)
    delta = [torch.zeros_like(z) for z in hidden0]
    it, rel = 0, math.inf
    for it in range(1, max_iter + 1):
        check = it % check_every == 0 or it == max_iter
        move = 0.0
        for k in range(1, L):
            d = delta[k - 1]
            dr = d if k == 1 else d - delta[k - 2].mm(Ws[k - 1].t())
            up = top(d) if k == L - 1 else delta[k] - d.mm(Ws[k].t())
            grad = torch.addmm(s[k] + dr, up, Ws[k], alpha=-energy.feedback(k))
            new = d - steps[k - 1] * grad
            if lo[k] is not None or hi[k] is not None:
                new = torch.clamp(new, min=lo[k], max=hi[k])
            if check:   # relative to the layer's own |δ_k|: the first layers' δ is γ^{L-k} times the top's
                size = float(new.abs().max())
                step = float((new - d).abs().max()) / steps[k - 1]
                move = max(move, step / size if size > 0 else (0.0 if step == 0 else math.inf))
            delta[k - 1] = new
        if check:
            rel = move
            if rel <= tol:
                break
    return delta, it, rel


def difference_grads(energy: LiftedEnergy, x: torch.Tensor, hidden0: Sequence[torch.Tensor],
                     pre0: Sequence[torch.Tensor | None], delta: Sequence[torch.Tensor], *,
                     target: torch.Tensor | None = None, nudge: torch.Tensor | None = None,
                     b: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``Σ_rows ∇_{W_k, b_k} [E⁺(z⁰ + δ) − E⁰(z⁰)]`` for ``k = 0 … L−1`` (module docstring), from ``δ``."""
    L = energy.depth
    Ws, w = energy.weights, energy.term_weights
    top = _top_residual(energy, pre0, target, nudge, b)
    zs0 = [x, *hidden0]
    d = [None, *delta]
    out = []
    for k in range(L):
        if k + 1 < L:
            dr = d[k + 1] if k == 0 else d[k + 1] - d[k].mm(Ws[k].t())
            gW = dr.t().mm(zs0[k]) if k == 0 else dr.t().mm(zs0[k] + d[k]) + (zs0[k + 1] - pre0[k + 1]).t().mm(d[k])
            gb = dr.sum(0)
        else:
            r = top(d[L - 1] if L > 1 else None)
            z = zs0[L - 1] if L == 1 else zs0[L - 1] + d[L - 1]
            gW, gb = r.t().mm(z), r.sum(0)
        out.append((gW.mul_(-w[k + 1]), gb.mul_(-w[k + 1])))
    return out
