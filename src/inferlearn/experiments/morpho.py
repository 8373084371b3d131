"""Morpho-MNIST-like shape attributes of digit images: thickness, slant, width, height.

Used as human-understandable attributes that a classifier never saw, for the DeepFacto probe
experiment (linear SVMs on NMF scores predict them, like the face attributes of the paper).

Definitions (images ``(N, H, W)`` in ``[0, 1]``, foreground = pixels ``> threshold``):

* **thickness**: twice the mean Euclidean distance-to-background over the *ridge* pixels (foreground
  pixels whose distance is a local maximum in their 3×3 neighbourhood), i.e. the mean stroke width
  along an approximate medial axis.
* **slant**: ``atan(μ₁₁ / μ₀₂)`` from the intensity-weighted central moments (``μ₁₁`` covariance of
  column and row, ``μ₀₂`` row variance), in radians; positive means the top leans right.
* **width**, **height**: extent in pixels of the foreground's columns and rows, measured after
  removing the slant (shear by ``−tan(slant)``), so that a slanted "1" is narrow.

References:
    Castro et al., "Morpho-MNIST: Quantitative Assessment and Diagnostics for Representation
    Learning" (2019), §3 (thickness, slant, width, height).

Note:
    Morpho-MNIST measures thickness on a skeleton from a morphological thinning and width/height on
    a slant-corrected bounding parallelogram. We use the distance-transform ridge and a sheared
    bounding box (scipy only, no scikit-image); the attributes are the same quantities up to these
    approximations, which is what binary median-split probes need.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

ATTRIBUTES = ("thickness", "slant", "width", "height")


def _thickness(fg: np.ndarray) -> float:
    dist = ndimage.distance_transform_edt(fg)
    ridge = fg & (dist >= ndimage.maximum_filter(dist, size=3))
    return float(2.0 * dist[ridge].mean()) if ridge.any() else 0.0


def morpho_attributes(images: torch.Tensor | np.ndarray, image_shape=(28, 28), threshold: float = 0.5) -> dict:
    """Per-image thickness, slant, width and height (see module docstring).

    Args:
        images: ``(N, H·W)`` or ``(N, H, W)`` (or ``(N, 1, H, W)``) in ``[0, 1]``.
        image_shape: ``(H, W)`` for flat input.
        threshold: foreground threshold.

    Returns:
        dict of name → float64 array of length ``N``.
    """
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    H, W = image_shape[-2:]
    x = x.reshape(x.shape[0], H, W).astype(np.float64)
    rows, cols = np.mgrid[0:H, 0:W].astype(np.float64)
    out = {k: np.zeros(x.shape[0]) for k in ATTRIBUTES}
    for i, img in enumerate(x):
        fg = img > threshold
        if not fg.any():
            continue
        m = img.sum()
        rc, cc = (img * rows).sum() / m, (img * cols).sum() / m
        mu11 = (img * (rows - rc) * (cols - cc)).sum() / m
        mu02 = (img * (rows - rc) ** 2).sum() / m
        # Rows grow downwards, so a top leaning right has negative row-column covariance.
        slant = float(np.arctan(-mu11 / mu02)) if mu02 > 0 else 0.0
        r_idx, c_idx = np.nonzero(fg)
        c_desk = c_idx + np.tan(slant) * (r_idx - rc)
        out["thickness"][i] = _thickness(fg)
        out["slant"][i] = slant
        out["width"][i] = c_desk.max() - c_desk.min() + 1
        out["height"][i] = r_idx.max() - r_idx.min() + 1
    return out


def binary_attributes(attrs: dict, medians: dict | None = None) -> tuple[dict, dict]:
    """Threshold each attribute at its median (from ``medians``, e.g. the training set's, if given).

    Label 1 means ``value > median``; when many values equal the median (MNIST digits are
    size-normalised, so heights cluster at 20 px), ``value ≥ median`` is used instead if that split is
    more balanced on the data the medians come from. Returns ``(labels, thresholds)``, where a
    threshold is ``(median, inclusive)``; pass the thresholds back to label test data identically.
    """
    if medians is None:
        medians = {}
        for k, v in attrs.items():
            med = float(np.median(v))
            strict, incl = (v > med).mean(), (v >= med).mean()
            medians[k] = (med, bool(abs(incl - 0.5) < abs(strict - 0.5) - 1e-9))
    labels = {k: ((v >= medians[k][0]) if medians[k][1] else (v > medians[k][0])).astype(np.int64)
              for k, v in attrs.items()}
    return labels, medians
