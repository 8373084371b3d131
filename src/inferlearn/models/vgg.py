"""PCX's VGG-5 and VGG-7, the convolutional benchmarks of predictive coding.

Both are plain ``nn.Sequential`` chains (every rule reads them as a chain, and ``torch.fx`` traces them):
per stage ``Conv3×3 → activation [→ Pool 2×2]``, then ``Flatten → Linear``. Layer sizes for 32×32
colour images (CIFAR-10/100):

| model  | conv stages: channels (padding), P = 2×2 pooling after the stage | features  | classifier        |
|--------|-------------------------------------------------------------------|-----------|-------------------|
| `vgg5` | 128 (1) P, 256 (1) P, 512 (1) P, 512 (1) P                        | 512×2×2   | `Linear(2048, C)` |
| `vgg7` | 128 (1) P, 128 (1), 256 (1) P, 256 (0), 512 (1) P, 512 (0)        | 512×1×1   | `Linear(512, C)`  |

References:
    Pinchetti, Qi, Lokshyn, Olivers, Emde, Tang, M'Charrak, Frieder, Menzat, Bogacz, Lukasiewicz, Salvatori,
    *Benchmarking predictive coding networks -- made simple* (2024, arXiv:2407.01163), Section 4.1; the layer
    sizes are those of the ``ConvNet`` classes of its experiment code (github.com/liukidar/pcax, release
    v0.6.1, ``examples/s4_1_discriminative_mode/VGG5`` and ``VGG7``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from .activations import activation_name, make_activation
from .conv import ImageInput, image_dims
from .init import default_init_, generator

# (output channels, padding, 2×2 pooling after the stage) per conv stage; kernel 3×3, stride 1
VGG5_STAGES = ((128, 1, True), (256, 1, True), (512, 1, True), (512, 1, True))
VGG7_STAGES = ((128, 1, True), (128, 1, False), (256, 1, True), (256, 0, False), (512, 1, True), (512, 0, False))
POOLS = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}
MIN_SIZE = 32   # the images the layer sizes were designed for


def scaled_width(channels: int, width: float) -> int:
    """``channels × width`` rounded, at least 1 (the width multiplier of the zoo's conv nets)."""
    return max(1, round(channels * width))


class VGG(nn.Sequential):
    """A VGG-style chain: conv stages (``Conv3×3 → activation [→ Pool2]``), then ``Flatten → Linear``.

    ``vgg5``/``vgg7`` (:func:`vgg5`, :func:`vgg7`) are PCX's benchmark networks; see the module docstring
    for their layer sizes. The classifier's input size follows from the image size, so larger images
    (Tiny ImageNet) work as in PCX.

    Args:
        stages: ``(channels, padding, pool)`` per conv stage (kernel 3×3, stride 1).
        image_shape: ``(C, H, W)`` of one input image.
        n_classes: outputs of the final ``Linear``.
        width: channel multiplier (``width=0.125`` gives 16-32-64-64 channels for VGG-5).
        pool: ``"max"`` (PCX's) or ``"avg"`` (an affine map, which the lifted energies accept).
        act: activation name (:mod:`inferlearn.models.activations`), one module per stage.
        seed: seed of the initialisation: PyTorch's (and Equinox's, PCX's) default, weights and biases
            ``U(−1/√fan_in, 1/√fan_in)``.
        flat_input: inputs are flat ``(batch, C·H·W)`` rows (the library's data sets); an
            ``nn.Unflatten`` comes first. ``False``: inputs are ``(batch, C, H, W)``.

    Note:
        Images smaller than 32×32 (MNIST's 28×28, the 8×8 digits) are zero-padded to 32×32 by the first
        convolution's padding (``padding = 1 + ⌈(32 − H)/2⌉``, the same as ``ZeroPad2d`` before it), so
        every layer has PCX's size; VGG-7's unpadded convolutions would otherwise leave no pixels.
    """

    def __init__(self, stages: Sequence[tuple[int, int, bool]], image_shape: Sequence[int], n_classes: int,
                 width: float = 1.0, pool: str = "max", act: str = "relu", seed: int | None = 0,
                 flat_input: bool = True):
        C, H, W = image_dims(image_shape, f"VGG-{len(stages) + 1}")
        if not (width > 0 and math.isfinite(width)):
            raise ValueError(f"Invalid width multiplier: {width}")
        if pool not in POOLS:
            raise ValueError(f"Unknown pooling {pool!r}; choose one of {', '.join(POOLS)}")
        act = activation_name(act)
        layers: list[nn.Module] = [ImageInput(1, (C, H, W))] if flat_input else []
        pad_h, pad_w = (max(0, math.ceil((MIN_SIZE - s) / 2)) for s in (H, W))   # first stage only
        c_in = C
        for i, (channels, padding, pooled) in enumerate(stages):
            c_out = scaled_width(channels, width)
            ph, pw = padding + pad_h, padding + pad_w
            pad_h = pad_w = 0
            layers += [nn.Conv2d(c_in, c_out, 3, padding=(ph, pw)), make_activation(act)]
            H, W = H + 2 * ph - 2, W + 2 * pw - 2
            if pooled:
                layers.append(POOLS[pool](2, 2))
                H, W = H // 2, W // 2
            if H < 1 or W < 1:
                raise ValueError(f"Images of shape {tuple(image_shape)} are too small for this VGG: "
                                 f"conv stage {i + 1} leaves no pixels")
            c_in = c_out
        layers += [nn.Flatten(), nn.Linear(c_in * H * W, n_classes)]
        super().__init__(*layers)
        default_init_(self, generator(seed))


def vgg5(image_shape: Sequence[int], n_classes: int, width: float = 1.0, pool: str = "max", act: str = "relu",
         seed: int | None = 0, flat_input: bool = True) -> VGG:
    """PCX's VGG-5 (``--arch vgg5``): four conv stages 128-256-512-512, each followed by 2×2 pooling, and
    ``Linear(512·2·2, C)`` on 32×32 images (3.86M parameters for CIFAR-10). Arguments as :class:`VGG`."""
    return VGG(VGG5_STAGES, image_shape, n_classes, width, pool, act, seed, flat_input)


def vgg7(image_shape: Sequence[int], n_classes: int, width: float = 1.0, pool: str = "max", act: str = "relu",
         seed: int | None = 0, flat_input: bool = True) -> VGG:
    """PCX's VGG-7 (``--arch vgg7``): six conv stages 128-128-256-256-512-512, pooling after the 1st, 3rd and
    5th, the 4th and 6th unpadded, and ``Linear(512, C)`` on 32×32 images (4.58M parameters for CIFAR-10).
    Arguments as :class:`VGG`."""
    return VGG(VGG7_STAGES, image_shape, n_classes, width, pool, act, seed, flat_input)
