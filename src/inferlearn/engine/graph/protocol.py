"""The graph protocol: a model that fx cannot trace describes its graph itself, by a method
``inferlearn_graph(self)`` returning :class:`NodeSpec` objects in topological order (node ``i`` is the ``i``-th,
1-based; source 0 is the input; the last node is the output)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ...units import units_of_module
from .types import is_activation, Edge, JointEdge, JointMap, Node, check_graph, is_map


@dataclass
class NodeSpec:
    """One node of the graph protocol (``inferlearn_graph()``).

    Attributes:
        inputs: ``(source, maps)`` pairs: the node's pre-activation is the sum over pairs of ``maps``
            (a module, a sequence of modules applied in order, or ``()`` for the identity) applied to the
            value of node ``source`` (0 = the input, ``i`` = the ``i``-th node, 1-based). A pair
            ``((s1, s2, …), module)`` is a joint map ``module(z_{s1}, z_{s2}, …)`` of several nodes (attention, a
            gate): any differentiable module taking one tensor per source, which the lifted energies refuse.
        unit: the activation after the sum (``None``: a linear node, e.g. the output).
    """

    inputs: Sequence[tuple[int, nn.Module | Sequence[nn.Module]]]
    unit: nn.Module | None = None


def protocol_graph(model: nn.Module) -> list[Node]:
    """The nodes of a model with an ``inferlearn_graph()`` method (:class:`NodeSpec` objects)."""
    items = list(model.inferlearn_graph())
    who = type(model).__name__
    named = {id(m): n for n, m in model.named_modules()}
    links = []
    for k, item in enumerate(items, start=1):
        if not isinstance(item, NodeSpec):
            raise TypeError(f"{who}.inferlearn_graph() must return inferlearn.NodeSpec objects (item {k} is "
                            f"{type(item).__name__})")
        edges = []
        for pair in item.inputs:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"{who}.inferlearn_graph(): node {k}'s inputs must be (source, maps) pairs")
            source, maps = pair
            if isinstance(source, (tuple, list)):
                edges.append(_joint_edge(who, k, tuple(source), maps, named))
                continue
            maps = (maps,) if isinstance(maps, nn.Module) else tuple(maps)
            if not all(isinstance(m, nn.Module) for m in maps):
                raise TypeError(f"{who}.inferlearn_graph(): node {k}'s maps must be nn.Module objects")
            for m in maps:
                if not is_map(m) and not isinstance(m, nn.Identity):
                    raise ValueError(f"{who}.inferlearn_graph(): node {k} uses {type(m).__name__} as a map; maps are "
                                     "Linear, Conv, pooling, Flatten, normalisation, or modules declared with "
                                     "inferlearn.declare_affine / inferlearn.declare_map")
            names = tuple(named.get(id(m), f"inferlearn_graph()[{k - 1}]") for m in maps)
            edges.append(Edge(source, maps, names))
        unit = item.unit
        if unit is not None and not (is_activation(unit)):
            raise ValueError(f"{who}.inferlearn_graph(): node {k}'s unit {type(unit).__name__} is not an activation")
        links.append(Node(tuple(edges), unit, units_of_module(unit) if unit is not None else None))
    check_graph(model, links)
    return links


def _joint_edge(who: str, k: int, sources: tuple, module, named: dict) -> JointEdge:
    """The joint map ``module(z_{sources[0]}, …)`` of a :class:`NodeSpec` pair ``(sources, module)``."""
    if not sources or len(set(sources)) != len(sources) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in sources):
        raise TypeError(f"{who}.inferlearn_graph(): node {k}'s joint sources must be distinct node indices, "
                        f"got {sources!r}")
    if not isinstance(module, nn.Module):
        raise TypeError(f"{who}.inferlearn_graph(): node {k}'s joint map must be one nn.Module taking {len(sources)} "
                        f"tensors, got {type(module).__name__}")
    name = named.get(id(module), f"inferlearn_graph()[{k - 1}]")
    return JointEdge(sources, JointMap(lambda values: module(*values), (module,), name), (module,), (name,))
