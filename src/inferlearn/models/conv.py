"""The small conv net of the conv benchmarks, built from ``conv:C1-C2/H`` (conv channels, then dense widths)."""
from __future__ import annotations

import math

from collections.abc import Sequence

import torch
import torch.fx
from torch import nn

from ..units import Clamp, Box, get_units


def image_dims(image_shape: Sequence[int], model: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of one image, or ``ValueError`` naming ``model`` and the shape it needs."""
    shape = tuple(image_shape)
    if len(shape) != 3 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape):
        raise ValueError(f"{model} needs image_shape (C, H, W), the shape of one image, e.g. (3, 32, 32) for "
                         f"CIFAR-10 or (1, 28, 28) for MNIST; got {shape}")
    return shape


def as_images(x: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Flat rows ``(B, C·H·W)`` as images ``(B, *shape)``; images of that shape as they are; any other shape refused
    (``ValueError`` naming both). A leaf of ``torch.fx`` traces (``torch.fx.wrap``): a zoo model still traces."""
    shape = tuple(shape)
    if x.dim() == 4 and tuple(x.shape[1:]) == shape:
        return x
    if x.dim() != 2 or x.shape[1] != math.prod(shape):
        raise ValueError(f"The model takes flat rows (batch, {math.prod(shape)}) or images (batch, "
                         f"{', '.join(map(str, shape))}); got inputs of shape {tuple(x.shape)}")
    return x.unflatten(1, shape)


torch.fx.wrap("as_images")


class ImageInput(nn.Unflatten):
    """The first layer of the conv models: :func:`as_images` (``nn.Unflatten`` that also takes image batches)."""

    inferlearn_affine = True   # an affine map for the engine, and a leaf for its tracer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return as_images(x, self.unflattened_size)


def conv_net(image_shape: Sequence[int], channels: Sequence[int], hidden: Sequence[int], n_classes: int,
             units: str | Box = "relu", seed: int | None = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A conv net on flat inputs: ``Unflatten``, per stage ``Conv3×3 → unit → AvgPool2``, then
    ``Flatten → (Linear → unit)* → Linear``.

    Every layer map is affine (average pooling, not max pooling) and every unit a box, so all rules
    accept it; hidden variables sit after the units (the pooling belongs to the next layer map). The
    architecture of the conv benchmark (``benchmarks/bench_conv.py``). Default PyTorch
    initialisation, drawn from ``seed``.

    Args:
        image_shape: ``(C, H, W)`` of one input (the data are flat, ``C·H·W`` features).
        channels: output channels of each conv stage.
        hidden: widths of the dense hidden layers after the conv stages.
    """
    C, H, W = image_dims(image_shape, "a conv: architecture")
    if seed is not None:
        torch.manual_seed(seed)
    u = get_units(units)
    layers: list[nn.Module] = [ImageInput(1, (C, H, W))]
    c_in = C
    for i, c in enumerate(channels):
        if H < 2 or W < 2:
            raise ValueError(f"Too many conv stages for {tuple(image_shape)} images: stage {i + 1} sees {H}×{W}")
        layers += [nn.Conv2d(c_in, c, 3, padding=1, dtype=dtype), Clamp(u), nn.AvgPool2d(2)]
        c_in, H, W = c, H // 2, W // 2
    layers.append(nn.Flatten())
    n_in = c_in * H * W
    for h in hidden:
        layers += [nn.Linear(n_in, h, dtype=dtype), Clamp(u)]
        n_in = h
    layers.append(nn.Linear(n_in, n_classes, dtype=dtype))
    return nn.Sequential(*layers)


def parse_conv_arch(arch: str) -> tuple[list[int], list[int]]:
    """``"conv:16-32/64"`` → ``([16, 32], [64])`` (conv channels, dense hidden widths)."""
    conv, _, dense = arch[5:].partition("/")
    try:
        channels = [int(c) for c in conv.split("-")]
        hidden = [int(h) for h in dense.split("-")] if dense else []
    except ValueError:
        channels, hidden = [], []
    if not channels or any(c <= 0 for c in channels + hidden):
        raise ValueError(f"Invalid conv architecture {arch!r}: expected e.g. 'conv:16-32' or 'conv:16-32/64'")
    return channels, hidden
