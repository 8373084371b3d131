"""Plots a person would rather look at than read: learning curves of one or several runs."""
from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator  # noqa: E402
import torch  # noqa: E402

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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # no fractional epochs on short runs
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


def tile(filters: torch.Tensor) -> torch.Tensor:
    """Tile ``(n, h, w)`` images into one ``(rows·(h+1) − 1, cols·(w+1) − 1)`` grid (gaps 0), as square as possible."""
    n, h, w = filters.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = torch.zeros(rows * (h + 1) - 1, cols * (w + 1) - 1)
    for i in range(n):
        r, q = divmod(i, cols)
        grid[r * (h + 1):r * (h + 1) + h, q * (w + 1):q * (w + 1) + w] = filters[i]
    return grid
