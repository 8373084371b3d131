"""Stochastic block-ADMM: split a network into blocks joined by decoupling variables (batch and online).

* :mod:`.blocks` -- building and splitting ``nn.Sequential`` networks into blocks;
* :mod:`.config` -- :class:`ADMMConfig`, the hyper-parameters;
* :mod:`.state` -- the per-sample ``Z_t``/``U_t`` (in memory or memory-mapped);
* :mod:`.trainer` -- :class:`BlockADMM`, the algorithm (augmented Lagrangian, batch mode; :mod:`.online` the online
  mode), which holds a :mod:`.placement` (every block here, or runs of blocks over ranks: :mod:`.parallel`);
* :mod:`.run` -- :func:`train_admm`, the run loop with run folders and resume;
* :mod:`.nmf` -- the non-differentiable NMF layer of DeepFacto.
"""
from .blocks import check_blocks, conv_net, default_split_points, forward_blocks, mlp, split_sequential
from .nmf import NMF
from .config import ADMMConfig
from .placement import LocalBlocks
from .run import RunData, evaluate, random_shift, train_admm
from .trainer import BlockADMM

__all__ = ["ADMMConfig", "BlockADMM", "LocalBlocks", "NMF", "RunData", "evaluate", "check_blocks", "conv_net", "default_split_points",
           "forward_blocks", "mlp", "random_shift", "split_sequential", "train_admm"]
