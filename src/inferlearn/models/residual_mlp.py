"""A residual MLP for depth studies, in the standard parameterisation or μPC's.

With ``H`` hidden layers of width ``N`` (``depth=H``, ``L = H + 1`` weight layers), input ``x ∈ R^D`` and
``C`` outputs::

    h_1 = a_1 W_1 x                                  input layer (no activation)
    h_l = h_{l−1} + a_l W_l φ(h_{l−1}),  l = 2..H    residual blocks (plain: h_l = a_l W_l φ(h_{l−1}))
    y   = a_L W_L φ(h_H)                             readout

No biases. The parameterisations (``param=``):

| `param` | weights          | `a_1`  | `a_l` (hidden)                                                  | `a_L` |
|---------|------------------|--------|-----------------------------------------------------------------|-------|
| `sp`    | `N(0, 1/fan_in)` | 1      | `scale` (default 1)                                             | 1     |
| `mupc`  | `N(0, 1)`        | `1/√D` | `scale/√N`: default `1/√(N L)`, `1/√N` for `plain`              | `1/N` |

``scale=1/sqrt(L)`` in ``sp`` is the Depth-μP branch scaling on standard weights; μPC's hidden layers are
the same at initialisation (``a_l W_l`` has entries of variance ``1/(N L)`` either way), its parameterisation
differs in where the scale sits (in ``a_l``, so that the updates of ``W_l`` scale too) and in the readout.

Value nodes (``nodes=``, how the inference rules read the network):

* ``stream`` (μPC's form, the default for ``param=mupc``): the value nodes are the residual stream
  ``h_1 … h_H``; each block's ``a_l W_l φ(·)`` and the readout are one :class:`ScaledBranch` module with
  ``inferlearn_map = True`` (one differentiable edge of the graph, ``φ`` inside the prediction), and a
  linear unit (``Clamp("linear")``) marks each ``h_l`` as a node;
* ``units`` (the default for ``param=sp``): ``φ`` is a unit with a value node after it, as in an MLP;
  the residual sums become linear nodes where they feed more than one operation.

References:
    Innocenti, Achour, Buckley, *μPC: Scaling predictive coding to 100+ layer networks* (NeurIPS 2025,
    arXiv:2505.13124): the network, ``a_l`` and ``W ~ N(0, 1)`` are those of ``jpc.make_mlp`` (with
    ``use_bias=False`` and ``param_type="mupc"``), ``jpc.make_skip_model`` and ``jpc._get_param_scalings``
    in github.com/thebuckleylab/jpc. Yang, Yu, Zhu, Hayou, *Tensor programs VI* (ICLR 2024) and Bordelon
    et al. (ICLR 2024) for Depth-μP.

Note:
    ``param=sp`` draws ``N(0, 1/fan_in)`` (the library's MLP initialisation); jpc's ``sp`` keeps Equinox's
    default ``U(±1/√fan_in)``, a variance three times smaller.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch import nn

from ..units import Clamp
from .activations import activation_name, make_activation
from .init import fill_normal_, generator

PARAMS = ("sp", "mupc")
NODES = ("stream", "units")
DEPTH_SCALE = "1/sqrt(L)"


def parse_scale(text: str) -> float | str:
    """``scale=`` of :class:`ResidualMLP`: a positive number (``1``, ``0.25``, ``1/8``) or ``1/sqrt(L)``."""
    t = re.sub(r"\s+", "", str(text))
    if t.lower() == DEPTH_SCALE.lower():
        return DEPTH_SCALE
    num, _, den = t.partition("/")
    try:
        value = float(num) / (float(den) if den else 1.0)
    except (ValueError, ZeroDivisionError):
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"Invalid scale {text!r}: expected a positive number or {DEPTH_SCALE}")
    return value


class ScaledBranch(nn.Module):
    """``z ↦ a · W φ(z)`` (no bias): a residual branch, the readout, or (``φ`` the identity) the input layer.

    Args:
        act: the activation module ``φ``.
        n_in: input width.
        n_out: output width.
        multiplier: the constant ``a``.
        edge: set ``inferlearn_map = True``: the engine reads the whole branch as one differentiable layer
            map (no value node after ``φ``), as μPC's energy does.
    """

    def __init__(self, act: nn.Module, n_in: int, n_out: int, multiplier: float, edge: bool = False):
        super().__init__()
        self.act, self.linear, self.multiplier = act, nn.Linear(n_in, n_out, bias=False), float(multiplier)
        if edge:
            self.inferlearn_map = True

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.linear(self.act(z)) * self.multiplier

    def extra_repr(self) -> str:
        return f"multiplier={self.multiplier:.6g}"


class ResidualMLP(nn.Module):
    """Residual MLP of ``depth`` hidden layers (see the module docstring for the maths, ``param`` and ``nodes``).

    Args:
        n_features: input width ``D`` (inputs are flattened first).
        n_classes: outputs ``C``.
        depth: hidden layers ``H`` (``H − 1`` residual blocks; ``L = H + 1`` weight layers, μPC's ``L``).
        width: hidden width ``N``.
        act: activation name ``φ`` (μPC's experiments: ``relu``, ``tanh``, ``linear``).
        param: ``"sp"`` or ``"mupc"``.
        scale: branch scale: a positive number or ``"1/sqrt(L)"``; default ``1/sqrt(L)`` for ``mupc`` with
            skips, else 1.
        plain: no skip connections (``h_l = a_l W_l φ(h_{l−1})``): the plain chain of the same depth.
        nodes: ``"stream"`` or ``"units"``; default ``"stream"`` for ``mupc``, ``"units"`` for ``sp``.
        seed: seed of the weights.
    """

    def __init__(self, n_features: int, n_classes: int, depth: int = 8, width: int = 128, act: str = "relu",
                 param: str = "sp", scale: float | str | None = None, plain: bool = False,
                 nodes: str | None = None, seed: int | None = 0):
        super().__init__()
        if param not in PARAMS:
            raise ValueError(f"Unknown parameterisation {param!r}; choose one of {', '.join(PARAMS)}")
        nodes = nodes or ("stream" if param == "mupc" else "units")
        if nodes not in NODES:
            raise ValueError(f"Unknown value-node placement {nodes!r}; choose one of {', '.join(NODES)}")
        for name, v in (("depth", depth), ("width", width), ("n_features", n_features), ("n_classes", n_classes)):
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"Invalid {name}: {v} (a positive integer)")
        if scale is None:
            scale = DEPTH_SCALE if param == "mupc" and not plain else 1.0
        scale = parse_scale(scale) if isinstance(scale, str) else float(scale)
        act = activation_name(act)
        D, N, L = n_features, width, depth + 1
        self.depth, self.width, self.param, self.plain, self.nodes_kind = depth, width, param, bool(plain), nodes
        self.scale = 1.0 / math.sqrt(L) if scale == DEPTH_SCALE else scale
        self.skip = not plain
        mupc, edge = param == "mupc", nodes == "stream"
        a_in, a_hidden, a_out = (1 / math.sqrt(D), self.scale / math.sqrt(N), 1 / N) if mupc else (1.0, self.scale, 1.0)
        self.flatten = nn.Flatten()
        self.input = ScaledBranch(nn.Identity(), D, N, a_in)
        self.blocks = nn.ModuleList(ScaledBranch(make_activation(act), N, N, a_hidden, edge) for _ in range(depth - 1))
        self.readout = ScaledBranch(make_activation(act), N, n_classes, a_out, edge)
        self.nodes = nn.ModuleList((Clamp("linear") if edge else nn.Identity()) for _ in range(depth))
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int | None = 0) -> None:
        """``W ~ N(0, 1)`` (``mupc``) or ``N(0, 1/fan_in)`` (``sp``), in layer order, from ``seed``."""
        gen = generator(seed)
        for branch in (self.input, *self.blocks, self.readout):
            w = branch.linear.weight
            fill_normal_(w, 1.0 if self.param == "mupc" else 1.0 / math.sqrt(w.shape[1]), gen)

    @property
    def multipliers(self) -> list[float]:
        """``[a_1, a_2, …, a_H, a_L]``."""
        return [b.multiplier for b in (self.input, *self.blocks, self.readout)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.nodes[0](self.input(self.flatten(x)))
        for block, node in zip(self.blocks, self.nodes[1:]):
            h = node(h + block(h)) if self.skip else node(block(h))
        return self.readout(h)

    def extra_repr(self) -> str:
        return (f"depth={self.depth}, width={self.width}, param={self.param}, scale={self.scale:.6g}, "
                f"plain={self.plain}, nodes={self.nodes_kind}")


def resmlp(image_shape: Sequence[int], n_classes: int, **options) -> ResidualMLP:
    """``--arch resmlp:…``: a :class:`ResidualMLP` on flattened images (options as its arguments)."""
    return ResidualMLP(math.prod(int(s) for s in image_shape), n_classes, **options)
