"""The sequential reader: an ``nn.Sequential`` (nested ones flattened), a module with ``inferlearn_chain()``, or one
layer, read as a chain ``x → A_1 → C_1 → A_2 → C_2 → … → A_L``.

Consecutive maps without a unit between them form one layer map (e.g. ``AvgPool2d → Conv2d`` or
``Flatten → Linear``), so the value nodes ``z_k`` sit exactly after the units. The **chain protocol**: a method
``inferlearn_chain(self) -> Sequence[nn.Module]`` returning the modules in the order ``forward`` applies them
(the library's :class:`~inferlearn.models.MLP` has one). A composite module the reader cannot read as a map or a
unit (a residual block) raises :class:`NotAChain`, and the model is traced instead
(:mod:`~inferlearn.engine.graph.tracing`).
"""
from __future__ import annotations

from torch import nn

from ...units import units_of_module
from .types import is_activation, DROPOUT_TYPES, NORM_TYPES, SMOOTH_TYPES, Graph, Node, check_single_use, is_affine


def _leaves(module: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    """The modules of a chain in order, with their dotted paths (Sequentials and protocols expanded)."""
    protocol = _chain_protocol(module)
    if callable(protocol):
        items = list(protocol())
        if not all(isinstance(m, nn.Module) for m in items):
            raise TypeError(f"{type(module).__name__}.inferlearn_chain() must return nn.Module objects")
        named = {id(m): n for n, m in module.named_modules()}
        out = []
        for i, m in enumerate(items):
            sub = named.get(id(m), f"inferlearn_chain()[{i}]")
            out += _leaves(m, f"{path}.{sub}" if path else sub) if m is not module else [(path, m)]
        return out
    if isinstance(module, nn.Sequential):
        out = []
        for name, m in module._modules.items():   # every use (named_children() skips a repeated module)
            out += _leaves(m, f"{path}.{name}" if path else name)
        return out
    return [(path or type(module).__name__, module)]


def _chain_protocol(module: nn.Module):
    """``module.inferlearn_chain`` or ``None``, looked up on the class first: a plain ``getattr`` that misses on an
    ``nn.Module`` goes through its ``__getattr__`` and an exception, once per leaf on every rule call."""
    if getattr(type(module), "inferlearn_chain", None) is not None or "inferlearn_chain" in module.__dict__:
        return getattr(module, "inferlearn_chain")
    return None


def leaf_ids(module: nn.Module) -> list:
    """``[id(m) for _, m in _leaves(module, "")]`` without the paths (no ``named_modules`` walk): the cache check
    that runs on every rule call."""
    protocol = _chain_protocol(module)
    if callable(protocol):
        out = []
        for m in protocol():
            out += [id(m)] if m is module or not isinstance(m, nn.Module) else leaf_ids(m)
        return out
    if isinstance(module, nn.Sequential):
        out = []
        for m in module._modules.values():
            out += leaf_ids(m)
        return out
    return [id(module)]


def read_sequential(model: nn.Module) -> Graph:
    leaves = _leaves(model, "")
    if not leaves:
        raise ValueError(f"{type(model).__name__} has no layers")
    check_single_use(leaves)
    links: list[Node] = []
    maps: list[nn.Module] = []
    names: list[str] = []
    for name, m in leaves:
        units = units_of_module(m)
        if is_activation(m):
            if not maps:
                where = "starts the model" if not links else f"follows another activation ({links[-1].names[-1]!r})"
                raise ValueError(f"Activation {name!r} ({type(m).__name__}) {where}; a chain alternates layer maps "
                                 "and units (x → map → unit → map → … → map)")
            links.append(Node.of_chain(len(links), maps, m, units, names))
            maps, names = [], []
        elif is_affine(m) or isinstance(m, SMOOTH_TYPES + NORM_TYPES + DROPOUT_TYPES):
            maps.append(m)
            names.append(name)
        else:
            if any(True for _ in m.children()) or m is model:
                raise NotAChain(name)   # a composite module (a residual block, ...): read the model as a graph
            raise ValueError(f"Module {name!r} ({type(m).__name__}) is neither a layer map nor a unit the engine "
                             "knows. Supported: Linear, Conv, AvgPool, MaxPool, Flatten, normalisation layers and "
                             "element-wise activations; expose your model's chain with an inferlearn_chain() method, "
                             "or declare an affine module with inferlearn.declare_affine")
    if maps:
        links.append(Node.of_chain(len(links), maps, None, None, names))
    return Graph(model, links, [m for _, m in leaves])


class NotAChain(Exception):
    """The chain reader met a module it cannot read as a map or unit: read the model by tracing instead."""


def is_chain_leaf(m: nn.Module) -> bool:
    return is_activation(m) or is_affine(m) or isinstance(
        m, SMOOTH_TYPES + NORM_TYPES + DROPOUT_TYPES)
