"""PCX's benchmark MLP: three hidden layers of 128 units (``784-128-128-128-10`` on MNIST)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from .activations import activation_name, make_activation
from .init import default_init_, generator


def pcx_mlp(image_shape: Sequence[int], n_classes: int, width: int = 128, depth: int = 3, act: str = "relu",
            seed: int | None = 0) -> nn.Sequential:
    """The MLP of PCX's discriminative benchmarks (``--arch pcx-mlp``): ``Flatten``, then ``depth`` hidden layers
    ``Linear → act`` of ``width`` units, then ``Linear`` to the classes. On MNIST and Fashion-MNIST:
    ``784-128-128-128-10``, 134,794 parameters.

    A plain ``nn.Sequential`` (read as a chain by every rule). PCX tuned the activation per method and data set
    (GELU for most PC runs, hard tanh or leaky ReLU for others); ``act`` defaults to ``--act``.

    Args:
        image_shape: shape of one input (flattened: the model takes flat rows or images).
        n_classes: outputs.
        width: hidden width (PCX: 128).
        depth: hidden layers (PCX: 3, i.e. four ``Linear`` layers).
        act: activation name (:mod:`inferlearn.models.activations`), one module per layer.
        seed: seed of the initialisation: PyTorch's (and Equinox's, PCX's) default, weights and biases
            ``U(−1/√fan_in, 1/√fan_in)``.

    References:
        Pinchetti et al., *Benchmarking predictive coding networks -- made simple* (2024, arXiv:2407.01163),
        Section 4.1; ``LinearModel(input_dim=784, hidden_dim=128, nm_layers=4, output_dim=10)`` in its experiment
        code (github.com/liukidar/pcax, release v0.6.1, ``examples/s4_1_discriminative_mode/MLP``).
    """
    for name, v in (("width", width), ("depth", depth)):
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"Invalid {name}: {v} (a positive integer)")
    act = activation_name(act)
    n_in = math.prod(int(s) for s in image_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for _ in range(depth):
        layers += [nn.Linear(n_in, width), make_activation(act)]
        n_in = width
    model = nn.Sequential(*layers, nn.Linear(n_in, n_classes))
    default_init_(model, generator(seed))
    return model
