"""Activation names of the model zoo (``act=…``), each made as a fresh module per use.

A model holds one activation *module* per place it is applied (never ``F.relu``), so that a traced graph
(:mod:`inferlearn.engine.graph`) sees each use as its own unit. The box units of ``--act``
(``relu``, ``hard-tanh``, ``hard-sigmoid``, ``linear``) map to modules the lifted energies recognise as box
projections (:func:`inferlearn.units.units_of_module`); the smooth ones (``gelu``, ``tanh``, ...) suit
predictive coding, back-propagation and Fenchel back-propagation.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..units import Clamp

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "hard-tanh": nn.Hardtanh,                       # clamp to [-1, 1] (JAX's hard_tanh)
    "hard-sigmoid": lambda: Clamp("hard-sigmoid"),  # clamp to [0, 1], the library's unit (not nn.Hardsigmoid)
    "linear": lambda: Clamp("linear"),
    "gelu": lambda: nn.GELU(approximate="tanh"),    # JAX's gelu default, which PCX's benchmarks use
    "tanh": nn.Tanh,
    "leaky-relu": nn.LeakyReLU,                     # slope 0.01, as JAX's leaky_relu
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
    "elu": nn.ELU,
}

_ALIASES = {"hardtanh": "hard-tanh", "hardsigmoid": "hard-sigmoid", "identity": "linear", "none": "linear",
            "leakyrelu": "leaky-relu"}


def activation_name(name: str) -> str:
    """The canonical spelling of an activation name (``hard_tanh`` → ``hard-tanh``).

    Raises:
        ValueError: an unknown name (the message lists the choices).
    """
    key = str(name).strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")
    return key


def make_activation(name: str) -> nn.Module:
    """A new activation module for ``name`` (see :data:`ACTIVATIONS`)."""
    return ACTIVATIONS[activation_name(name)]()
