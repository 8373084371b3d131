"""The compiled block sweep of a lifted (or lifted-Fenchel) chain of ``nn.Linear`` maps: one kernel for the dense
lifted problems and the layered chains whose maps are lone ``nn.Linear`` layers (:class:`~inferlearn.engine.solvers.
block_pg.BlockProjectedGradient` runs it through the problems' :meth:`block_sweeps`)."""
from __future__ import annotations

import torch

from ..compiled import CompiledStep


def plain_bounds(units, like: torch.Tensor) -> tuple:
    """``(lower, upper)`` of a box as ``torch.clamp`` takes them for ``like`` (``None`` where unbounded)."""
    return tuple(units.clamp_bounds(like))


def top_residual(a_top: torch.Tensor, top: tuple) -> torch.Tensor | None:
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
            r = top_residual(a[L - 1], top)
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
