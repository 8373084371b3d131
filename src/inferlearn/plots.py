"""Plots a person would rather look at than read: learning curves of one or several runs."""
from __future__ import annotations

import io
import math
import os

import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator  # noqa: E402
import torch  # noqa: E402

from .atomic import write_bytes  # noqa: E402

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
    save_figure(fig, path)


def save_figure(fig, path: str | os.PathLike) -> None:
    """Write ``fig`` as a PNG atomically (rendered in memory first, so a full disk gives one
    :class:`~inferlearn.errors.WriteError` naming the file and its size) and close it."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=110, format="png")
    finally:
        plt.close(fig)
    write_bytes(buffer.getbuffer(), path)


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


def plot_benchmark(results: dict, path: str | os.PathLike) -> None:
    """Horizontal bars of a benchmark (:mod:`inferlearn.benchmark.runner`): test accuracy per variant (mean over the
    seeds, the std as error bars), labelled by the variant's name (the table's first column says what it is), PCX run
    at the same budget (``results["peer"]``, mean ± std) and the published numbers as markers, the budget in the
    title; atomically."""
    rows = [r for r in results["variants"] if r.get("test_acc_mean") is not None]
    peer = results.get("peer") or {}
    fig, ax = plt.subplots(figsize=(7.0, max(2.5, 0.45 * len(rows) + 1.4)))
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [100 * r["test_acc_mean"] for r in rows], xerr=[100 * r["test_acc_std"] for r in rows], capsize=3,
            color="tab:blue", alpha=0.8, label="ours (mean ± std over seeds)")
    runs = [(y, peer[r["variant"]]["test_acc"]) for y, r in zip(ys, rows) if peer.get(r["variant"], {}).get("test_acc")]
    if runs:
        means = [100 * float(np.mean(a)) for _, a in runs]
        ax.errorbar(means, [y for y, _ in runs], xerr=[100 * float(np.std(a)) for _, a in runs], fmt="o",
                    color="tab:orange", capsize=3, zorder=3, label="PCX, this budget (mean ± std)")
    refs = [(r["reference"]["test_acc"], y) for y, r in zip(ys, rows) if r.get("reference")]
    if refs:
        ax.scatter(*zip(*refs), marker="D", color="tab:red", zorder=3, label="PCX (published, full budget)")
    ax.set_yticks(ys, [r["variant"] for r in rows], fontsize=8)
    ax.set_xlabel("test accuracy (%)")
    if rows:
        lo = min([100 * (r["test_acc_mean"] - r["test_acc_std"]) for r in rows] + [v for v, _ in refs])
        ax.set_xlim(max(0.0, lo - 5), 100)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{results['protocol']} — budget {results['budget']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
