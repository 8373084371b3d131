"""First-layer filter pictures (Fig. 1 of the lifted-network paper): rules side by side in one PNG.

Each row of ``W_0`` (one hidden unit's input weights) is reshaped to the input image and shown
with its own symmetric grey scale, so that the pattern, not the magnitude, is compared.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Fig. 1.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ..plots import tile


def filter_grid(weight: torch.Tensor, image_shape: tuple[int, ...], n: int = 64) -> torch.Tensor:
    """Tile the first ``n`` rows of ``weight`` (``(units, C·H·W)``) into one ``(rows·(H+1), cols·(W+1))`` image.

    Every filter is scaled to ``[-1, 1]`` by its own maximum absolute value; gaps are 0 (grey).
    Colour inputs are averaged over channels.

    Raises:
        ValueError: if the input width does not match ``image_shape``.
    """
    shape = tuple(image_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    c, h, w = shape
    if weight.dim() != 2 or weight.shape[1] != c * h * w:
        raise ValueError(f"First-layer weights of shape {tuple(weight.shape)} do not fit images of shape {shape}")
    n = min(n, weight.shape[0])
    filt = weight[:n].detach().float().cpu().reshape(n, c, h, w).mean(dim=1)
    filt = filt / filt.flatten(1).abs().amax(dim=1).clamp_min(1e-12).view(n, 1, 1)
    return tile(filt)


def plot_filters(weights: Mapping[str, torch.Tensor], image_shape: tuple[int, ...], path: str | os.PathLike,
                 n: int = 64, title: str = "") -> None:
    """Write one PNG with the first-layer filters of several rules side by side.

    Args:
        weights: rule name → ``W_0`` (``(units, n_inputs)``), e.g. ``{"backprop": W, "contrastive": W, ...}``.
        image_shape: ``(C, H, W)`` or ``(H, W)`` of the inputs.
        path: output PNG (written atomically).
        n: filters per rule (the paper shows 64).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import save_figure

    if not weights:
        raise ValueError("No weights to plot")
    fig, axes = plt.subplots(1, len(weights), figsize=(4 * len(weights), 4.4), squeeze=False)
    for ax, (name, w) in zip(axes[0], weights.items()):
        ax.imshow(filter_grid(w, image_shape, n).numpy(), cmap="gray", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(name)
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
