"""Batch-coupled and random layers inside an inference rule's predictions: BatchNorm in training mode and dropout.

Predictive coding and ePC (the rules with ``batch_layers = True``) read both; the other energy rules refuse them in
one line naming the module (:meth:`~inferlearn.engine.graph.Graph.check_structure`).

* **BatchNorm in training mode** normalises by the statistics of the batch, so a sample's prediction depends on
  the other samples' value nodes. The energy is a sum over the batch, ``E = Σ_i E_i(z)``, and the engine's value-node
  gradients are vector–Jacobian products of the whole batch's predictions, so the coupling is exact: inference
  minimises the batch's energy jointly. The running statistics are updated **once per batch**, by one forward pass
  before inference (the statistics back-propagation's forward pass records), not at each of the inference steps,
  which evaluate the predictions with the batch's statistics and leave the running ones alone.
* **Dropout** draws **one mask per batch** at its first evaluation and holds it through inference and the weight
  gradient: the batch trains one random sub-network, as back-propagation's forward and backward passes share one
  mask. A new batch draws a new mask. ``nn.Dropout`` masks elements, ``nn.Dropout1d/2d/3d`` whole channels.

Both are active only in training mode (``model.train()``); in evaluation mode the layers are the fixed maps they
are for every rule.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..engine.graph import DROPOUT_TYPES


class _FixedMask:
    """A dropout module's forward with one mask per input shape, drawn at the first call (scaled by ``1/(1 − p)``)."""

    def __init__(self, module: nn.Module):
        self.module, self.masks = module, {}

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        key = (tuple(z.shape), z.dtype, z.device)
        mask = self.masks.get(key)
        if mask is None:
            keep = 1.0 - self.module.p
            shape = z.shape if type(self.module) is nn.Dropout else (*z.shape[:2], *([1] * (z.dim() - 2)))
            mask = self.masks[key] = torch.empty(shape, dtype=z.dtype, device=z.device).bernoulli_(keep).div_(keep)
        return z * mask


@contextlib.contextmanager
def batch_layers(model: nn.Module, x: torch.Tensor):
    """Within the block, ``model``'s dropout modules in training mode hold one mask per batch and its BatchNorm modules
    in training mode use the batch's statistics without updating the running ones, which one forward pass on ``x``
    updates first (module docstring). Restores the modules on exit."""
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.training and m.track_running_stats]
    drops = [m for m in model.modules() if isinstance(m, DROPOUT_TYPES) and m.training and m.p > 0]
    if not norms and not drops:
        yield
        return
    for m in drops:
        m.forward = _FixedMask(m)   # an instance attribute: nn.Module.__call__ uses it
    try:
        if norms:
            with torch.no_grad():
                model(x)   # the running statistics, once (and the masks, drawn on the forward pass)
            for m in norms:
                m.track_running_stats = False
        yield
    finally:
        for m in norms:
            m.track_running_stats = True
        for m in drops:
            del m.forward
