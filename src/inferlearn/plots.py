"""Plots a person would rather look at than read: learning curves of one or several runs."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .atomic import atomic_path  # noqa: E402

CURVE_KEYS = (("train_loss", "train loss (quadratic)"), ("train_acc", "train accuracy"),
              ("test_acc", "test accuracy"), ("active_fraction", "active non-linearities"))


def plot_curves(runs: dict[str, list[dict]], path: str | os.PathLike, title: str = "") -> None:
    """Plot per-epoch metrics of each run (one line per run) into a 2×2 PNG, atomically."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, label) in zip(axes.flat, CURVE_KEYS):
        for name, records in runs.items():
            pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=name)
        ax.set_xlabel("epoch")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].set_yscale("log")
    axes.flat[2].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
