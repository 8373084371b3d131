"""The model zoo: the field's benchmark networks by name, with ``NAME:KEY=VALUE,…`` options.

``--arch vgg5``, ``--arch vgg5:width=1/8,pool=avg,act=relu``, ``--arch resnet20:width=0.5,bn=eval``,
``--arch resmlp:depth=64,width=128,param=mupc``. Options not given take the builder's defaults; ``act``
defaults to ``--act``. An unknown name, option or value is refused in one line that names it and lists
the choices.

| name       | model (builder)                                             | options                               |
|------------|-------------------------------------------------------------|---------------------------------------|
| `pcx-mlp`  | PCX's MLP (:func:`~inferlearn.models.pcx_mlp.pcx_mlp`)       | `width`, `depth`, `act`               |
| `vgg5`     | PCX's VGG-5 (:func:`~inferlearn.models.vgg.vgg5`)            | `width`, `pool`, `act`                |
| `vgg7`     | PCX's VGG-7 (:func:`~inferlearn.models.vgg.vgg7`)            | `width`, `pool`, `act`                |
| `resnet20` | CIFAR ResNet-20 (:func:`~inferlearn.models.resnet.resnet20`) | `width`, `bn`, `shortcut`, `act`      |
| `resnet18` | CIFAR ResNet-18 (:func:`~inferlearn.models.resnet.resnet18`) | `width`, `bn`, `shortcut`, `act`      |
| `resmlp`   | residual MLP (:func:`~inferlearn.models.residual_mlp.resmlp`) | `depth`, `width`, `param`, `scale`, `plain`, |
|            | in the standard or μPC parameterisation                      | `nodes`, `act`                        |
| `vit`      | vision transformer (:func:`~inferlearn.models.vit.vit`)      | `depth`, `width`, `heads`, `patch`,   |
|            |                                                             | `pool`, `act`                         |

Every zoo model is a plain ``nn.Module`` that ``torch.fx.symbolic_trace`` traces (no data-dependent
control flow, one activation module per use, residual sums written with ``+``) and is seeded by ``seed``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from .activations import ACTIVATIONS, activation_name
from .pcx_mlp import pcx_mlp
from .residual_mlp import DEPTH_SCALE, NODES, PARAMS, parse_scale, resmlp
from .resnet import BN_MODES, SHORTCUTS, resnet18, resnet20
from .vgg import POOLS, vgg5, vgg7
from .vit import TOKEN_POOLS, vit


@dataclass(frozen=True)
class Option:
    """One ``KEY=VALUE`` option: ``parse`` turns the text into the builder's argument (``ValueError`` if
    invalid); ``expected`` says what is accepted; a ``flag`` may be given bare (``plain``)."""

    parse: Callable[[str], object]
    expected: str
    flag: bool = False


def _number(text: str) -> float:
    num, _, den = text.partition("/")
    try:
        return float(num) / (float(den) if den else 1.0)
    except (ValueError, ZeroDivisionError):
        return math.nan


def _positive_number(text: str) -> float:
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def _choice(values: Sequence[str]) -> Option:
    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError
        return text.lower()
    return Option(parse, f"one of {', '.join(values)}")


_BOOLEANS = {"": True, "true": True, "on": True, "yes": True, "1": True,
             "false": False, "off": False, "no": False, "0": False}


def _boolean(text: str) -> bool:
    return _BOOLEANS[text.lower()]


WIDTH_MULTIPLIER = Option(_positive_number, "a positive channel multiplier, e.g. 0.5 or 1/8")
HIDDEN_WIDTH = Option(_positive_int, "a positive integer")
DEPTH = Option(_positive_int, "a positive integer (hidden layers)")
ACT = Option(activation_name, f"one of {', '.join(ACTIVATIONS)}")


@dataclass(frozen=True)
class ZooModel:
    """A named zoo entry: ``builder(image_shape, n_classes, seed=…, **options)`` and its options."""

    name: str
    builder: Callable[..., nn.Module]
    options: Mapping[str, Option]
    summary: str

    def parse_options(self, text: str) -> dict:
        """``"width=0.5,pool=avg"`` → ``{"width": 0.5, "pool": "avg"}``; refuses anything else in one line."""
        out: dict = {}
        for item in text.split(",") if text.strip() else []:
            key, eq, value = (s.strip() for s in item.partition("="))
            key = key.lower()
            if key not in self.options:
                shown = key or item.strip() or "''"
                raise ValueError(f"Unknown option {shown!r} for {self.name}; choose from {', '.join(self.options)} "
                                 f"(e.g. {self.name}:{next(iter(self.options))}=...)")
            if key in out:
                raise ValueError(f"Option {key!r} given twice in {self.name}:{text}")
            option = self.options[key]
            if not eq and not option.flag:
                raise ValueError(f"Option {key!r} of {self.name} needs a value: {key}=VALUE, {option.expected}")
            try:
                out[key] = option.parse(value)
            except (ValueError, KeyError):
                raise ValueError(f"Invalid {self.name} option {key}={value!r}: expected {option.expected}") from None
        return out

    def build(self, options: str, image_shape: Sequence[int], n_classes: int, act: str = "relu",
              seed: int | None = 0) -> nn.Module:
        """The model for ``options`` (the text after ``name:``) on inputs of ``image_shape``; ``act`` is the
        default activation (``--act``) when the options do not set one."""
        kwargs = self.parse_options(options)
        if "act" in self.options and "act" not in kwargs:
            kwargs["act"] = activation_name(act)
        return self.builder(tuple(int(s) for s in image_shape), int(n_classes), seed=seed, **kwargs)


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("pcx-mlp", pcx_mlp, {"width": HIDDEN_WIDTH, "depth": DEPTH, "act": ACT},
             "PCX's benchmark MLP, 3 hidden layers of 128"),
    ZooModel("vgg5", vgg5, {"width": WIDTH_MULTIPLIER, "pool": _choice(tuple(POOLS)), "act": ACT},
             "PCX's VGG-5 (conv 128-256-512-512)"),
    ZooModel("vgg7", vgg7, {"width": WIDTH_MULTIPLIER, "pool": _choice(tuple(POOLS)), "act": ACT},
             "PCX's VGG-7 (conv 128-128-256-256-512-512)"),
    ZooModel("resnet20", resnet20, {"width": WIDTH_MULTIPLIER, "bn": _choice(BN_MODES),
                                    "shortcut": _choice(SHORTCUTS), "act": ACT},
             "He et al.'s CIFAR ResNet-20 (16/32/64 channels)"),
    ZooModel("resnet18", resnet18, {"width": WIDTH_MULTIPLIER, "bn": _choice(BN_MODES),
                                    "shortcut": _choice(SHORTCUTS), "act": ACT},
             "CIFAR-style ResNet-18 (64-128-256-512)"),
    ZooModel("resmlp", resmlp, {"depth": DEPTH, "width": HIDDEN_WIDTH, "param": _choice(PARAMS),
                                "scale": Option(parse_scale, f"a positive number or {DEPTH_SCALE}"),
                                "plain": Option(_boolean, "true or false (bare 'plain' is true)", flag=True),
                                "nodes": _choice(NODES), "act": ACT},
             "residual MLP for depth studies (SP or muPC)"),
    ZooModel("vit", vit, {"depth": Option(_positive_int, "a positive integer (transformer blocks)"),
                          "width": Option(_positive_int, "a positive integer (the token dimension)"),
                          "heads": Option(_positive_int, "a positive integer dividing width"),
                          "patch": Option(_positive_int, "a positive integer dividing the image's side"),
                          "pool": _choice(TOKEN_POOLS), "act": ACT},
             "vision transformer (pre-norm; 4 blocks of width 64 on 4x4 patches)"),
)}


def zoo_entry(arch: str) -> ZooModel | None:
    """The zoo entry an architecture string names (``"vgg5:width=0.5"`` → ``vgg5``), or ``None``."""
    return ZOO.get(arch.partition(":")[0].strip().lower())


def build_zoo_model(arch: str, image_shape: Sequence[int], n_classes: int, act: str = "relu",
                    seed: int | None = 0) -> nn.Module:
    """Build ``NAME[:KEY=VALUE,…]`` from the zoo.

    Raises:
        ValueError: an unknown name, option or value, or inputs the model cannot take.
    """
    entry = zoo_entry(arch)
    if entry is None:
        raise ValueError(f"Unknown zoo model {arch.partition(':')[0]!r}; choose one of {', '.join(ZOO)}")
    return entry.build(arch.partition(":")[2], image_shape, n_classes, act=act, seed=seed)
