"""How close is the contrastive gradient to back-propagation's? A sweep over the feedback weight γ.

For every γ the contrastive gradient (divided by ``γ^{L-1}``) is compared with BackProp's on the same
batch and weights, per parameter: cosine similarity and norm ratio
(:func:`inferlearn.diagnostics.gradient_alignment`). docs/maths.md §A: for linear units the two differ only
by ``ẑ_k`` in place of the forward activation, and for ReLU units the difference is ``O(γ)``, with
earlier layers closer than later ones.

The sweep runs in float64 with the reference solver by default: at small γ the free and clamped
minimisers differ by ``O(γ^{L-1})``, below float32 resolution.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 22-28.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from ..diagnostics import gradient_alignment
from ..rules.contrastive import Contrastive

DEFAULT_GAMMAS = (1.0, 1 / 2, 1 / 8, 1 / 32, 1 / 128)


def gamma_sweep(model, x: torch.Tensor, labels: torch.Tensor, gammas: Sequence[float] = DEFAULT_GAMMAS,
                solver: str = "reference", dtype: torch.dtype | None = torch.float64) -> list[dict]:
    """Per-parameter alignment of the contrastive gradient with BackProp's for each γ.

    Args:
        model: an :class:`~inferlearn.models.MLP` (copied; not modified).
        gammas: feedback weights to try (each > 0).
        solver: inference solver of the contrastive rule.
        dtype: compute in this dtype (``None`` keeps the model's).

    Returns:
        rows ``{"gamma", "param", "cosine", "norm_ratio", "rel_error"}`` with
        ``rel_error = ‖g − g_BP‖ / ‖g_BP‖``.
    """
    m = copy.deepcopy(model)
    if dtype is not None:
        m = m.to(dtype)
        x = x.to(dtype)
    rows = []
    for gamma in gammas:
        for r in gradient_alignment(Contrastive(gamma=gamma, solver=solver), m, x, labels):
            c, q = r["cosine"], r["norm_ratio"]
            # ‖g − g_BP‖² / ‖g_BP‖² = q² − 2 q cos + 1
            rows.append({"gamma": gamma, **r, "rel_error": max(q * q - 2 * q * c + 1, 0.0) ** 0.5})
    return rows


def sweep_markdown(rows: list[dict]) -> str:
    """A Markdown table: one line per γ, cosine / relative error per weight matrix."""
    params = [p for p in dict.fromkeys(r["param"] for r in rows) if p.endswith("weight")]
    lines = ["| γ | " + " | ".join(f"{p} cos / rel.err" for p in params) + " |",
             "|---|" + "---|" * len(params)]
    for gamma in dict.fromkeys(r["gamma"] for r in rows):
        cells = []
        for p in params:
            r = next(r for r in rows if r["gamma"] == gamma and r["param"] == p)
            cells.append(f"{r['cosine']:.4f} / {r['rel_error']:.3f}")
        lines.append(f"| {gamma:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
