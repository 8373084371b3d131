"""Models: MLPs and small conv nets from architecture strings, and the zoo of benchmark networks.

* :mod:`~inferlearn.models.mlp`: :class:`MLP` (``784-64-64-10``), :func:`parse_arch`, :func:`format_arch`;
* :mod:`~inferlearn.models.conv`: :func:`conv_net` (``conv:16-32/64``);
* :mod:`~inferlearn.models.zoo`: the benchmark networks by name (``vgg5:width=0.5,pool=avg``): PCX's MLP
  and VGG-5/7 (:mod:`~inferlearn.models.pcx_mlp`, :mod:`~inferlearn.models.vgg`), CIFAR ResNet-20/18
  (:mod:`~inferlearn.models.resnet`) and a residual MLP in the standard or μPC parameterisation
  (:mod:`~inferlearn.models.residual_mlp`);
* :mod:`~inferlearn.models.build`: :func:`build_model` and :func:`check_arch`, what ``--arch`` calls.
"""
from .activations import ACTIVATIONS, make_activation
from .build import build_model, check_arch
from .conv import conv_net, parse_conv_arch
from .mlp import MLP, all_finite, format_arch, has_only_finite, parse_arch
from .pcx_mlp import pcx_mlp
from .residual_mlp import ResidualMLP, ScaledBranch
from .resnet import BasicBlock, EvalBatchNorm2d, PadShortcut, ResNet, resnet18, resnet20
from .vgg import VGG, vgg5, vgg7
from .zoo import ZOO, ZooModel, build_zoo_model

__all__ = ["ACTIVATIONS", "MLP", "VGG", "ZOO", "BasicBlock", "EvalBatchNorm2d", "PadShortcut", "ResNet",
           "ResidualMLP", "ScaledBranch", "ZooModel", "build_model", "build_zoo_model", "check_arch", "conv_net",
           "all_finite", "format_arch", "has_only_finite", "make_activation", "parse_arch", "parse_conv_arch", "pcx_mlp",
           "resnet18", "resnet20", "vgg5", "vgg7"]
