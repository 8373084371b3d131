"""Seeded weight initialisation of the model zoo.

Every draw comes from one CPU ``torch.Generator`` seeded with the model's ``seed``, in float64, in the
order the modules are registered, and is then copied into the parameter: the same seed gives the same
network on every device and dtype, whatever the state of torch's global generator (as
:meth:`inferlearn.models.MLP.reset_parameters`). ``seed=None`` draws from the global generator instead.
"""
from __future__ import annotations

import math

import torch
from torch import nn

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with ``seed`` (``None``: torch's global generator)."""
    return torch.Generator().manual_seed(int(seed)) if seed is not None else None


def fan_in(module: nn.Module) -> int:
    """Inputs of one output unit of a ``Linear`` or ``Conv`` layer (``in_channels · kernel size``)."""
    return module.weight[0].numel()


@torch.no_grad()
def fill_normal_(p: torch.Tensor, std: float, gen: torch.Generator | None) -> None:
    """``p ~ N(0, std²)``."""
    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)


@torch.no_grad()
def fill_uniform_(p: torch.Tensor, bound: float, gen: torch.Generator | None) -> None:
    """``p ~ U(−bound, bound)``."""
    p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound)


def default_init_(model: nn.Module, gen: torch.Generator | None) -> None:
    """PyTorch's (and Equinox's) default for every ``Linear`` and ``Conv`` of ``model``: weights and biases
    ``U(−1/√fan_in, 1/√fan_in)`` -- the initialisation PCX's benchmark networks start from."""
    for m in model.modules():
        if isinstance(m, WEIGHTED):
            bound = 1.0 / math.sqrt(fan_in(m))
            fill_uniform_(m.weight, bound, gen)
            if m.bias is not None:
                fill_uniform_(m.bias, bound, gen)
