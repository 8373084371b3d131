"""CIFAR ResNets: He et al.'s ResNet-20 and the CIFAR-style ResNet-18, readable as graphs.

``stem → stages of basic blocks → global average pooling → Flatten → Linear``. The stem is
``Conv3×3 → [BN] → act`` (no max pooling); a basic block is::

    out = act2(branch(x) + shortcut(x)),   branch = [BN] ∘ Conv3×3 ∘ act1 ∘ [BN] ∘ Conv3×3(stride s)

written with ``+`` and one activation module per use, so that ``torch.fx`` traces it and the engine reads
it as a graph whose node pre-activations are sums of layer maps (:mod:`inferlearn.engine.graph`).
Stages after the first start with a stride-2 block. Every shortcut is linear or affine:

* ``shortcut="a"`` (ResNet-20's default, He et al.'s option A): parameter-free, ``x[:, :, ::2, ::2]``
  zero-padded with the new channels (:class:`PadShortcut`, a linear map);
* ``shortcut="b"`` (ResNet-18's default, option B): ``Conv1×1(stride 2) → [BN]``, affine.

Batch normalisation (``bn=``; ``train`` is ``nn.BatchNorm2d`` with batch statistics in training mode, which
back-propagation, predictive coding and ePC read, the other energy rules refuse):

* ``off`` (default): no normalisation; every convolution has a bias instead (BN's shift).
* ``eval``: ``Conv (no bias) → BN`` with :class:`EvalBatchNorm2d`, which stays in evaluation mode, so it is
  the fixed per-channel affine map ``γ (x − μ)/√(σ² + ε) + β`` with learned ``γ, β`` and the running
  statistics ``μ = 0, σ² = 1`` it starts with (or loads from a checkpoint). Training-mode batch
  normalisation normalises each sample by statistics of the whole mini-batch: it couples the samples,
  so a sample's energy is no longer its own and inference rules (whose per-sample inference problems
  must be separate) cannot use it. Back-propagation could, but the zoo keeps one model for every rule.

References:
    He, Zhang, Ren, Sun, *Deep residual learning for image recognition* (CVPR 2016), Section 4.2 (CIFAR-10:
    ResNet-20 with 16/32/64 channels, option A shortcuts, 0.27M parameters); He et al. (ICCV 2015) for the
    initialisation; Zhang, Dauphin, Ma, *Fixup initialization* (ICLR 2019) for the branch rescaling.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .activations import activation_name, make_activation
from .conv import ImageInput, image_dims
from .init import fan_in, fill_normal_, fill_uniform_, generator
from .vgg import scaled_width

RESNET20_STAGES = ((16, 3), (32, 3), (64, 3))              # (channels, blocks) per stage
RESNET18_STAGES = ((64, 2), (128, 2), (256, 2), (512, 2))
BN_MODES = ("off", "eval", "train")
SHORTCUTS = ("a", "b")


class EvalBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that always computes in evaluation mode: ``γ (x − μ)/√(σ² + ε) + β`` with its
    running statistics, which it never updates (``model.train()`` leaves it in evaluation mode).

    A per-channel affine map, declared affine for the engine, so every rule can use it; ``γ`` and ``β``
    are trained.
    """

    def __init__(self, num_features: int):
        super().__init__(num_features)
        self.training = False
        self.inferlearn_affine = True

    def train(self, mode: bool = True) -> EvalBatchNorm2d:
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # no input checks or mode branches, so that torch.fx traces through it
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


class PadShortcut(nn.Module):
    """He et al.'s option-A shortcut: ``x ↦ x[:, :, ::s, ::s]`` with ``c_out − c_in`` zero channels added
    (half before, half after). Linear and parameter-free; declared affine for the engine."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        if c_out < c_in:
            raise ValueError(f"An option-A shortcut cannot reduce channels ({c_in} → {c_out})")
        self.stride, self.before = int(stride), (c_out - c_in) // 2
        self.after = c_out - c_in - self.before
        self.inferlearn_affine = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stride
        return F.pad(x[:, :, ::s, ::s], (0, 0, 0, 0, self.before, self.after))

    def extra_repr(self) -> str:
        return f"stride={self.stride}, pad=({self.before}, {self.after})"


def _conv(c_in: int, c_out: int, kernel: int, stride: int, bn: str) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=bn == "off")


def _norm(channels: int, bn: str) -> nn.Module:
    if bn == "eval":
        return EvalBatchNorm2d(channels)
    return nn.BatchNorm2d(channels) if bn == "train" else nn.Identity()


class BasicBlock(nn.Module):
    """``act2(BN(Conv3×3(act1(BN(Conv3×3_s(x))))) + shortcut(x))`` (BN unless ``bn="off"``).

    Args:
        c_in: channels in.
        c_out: channels out.
        stride: stride of the first convolution (and of the shortcut).
        act: activation name, one module per use.
        bn: ``"eval"`` (:class:`EvalBatchNorm2d`) or ``"train"`` (``nn.BatchNorm2d``) after each convolution, or
            ``"off"`` (convolutions with a bias instead).
        shortcut: ``"a"`` (:class:`PadShortcut`) or ``"b"`` (``Conv1×1 → [BN]``) when the shape changes;
            the identity otherwise.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, act: str, bn: str, shortcut: str):
        super().__init__()
        self.conv1, self.norm1, self.act1 = _conv(c_in, c_out, 3, stride, bn), _norm(c_out, bn), make_activation(act)
        self.conv2, self.norm2 = _conv(c_out, c_out, 3, 1, bn), _norm(c_out, bn)
        if stride == 1 and c_in == c_out:
            self.shortcut: nn.Module = nn.Identity()
        elif shortcut == "a":
            self.shortcut = PadShortcut(c_in, c_out, stride)
        else:
            self.shortcut = nn.Sequential(_conv(c_in, c_out, 1, stride, bn), _norm(c_out, bn))
        self.act2 = make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.norm2(self.conv2(self.act1(self.norm1(self.conv1(x)))))
        return self.act2(branch + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR ResNet of basic blocks (see the module docstring for the block, shortcuts and BN modes).

    Args:
        stages: ``(channels, blocks)`` per stage; stages after the first start with a stride-2 block.
        image_shape: ``(C, H, W)`` of one input image (any size: the pooling is global).
        n_classes: outputs of the final ``Linear``.
        width: channel multiplier.
        bn: ``"off"``, ``"eval"`` or ``"train"`` (``nn.BatchNorm2d``, batch statistics in training mode: back-propagation,
            predictive coding and ePC read it; :mod:`inferlearn.rules.batch_layers`).
        shortcut: ``"a"`` or ``"b"``.
        act: activation name, one module per use.
        seed: seed of the initialisation: convolutions ``N(0, 2/fan_in)`` (He et al. 2015) with zero
            biases, the second convolution of every branch then scaled by ``1/√B`` (``B`` blocks), BN
            ``γ = 1, β = 0``, the ``Linear`` PyTorch's default ``U(±1/√fan_in)``.
        flat_input: inputs are flat ``(batch, C·H·W)`` rows (an ``nn.Unflatten`` comes first); ``False``:
            ``(batch, C, H, W)``.

    Note:
        The ``1/√B`` branch scaling is Fixup's rescaling for two layers per branch (Zhang et al. 2019): with
        no batch statistics to normalise the residual stream (``bn=off``, or ``bn=eval``'s fixed map), He
        initialisation doubles the stream's variance at every block (2⁹ over ResNet-20); scaled, it grows
        by at most ``e``. He et al. train with batch statistics and no rescaling.
    """

    def __init__(self, stages: Sequence[tuple[int, int]], image_shape: Sequence[int], n_classes: int,
                 width: float = 1.0, bn: str = "off", shortcut: str = "a", act: str = "relu",
                 seed: int | None = 0, flat_input: bool = True):
        super().__init__()
        C, H, W = image_dims(image_shape, "ResNet")
        if not (width > 0 and math.isfinite(width)):
            raise ValueError(f"Invalid width multiplier: {width}")
        if bn not in BN_MODES:
            raise ValueError(f"Unknown batch-normalisation mode {bn!r}; choose one of {', '.join(BN_MODES)}")
        if shortcut not in SHORTCUTS:
            raise ValueError(f"Unknown shortcut {shortcut!r}; choose one of {', '.join(SHORTCUTS)}")
        act, use_bn = activation_name(act), bn
        self.input = ImageInput(1, (C, H, W)) if flat_input else nn.Identity()
        c = scaled_width(stages[0][0], width)
        self.stem, self.stem_norm, self.stem_act = _conv(C, c, 3, 1, use_bn), _norm(c, use_bn), make_activation(act)
        blocks = []
        for s, (channels, n_blocks) in enumerate(stages):
            for b in range(n_blocks):
                c_out = scaled_width(channels, width)
                blocks.append(BasicBlock(c, c_out, 2 if s > 0 and b == 0 else 1, act, use_bn, shortcut))
                c = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool, self.flatten, self.fc = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, n_classes)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int | None = 0) -> None:
        """Draw the initialisation described in the class docstring from ``seed``."""
        gen = generator(seed)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fill_normal_(m.weight, math.sqrt(2.0 / fan_in(m)), gen)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            for block in self.blocks:
                block.conv2.weight.mul_(1.0 / math.sqrt(len(self.blocks)))
        bound = 1.0 / math.sqrt(self.fc.in_features)
        fill_uniform_(self.fc.weight, bound, gen)
        fill_uniform_(self.fc.bias, bound, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_act(self.stem_norm(self.stem(self.input(x))))
        return self.fc(self.flatten(self.pool(self.blocks(x))))


def resnet20(image_shape: Sequence[int], n_classes: int, width: float = 1.0, bn: str = "off", shortcut: str = "a",
             act: str = "relu", seed: int | None = 0, flat_input: bool = True) -> ResNet:
    """He et al.'s CIFAR ResNet-20 (``--arch resnet20``): a 16-channel stem, three stages of three basic blocks
    with 16, 32 and 64 channels, option-A shortcuts; 0.27M parameters (269,722 with ``bn=eval`` for 10
    classes). Arguments as :class:`ResNet`."""
    return ResNet(RESNET20_STAGES, image_shape, n_classes, width, bn, shortcut, act, seed, flat_input)


def resnet18(image_shape: Sequence[int], n_classes: int, width: float = 1.0, bn: str = "off", shortcut: str = "b",
             act: str = "relu", seed: int | None = 0, flat_input: bool = True) -> ResNet:
    """The CIFAR-style ResNet-18 (``--arch resnet18``): a 3×3 64-channel stem without max pooling, four stages of
    two basic blocks with 64, 128, 256 and 512 channels, option-B (1×1 convolution) shortcuts; 11.2M
    parameters (11,173,962 with ``bn=eval`` for 10 classes). Arguments as :class:`ResNet`.

    Note:
        He et al.'s ResNet-18 is the ImageNet network (7×7 stride-2 stem and max pooling); this is the common
        adaptation to 32×32 images, with the 3×3 stem of their CIFAR networks.
    """
    return ResNet(RESNET18_STAGES, image_shape, n_classes, width, bn, shortcut, act, seed, flat_input)
