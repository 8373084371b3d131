"""Multi-layer perceptrons built from an architecture string such as ``784-64-64-64-10``.

The network is ``z_0 = x``, ``a_{k+1} = W_k z_k + b_k``, ``z_{k+1} = Π_{C_{k+1}}(a_{k+1})`` for hidden
layers and a linear output ``z_L = a_L`` (docs/maths.md §A). Weights are drawn from a normal distribution
``N(0, init_scale² / n_k)`` and biases start at zero, from a seed, so that every rule starts from
the same network.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..units import Clamp, Box, get_units
from ..tensors import all_finite, has_only_finite  # noqa: F401  (re-exported: models.all_finite)


def parse_arch(arch: str | Sequence[int]) -> list[int]:
    """Parse ``"784-64-10"`` into ``[784, 64, 10]``; at least input and output, all positive."""
    if isinstance(arch, str):
        try:
            sizes = [int(s) for s in arch.strip().split("-")]
        except ValueError:
            raise ValueError(f"Invalid architecture {arch!r}: expected widths joined by '-', e.g. '784-64-10'") from None
    else:
        sizes = [int(s) for s in arch]
    if len(sizes) < 2 or any(s <= 0 for s in sizes):
        raise ValueError(f"Invalid architecture {arch!r}: need at least two positive widths (input-...-output)")
    return sizes


def format_arch(sizes: Sequence[int]) -> str:
    """Inverse of :func:`parse_arch`."""
    return "-".join(str(s) for s in sizes)


class MLP(nn.Module):
    """Fully connected network with box-constrained hidden units and a linear output layer.

    A builder of the simplest chain: every rule treats it like the equivalent ``nn.Sequential`` of
    ``Linear`` layers and :class:`~inferlearn.units.Clamp` units (it exposes :meth:`inferlearn_chain`),
    with its own initialisation and input checks.

    Args:
        sizes: layer widths ``[n_0, ..., n_L]`` or an architecture string.
        units: hidden unit type (name or :class:`Box`), the same for every hidden layer,
            or one per hidden layer.
        seed: seed of the weight initialisation (``None`` keeps torch's global generator).
        init_scale: weights are ``N(0, init_scale² / fan_in)``; biases are zero.
    """

    def __init__(self, sizes: str | Sequence[int], units: str | Box | Sequence = "relu",
                 seed: int | None = 0, init_scale: float = 1.0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.sizes = parse_arch(sizes)
        n_hidden = len(self.sizes) - 2
        if isinstance(units, (str, Box)):
            units = [units] * n_hidden
        units = [get_units(u) for u in units]
        if len(units) != n_hidden:
            raise ValueError(f"Got {len(units)} unit types for {n_hidden} hidden layers")
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"Invalid init_scale: {init_scale}")
        self.units: tuple[Box, ...] = tuple(units)
        self.init_scale = float(init_scale)
        self.layers = nn.ModuleList(nn.Linear(a, b, dtype=dtype) for a, b in zip(self.sizes[:-1], self.sizes[1:]))
        self.activations = nn.ModuleList(Clamp(u) for u in units)
        self.reset_parameters(seed)

    def inferlearn_chain(self) -> list[nn.Module]:
        """The chain protocol (:mod:`inferlearn.engine.graph`): ``[Linear, Clamp, Linear, …, Linear]``."""
        out: list[nn.Module] = []
        for layer, act in zip(self.layers, self.activations):
            out += [layer, act]
        return out + [self.layers[-1]]

    @property
    def in_features(self) -> int:
        return self.sizes[0]

    @property
    def out_features(self) -> int:
        return self.sizes[-1]

    @property
    def depth(self) -> int:
        """Number of weight layers ``L``."""
        return len(self.layers)

    def reset_parameters(self, seed: int | None = 0) -> None:
        """Draw ``W_k ~ N(0, init_scale²/n_k)`` and set ``b_k = 0`` from ``seed`` (CPU generator)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for layer in self.layers:
                w = torch.randn(layer.weight.shape, generator=gen, dtype=torch.float64)
                layer.weight.copy_(w * (self.init_scale / math.sqrt(layer.in_features)))
                layer.bias.zero_()

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ``ValueError`` for a batch of the wrong shape or with non-finite values."""
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"Expected input of shape (batch, {self.in_features}), got {tuple(x.shape)}")
        if not has_only_finite(x):
            raise ValueError("Input contains NaN or inf values")

    def activation(self, k: int, a: torch.Tensor) -> torch.Tensor:
        """Activation of layer ``k`` (1-based): projection for hidden layers, identity at the output."""
        return a if k == self.depth else self.units[k - 1].project(a)

    def forward_all(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Forward pass keeping every layer.

        Returns:
            ``(zs, pre)``: ``zs[k]`` is ``z_k`` for ``k = 0..L`` and ``pre[k]`` is ``a_k`` for
            ``k = 1..L`` (``pre[0]`` is ``x``, unused).
        """
        zs, pre = [x], [x]
        for k, layer in enumerate(self.layers, start=1):
            a = layer(zs[-1])
            pre.append(a)
            zs.append(self.activation(k, a))
        return zs, pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x
        for k, layer in enumerate(self.layers, start=1):
            z = self.activation(k, layer(z))
        return z

    def extra_repr(self) -> str:
        return f"sizes={format_arch(self.sizes)}, units={[u.name for u in self.units]}"
