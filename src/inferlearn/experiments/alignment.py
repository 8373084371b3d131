"""How close is a lifted rule's gradient to back-propagation's? A sweep over the feedback weight γ.

For every γ the contrastive gradient (divided by ``γ^{L-1}``) -- or the standard lifted (J_0)
gradient (layer ``k`` divided by ``γ^k``) -- is compared with BackProp's on the same batch and weights,
per parameter: cosine similarity and norm ratio (:func:`inferlearn.diagnostics.gradient_alignment`).
docs/maths.md §A: for linear units the contrastive gradient differs only by ``ẑ_k`` in place of the
forward activation, and for ReLU units the difference is ``O(γ)``. The paper says standard lifted
training does *not* approximate back-propagation even at small γ: the clamped residual of a unit held
at its bound (``a_j`` for an inactive ReLU) is ``O(1)`` and is not cancelled by a free phase, while the
back-propagated error reaching layer ``k`` is ``O(γ^{L-1-k})``. The cosine is invariant to the
per-layer scaling, so the J_0 comparison does not depend on it.

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
from ..rules.lifted import LiftedJ0

DEFAULT_GAMMAS = (1.0, 1 / 2, 1 / 8, 1 / 32, 1 / 128)
SWEEP_RULES = {"contrastive": Contrastive, "lifted-j0": LiftedJ0}


def gamma_sweep(model, x: torch.Tensor, labels: torch.Tensor, gammas: Sequence[float] = DEFAULT_GAMMAS,
                solver: str = "reference", dtype: torch.dtype | None = torch.float64,
                rule: str = "contrastive") -> list[dict]:
    """Per-parameter alignment of a lifted rule's gradient with BackProp's for each γ.

    Args:
        model: an :class:`~inferlearn.models.MLP` (copied; not modified).
        gammas: feedback weights to try (each > 0).
        solver: inference solver of the rule.
        dtype: compute in this dtype (``None`` keeps the model's).
        rule: ``contrastive`` (J_1) or ``lifted-j0`` (standard lifted, J_0).

    Returns:
        rows ``{"rule", "gamma", "param", "cosine", "norm_ratio", "rel_error"}`` with
        ``rel_error = ‖g − g_BP‖ / ‖g_BP‖`` (meaningful for contrastive; J_0's per-layer scale is a
        convention, so read its cosine).
    """
    if rule not in SWEEP_RULES:
        raise ValueError(f"Unknown rule {rule!r} for the γ sweep; choose from {list(SWEEP_RULES)}")
    m = copy.deepcopy(model)
    if dtype is not None:
        m = m.to(dtype)
        x = x.to(dtype)
    rows = []
    for gamma in gammas:
        for r in gradient_alignment(SWEEP_RULES[rule](gamma=gamma, solver=solver), m, x, labels):
            c, q = r["cosine"], r["norm_ratio"]
            # ‖g − g_BP‖² / ‖g_BP‖² = q² − 2 q cos + 1
            rows.append({"rule": rule, "gamma": gamma, **r, "rel_error": max(q * q - 2 * q * c + 1, 0.0) ** 0.5})
    return rows


def format_gamma(gamma: float) -> str:
    """``1/8`` for the reciprocal of an integer below 1, else ``%g``."""
    if 0 < gamma < 1 and abs(1 / gamma - round(1 / gamma)) < 1e-9 * (1 / gamma):
        return f"1/{round(1 / gamma)}"
    return f"{gamma:g}"


def sweep_markdown(rows: list[dict], cosine_only: bool = False) -> str:
    """A Markdown table: one line per γ, cosine / relative error (or the cosine alone) per weight matrix."""
    params = [p for p in dict.fromkeys(r["param"] for r in rows) if p.endswith("weight")]
    head = "cos" if cosine_only else "cos / rel.err"
    lines = ["| γ | " + " | ".join(f"{p} {head}" for p in params) + " |",
             "|---|" + "---|" * len(params)]
    for gamma in dict.fromkeys(r["gamma"] for r in rows):
        cells = []
        for p in params:
            r = next(r for r in rows if r["gamma"] == gamma and r["param"] == p)
            cells.append(f"{r['cosine']:.4f}" if cosine_only else f"{r['cosine']:.4f} / {r['rel_error']:.3f}")
        lines.append(f"| {format_gamma(gamma)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweeps(panels: dict[str, list[dict]], path) -> None:
    """One PNG: a panel per setting (title → sweep rows of one or more rules), cosine with BP vs γ,
    one line per weight matrix, solid for contrastive and dashed for J_0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import save_figure

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        params = [p for p in dict.fromkeys(r["param"] for r in rows) if p.endswith("weight")]
        for rule, style in (("contrastive", "-"), ("lifted-j0", "--")):
            for i, p in enumerate(params):
                pts = sorted((r["gamma"], r["cosine"]) for r in rows if r.get("rule", "contrastive") == rule
                             and r["param"] == p)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", markersize=3, color=f"C{i}",
                            label=f"{'J_1' if rule == 'contrastive' else 'J_0'} W{i}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("γ")
        ax.set_ylabel("cosine with back-propagation")
        ax.set_ylim(-0.2, 1.02)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
