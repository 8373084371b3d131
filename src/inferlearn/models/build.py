"""From an architecture string (``--arch``) to a model: MLP widths, ``conv:…``, the zoo, or your own builder."""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import InferlearnWarning
from ..units import Box
from .conv import conv_net, parse_conv_arch
from .mlp import MLP, parse_arch
from .zoo import ZOO, zoo_entry

ARCH_FORMS = (f"MLP widths (784-64-10), conv:16-32/64, a zoo model ({', '.join(ZOO)}, with NAME:KEY=VALUE,... "
              "options) or package.module:function")


def _kind(arch: str) -> str:
    """``"zoo"``, ``"conv"``, ``"builder"`` or ``"mlp"``; refuses a name that is none of them."""
    if zoo_entry(arch) is not None:
        return "zoo"
    if arch.startswith("conv:"):
        return "conv"
    name, colon, rest = arch.partition(":")
    if colon and "=" not in rest and "," not in rest:
        return "builder"
    if colon or not arch.strip()[:1].isdigit():
        raise ValueError(f"Unknown architecture {arch!r}: expected {ARCH_FORMS}")
    return "mlp"


# oneDNN's AVX2 1×1-convolution kernel blocks input channels by 8; with a strided 1×1 convolution on fewer
# channels in the NHWC layout, its backward-weights pass writes past its workspace (uxlfoundation/oneDNN#6035)
ONEDNN_1X1_IC_BLOCK = 8


def strided_1x1_conv_on_few_channels(model: nn.Module) -> str | None:
    """The name of the first convolution that channels-last would send into oneDNN's faulty kernel (1×1 kernel,
    stride > 1, fewer than 8 input channels), or ``None``.

    In the NHWC layout on an AVX2 CPU, oneDNN's backward-weights pass of such a layer corrupts the heap at one
    thread (the process dies) and returns wrong weight gradients at more (relative error 6e-3 measured at 3 input
    channels, 2 threads); in NCHW the same layer takes a blocked-layout kernel that is right."""
    for name, m in model.named_modules():
        if (isinstance(m, nn.Conv2d) and tuple(m.kernel_size) == (1, 1) and max(m.stride) > 1
                and m.in_channels // m.groups < ONEDNN_1X1_IC_BLOCK):
            return name
    return None


def channels_last(model: nn.Module) -> nn.Module:
    """``model`` with its 4-d parameters (conv kernels) in the channels-last layout (NHWC), in place.

    A conv layer whose kernel is channels-last gives channels-last outputs, so every activation, value node
    and error of an inference rule follows; on CPU this is faster for convolutions and several times faster
    for max pooling (PyTorch's NCHW max pooling is its slow path), the same numbers up to float rounding.
    A model without 4-d parameters is returned unchanged, and so is one with a strided 1×1 convolution on
    fewer than 8 channels (a narrow ResNet's shortcut), whose NHWC backward oneDNN computes wrongly or crashes
    on (:func:`strided_1x1_conv_on_few_channels`): it stays NCHW, slower but right.
    """
    if any(p.dim() == 4 for p in model.parameters()) and strided_1x1_conv_on_few_channels(model) is None:
        model.to(memory_format=torch.channels_last)
    return model


def nchw_where_onednn_fails(model: nn.Module, arch: str) -> nn.Module:
    """``model`` (a user's builder's) moved to NCHW, with a warning, when it has a convolution that
    :func:`strided_1x1_conv_on_few_channels` names and a kernel in the channels-last layout: fed channels-last
    activations, oneDNN would compute that layer's weight gradient wrongly or crash (uxlfoundation/oneDNN#6035).
    The layout is read from the kernels' strides, which the move changes (``is_contiguous`` cannot tell: a kernel
    with one input channel or a 1×1 one is contiguous in both layouts). Any other model is returned as it is."""
    name = strided_1x1_conv_on_few_channels(model)
    if name is None:
        return model
    strides = [p.stride() for p in model.parameters()]
    model.to(memory_format=torch.contiguous_format)
    if strides != [p.stride() for p in model.parameters()]:
        warnings.warn(f"Model builder {arch!r}: the model is channels-last and its convolution {name!r} is 1×1 with "
                      f"stride > 1 on fewer than {ONEDNN_1X1_IC_BLOCK} input channels, whose weight gradient oneDNN "
                      "computes wrongly or crashes on in that layout (uxlfoundation/oneDNN#6035); the model is moved "
                      "to NCHW (return it in NCHW to silence this)", InferlearnWarning, stacklevel=3)
    return model


def build_model(arch: str, units: str | Box, n_features: int, n_classes: int, image_shape: Sequence[int],
                seed: int = 0, init_scale: float = 1.0, data_name: str = "the data") -> nn.Module:
    """The model an architecture string describes.

    * ``784-64-64-10``: an :class:`~inferlearn.models.MLP` (the widths must start with the inputs and end with
      the classes);
    * ``conv:16-32`` or ``conv:16-32/64``: :func:`~inferlearn.models.conv_net` with conv channels ``16, 32``
      and optional dense hidden widths after ``/``;
    * a zoo model, ``vgg5`` or ``vgg5:width=0.5,pool=avg`` (:mod:`inferlearn.models.zoo`): its input shape
      and classes come from the data, ``units`` is its default activation, ``seed`` seeds it;
    * ``package.module:function``: your own model (used as it is, but moved to NCHW where oneDNN's channels-last
      kernel would get it wrong: :func:`nchw_where_onednn_fails`), ``function()`` returning an ``nn.Module`` (seeded
      with ``seed`` before the call). Rules accept it when the engine can read it (:mod:`inferlearn.engine`).

    Raises:
        ValueError: a malformed string, an unknown zoo model, option or value, widths that do not fit the
            data, ``init_scale`` other than 1 for a zoo model (each has its own initialisation), a function
            that cannot be imported or does not return an ``nn.Module``.

    Conv models of the zoo and ``conv:`` strings come in the channels-last memory layout (:func:`channels_last`).
    """
    kind = _kind(arch)
    if kind == "zoo":
        if init_scale != 1.0:
            raise ValueError(f"--init-scale {init_scale} applies to MLP architectures; zoo model {arch!r} has its "
                             "own initialisation (leave --init-scale at 1)")
        act = units.name if isinstance(units, Box) else units
        return channels_last(zoo_entry(arch).build(arch.partition(":")[2], image_shape, n_classes, act=act, seed=seed))
    if kind == "conv":
        channels, hidden = parse_conv_arch(arch)
        return channels_last(conv_net(image_shape, channels, hidden, n_classes, units, seed=seed))
    if kind == "builder":
        import importlib

        module_name, _, func_name = arch.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"Cannot load model builder {arch!r}: {e}") from None
        torch.manual_seed(seed)
        model = fn()
        if not isinstance(model, nn.Module):
            raise ValueError(f"Model builder {arch!r} returned {type(model).__name__}, not an nn.Module")
        return nchw_where_onednn_fails(model, arch)
    sizes = parse_arch(arch)
    if sizes[0] != n_features or sizes[-1] != n_classes:
        raise ValueError(f"Architecture {arch} does not fit {data_name}: inputs have {n_features} features "
                         f"and there are {n_classes} classes (e.g. {n_features}-64-{n_classes})")
    return MLP(sizes, units, seed=seed, init_scale=init_scale)


def check_arch(arch: str) -> str:
    """Validate an architecture string's syntax and a zoo model's options (without the data): see
    :func:`build_model`."""
    kind = _kind(arch)
    if kind == "zoo":
        zoo_entry(arch).parse_options(arch.partition(":")[2])
    elif kind == "conv":
        parse_conv_arch(arch)
    elif kind == "builder":
        module_name, _, func_name = arch.partition(":")
        if not module_name or not func_name.isidentifier():
            raise ValueError(f"Invalid model builder {arch!r}: expected 'package.module:function'")
    else:
        parse_arch(arch)
    return arch
