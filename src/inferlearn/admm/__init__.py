"""Stochastic block-ADMM: split a network into blocks joined by decoupling variables (batch and online).

* :mod:`.blocks` -- building and splitting ``nn.Sequential`` networks into blocks;
* :mod:`.trainer` -- :class:`BlockADMM` (augmented Lagrangian, per-sample ``Z_t``/``U_t``) and its run loop;
* :mod:`.nmf` -- the non-differentiable NMF layer of DeepFacto.
"""
from .blocks import check_blocks, conv_net, default_split_points, forward_blocks, mlp, split_sequential
from .nmf import NMF
from .trainer import ADMMConfig, BlockADMM, RunData, random_shift, train_admm

__all__ = ["ADMMConfig", "BlockADMM", "NMF", "RunData", "check_blocks", "conv_net", "default_split_points",
           "forward_blocks", "mlp", "random_shift", "split_sequential", "train_admm"]
