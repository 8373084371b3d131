"""Split any feed-forward network into blocks ``f_1 … f_T`` for block-ADMM.

Block-ADMM (docs/maths.md §C) only needs each block to be an ordinary ``nn.Module`` mapping a batch of
inputs to a batch of outputs; back-propagation stays inside a block. This file turns a user's
``nn.Sequential`` (or a list of modules) into blocks at chosen split points without rewriting it,
builds the MLP and small conv nets used in the experiments, and checks that consecutive blocks fit
together, failing early with a message that names the offending block and shapes.

Example::

    net = conv_net()                              # an ordinary nn.Sequential
    blocks = split_sequential(net, [2, 5])        # three blocks: net[0:2], net[2:5], net[5:]
    shapes = check_blocks(blocks, (1, 28, 28))    # [(16, 14, 14), (32, 7, 7), (10,)]

References:
    Khorram et al., "Stochastic Block-ADMM for Training Deep Networks" (seed 003), §3.1 and Fig. 1.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..models import parse_arch
from ..engine.graph import is_activation
from ..models.activations import make_activation

def mlp(sizes: str | Sequence[int], act: str = "relu", seed: int | None = 0,
        dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A plain ``nn.Sequential`` MLP ``[Flatten, Linear, act, Linear, act, …, Linear]``.

    The ``Flatten`` lets the same network take images ``(B, C, H, W)`` or vectors ``(B, D)``.
    Layers use PyTorch's default initialisation drawn from ``seed``.
    """
    sizes = parse_arch(sizes)
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Flatten()]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(make_activation(act))
    return nn.Sequential(*layers)


def conv_net(channels: Sequence[int] = (16, 32), n_classes: int = 10, in_channels: int = 1,
             image_size: int = 28, act: str = "relu", seed: int | None = 0,
             dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A small conv net: per stage ``Conv3x3 → MaxPool2 → act``, then ``Flatten → Linear``.

    For MNIST with the defaults: ``(1,28,28) → (16,14,14) → (32,7,7) → 10``. The activation comes
    after the pooling (for ReLU, and any non-decreasing activation, ``act(maxpool(a)) =
    maxpool(act(a))``, so this is the usual net) so that a split before the activation leaves a
    pooled, 4× smaller decoupling variable. Stage ``s`` occupies module indices ``3s … 3s+2``.
    """
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    c_in, size = in_channels, image_size
    for c in channels:
        layers += [nn.Conv2d(c_in, c, 3, padding=1, dtype=dtype), nn.MaxPool2d(2), make_activation(act)]
        c_in, size = c, size // 2
    layers += [nn.Flatten(), nn.Linear(c_in * size * size, n_classes, dtype=dtype)]
    return nn.Sequential(*layers)


def default_split_points(net: nn.Sequential | Sequence[nn.Module]) -> list[int]:
    """Split *before* every activation that follows a weight layer (and its pooling).

    The decoupling variables ``Z_t`` are then pre-activations, whose range is unconstrained. Were
    ``Z_t`` a ReLU or sigmoid output, the ``Z`` update could move targets out of the block's range
    (e.g. below 0 for ReLU); the block could never close that residual and the dual ``U_t`` would
    integrate it without bound (we saw block-ADMM runs collapse this way after a few epochs).
    For ``mlp("784-64-64-10")`` the blocks are ``[Flatten, Linear]``, ``[ReLU, Linear]``,
    ``[ReLU, Linear]``; for :func:`conv_net` ``[Conv, Pool]``, ``[ReLU, Conv, Pool]``,
    ``[ReLU, Flatten, Linear]``.
    """
    modules = list(net)
    points, seen_weights = [], False
    for i, m in enumerate(modules):
        if any(p.requires_grad for p in m.parameters(recurse=True)):
            seen_weights = True
        elif seen_weights and is_activation(m) and 0 < i < len(modules) - 1:
            points.append(i)
            seen_weights = False
    return points


def split_sequential(net: nn.Sequential | Sequence[nn.Module],
                     split_points: Sequence[int] | None = None) -> list[nn.Sequential]:
    """Split a network into blocks ``net[0:p_1], net[p_1:p_2], …, net[p_k:]``.

    The blocks share the original modules (no copy), so training the blocks trains ``net``.

    Args:
        net: an ``nn.Sequential`` or a list of modules applied in order.
        split_points: strictly increasing module indices in ``1 … len(net) - 1``; ``None`` uses
            :func:`default_split_points`; ``[]`` gives a single block.

    Raises:
        ValueError: split points out of range, unsorted or repeated; a block without parameters.
    """
    modules = list(net)
    n = len(modules)
    if n == 0:
        raise ValueError("Cannot split an empty network")
    if split_points is None:
        split_points = default_split_points(modules)
    points = [int(p) for p in split_points]
    for p in points:
        if not 1 <= p <= n - 1:
            raise ValueError(f"Invalid split point {p}: the network has {n} modules, so split points must lie "
                             f"in 1..{n - 1} (a split at p puts modules [.., p-1] and [p, ..] in different blocks)")
    if any(b <= a for a, b in zip(points[:-1], points[1:])):
        raise ValueError(f"Split points must be strictly increasing, got {points}")
    bounds = [0, *points, n]
    blocks = [nn.Sequential(*modules[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    for t, (blk, a, b) in enumerate(zip(blocks, bounds[:-1], bounds[1:])):
        if not any(p.requires_grad for p in blk.parameters()):
            raise ValueError(f"Block {t + 1} (modules {a}..{b - 1}: {[type(m).__name__ for m in blk]}) has no "
                             f"trainable parameters; move the split point so every block contains a weight layer")
    return blocks


def check_blocks(blocks: Sequence[nn.Module], input_shape: Sequence[int],
                 dtype: torch.dtype | None = None) -> list[tuple[int, ...]]:
    """Run a 2-sample batch through the blocks; return each block's per-sample output shape.

    Raises:
        ValueError: if a block cannot take the previous block's output, naming both shapes.
    """
    if len(blocks) == 0:
        raise ValueError("Need at least one block")
    param = next((p for b in blocks for p in b.parameters()), None)
    if dtype is None:
        dtype = param.dtype if param is not None else torch.get_default_dtype()
    device = param.device if param is not None else None
    z = torch.zeros(2, *input_shape, dtype=dtype, device=device)
    shapes = []
    was_training = [b.training for b in blocks]
    with torch.no_grad():
        for t, blk in enumerate(blocks):
            blk.eval()
            try:
                z = blk(z)
            except Exception as exc:  # re-raised with the block and shape it failed on
                where = "the input" if t == 0 else f"the output of block {t}"
                raise ValueError(f"Block {t + 1} ({type(blk).__name__}) cannot take {where}, per-sample shape "
                                 f"{tuple(z.shape[1:])}: {exc}") from exc
            finally:
                blk.train(was_training[t])
            shapes.append(tuple(z.shape[1:]))
    return shapes


def forward_blocks(blocks: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Plain forward pass through the blocks (test time of block-ADMM)."""
    for blk in blocks:
        x = blk(x)
    return x
