"""The graph types the engine reads a model into: :class:`Graph` of :class:`Node` objects joined by :class:`Edge` maps.

A node's pre-activation is the sum of its incoming maps, ``a_k = Σ_e A_e(z_{source(e)})``, and its value is
``z_k = f_k(a_k)``; a chain is the graph whose node ``k`` reads node ``k − 1`` only. What the readers
(:mod:`~inferlearn.engine.graph.sequential`, :mod:`~inferlearn.engine.graph.tracing`,
:mod:`~inferlearn.engine.graph.protocol`) accept as a map or a unit is decided here: affine maps
(``nn.Linear``, ``nn.Conv1d/2d/3d``, average pooling, ``nn.Flatten``, ``nn.Unflatten``, batch normalisation in
eval mode, and any module declared with :func:`declare_affine`), differentiable maps (max pooling, layer/group
normalisation, modules declared with :func:`declare_map`), box units (``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardtanh``,
``nn.Identity``, :class:`~inferlearn.units.Clamp`) and other element-wise activations.

References:
    Zach & Estellers (2019), Sec. 3 (layered energies); Zach, "Bilevel programs meet deep learning",
    Sec. 3 (layered bilevel programs).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...units import Box, units_of_module

AFFINE_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Unflatten)
SMOOTH_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
                nn.LayerNorm, nn.GroupNorm)
NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
ACTIVATION_TYPES = (nn.Sigmoid, nn.Tanh, nn.Hardsigmoid, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus,
                    nn.Mish, nn.Hardswish, nn.CELU, nn.SELU, nn.Softsign, nn.Tanhshrink)

AFFINE = "affine"               # what the lifted, contrastive, EqProp and lifted-Fenchel energies need
DIFFERENTIABLE = "differentiable"   # what MAC and Fenchel BP need
COUPLED = "coupled"             # differentiable, with BatchNorm in training mode and dropout (PC and ePC)


def is_activation(m: nn.Module) -> bool:
    """Whether ``m`` is an element-wise activation module: a box unit (:func:`~inferlearn.units.units_of_module`) or one
    of :data:`ACTIVATION_TYPES`. The one test of the library (the graph readers, block-ADMM's splits)."""
    return units_of_module(m) is not None or isinstance(m, ACTIVATION_TYPES)


def declare_affine(module: nn.Module) -> nn.Module:
    """Declare a module of yours affine (``m(u + v) − m(0) = (m(u) − m(0)) + (m(v) − m(0))``), so that the
    lifted energies accept it. The engine then uses its forward and autograd's vector–Jacobian
    product as ``A`` and ``Aᵀ``. Returns the module.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` (a function or lambda: wrap it in a module first).
    """
    check_module(module, "declare_affine")
    module.inferlearn_affine = True
    return module


def check_module(module, what: str) -> None:
    """Raise ``TypeError`` unless ``module`` is an ``nn.Module`` (what a declaration marks must be a model's part)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{what} takes an nn.Module, got {type(module).__name__} {module!r:.60}; wrap the function in "
                        "a module (a class with a forward method) and declare that")


def is_affine(m: nn.Module) -> bool:
    if getattr(m, "inferlearn_affine", False):
        return True
    if isinstance(m, NORM_TYPES):
        return not m.training
    if isinstance(m, DROPOUT_TYPES):
        return not m.training or m.p == 0   # the identity
    return isinstance(m, AFFINE_TYPES)


def declare_map(module: nn.Module) -> nn.Module:
    """Declare a module of yours one layer map (a single edge of the graph, not traced into): e.g. a
    residual branch ``a W φ(·)`` whose inner activation should not get a value node of its own (μPC's
    residual networks). The module must be differentiable; it is not affine unless also declared with
    :func:`declare_affine`. Returns the module (``TypeError`` for anything else)."""
    check_module(module, "declare_map")
    module.inferlearn_map = True
    return module


def is_map(m: nn.Module) -> bool:
    """Whether ``m`` is a layer map the engine reads (affine, differentiable, or declared with :func:`declare_map`)."""
    return getattr(m, "inferlearn_map", False) or is_affine(m) or isinstance(m, SMOOTH_TYPES + NORM_TYPES + DROPOUT_TYPES)


@dataclass(frozen=True, eq=False)
class Edge:
    """One incoming map of a node: ``A(z_source)``, the modules ``maps`` applied in order to the value of
    node ``source`` (0 is the model's input). No modules: the identity (a skip connection).

    Attributes:
        source: the index of the node the edge reads (0 = the input ``x``).
        maps: the modules composing the map, applied in order.
        names: their dotted paths in the model (for messages).
    """

    source: int
    maps: tuple[nn.Module, ...]
    names: tuple[str, ...]

    @functools.cached_property
    def linear(self) -> nn.Linear | None:
        """The ``nn.Linear`` when the map is one (possibly after a ``Flatten``), else ``None``."""
        core = [m for m in self.maps if not isinstance(m, nn.Flatten)]
        if len(core) == 1 and isinstance(core[0], nn.Linear) and all(
                m.start_dim == 1 and m.end_dim == -1 for m in self.maps if isinstance(m, nn.Flatten)):
            return core[0]
        return None

    @functools.cached_property
    def lone_linear(self) -> bool:
        return len(self.maps) == 1 and type(self.maps[0]) is nn.Linear

    def map(self, z: torch.Tensor) -> torch.Tensor:
        """``A(z)`` (one ``addmm`` for a lone ``nn.Linear`` on a matrix: no module dispatch)."""
        if self.lone_linear and z.dim() == 2:
            params = self.maps[0]._parameters   # the module's own dict: skips nn.Module.__getattr__
            w, b = params["weight"], params["bias"]
            return torch.addmm(b, z, w.t()) if b is not None else z.mm(w.t())
        for m in self.maps:
            z = m(z)
        return z

    @property
    def sources(self) -> tuple[int, ...]:
        """``(source,)``: the nodes the edge reads (one; a :class:`JointEdge` reads several)."""
        return (self.source,)

    @functools.cached_property
    def affine(self) -> bool:
        """Whether every map of the edge is affine (what the lifted energies need)."""
        return all(is_affine(m) for m in self.maps)

    def apply(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``A(z_source)`` given the values ``zs = [x, z_1, …]`` of the nodes."""
        return self.map(zs[self.source])

    def parameters(self):
        for m in self.maps:
            yield from m.parameters()


class JointMap(nn.Module):
    """A differentiable function of several node values, ``g(z_{p1}, …, z_{pm}; θ)``, as one module: an ``fx``
    sub-graph between value nodes (attention ``softmax(QKᵀ/√d) V``, a gated unit ``σ(W u) ⊙ V v``), evaluated as one
    call. ``parts`` holds the modules it calls (registered, so that ``parameters()`` and
    ``torch.func.functional_call`` see their weights); ``fn(values)`` computes it from the values of its
    sources, in the order of :attr:`JointEdge.sources`."""

    def __init__(self, fn, parts: Sequence[nn.Module], text: str = ""):
        super().__init__()
        self.fn, self.parts, self.text = fn, nn.ModuleList(parts), text

    def forward(self, *values: torch.Tensor) -> torch.Tensor:
        return self.fn(values)

    def extra_repr(self) -> str:
        return self.text


@dataclass(frozen=True, eq=False)
class JointEdge:
    """An incoming map that reads several nodes (or one node non-linearly through several paths that meet, as
    attention does): ``g(z_{sources[0]}, …)``, a :class:`JointMap` (``fn``). It is never affine: the lifted energies
    refuse it by name; predictive coding, ePC, MAC, Fenchel BP and BP differentiate it (a vector–Jacobian product to
    every source).

    Attributes:
        sources: the nodes it reads, each once, in the order ``fn`` takes them (0 = the input ``x``).
        fn: the function, a module taking one tensor per source.
        maps: the modules ``fn`` calls (their parameters are the edge's).
        names: their dotted paths in the model, and the operations' names (for messages).
    """

    sources: tuple[int, ...]
    fn: JointMap
    maps: tuple[nn.Module, ...]
    names: tuple[str, ...]

    linear = None
    lone_linear = False
    affine = False

    @property
    def source(self) -> int:
        """The first source (a one-source joint edge reads only it)."""
        return self.sources[0]

    def map(self, *zs: torch.Tensor) -> torch.Tensor:
        """``g(z_{sources[0]}, …)`` given the sources' values in order."""
        return self.fn(*zs)

    def apply(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``g`` given the values ``zs = [x, z_1, …]`` of the nodes."""
        return self.fn(*[zs[s] for s in self.sources])

    def parameters(self):
        return self.fn.parameters()


@dataclass(frozen=True, eq=False)
class Node:
    """One node of a model's graph: the pre-activation ``a_k = Σ_e A_e(z_{source(e)})`` (the sum of its
    incoming edges) and the unit after it, ``z_k = f_k(a_k)``.

    A chain's node has one edge, from the node before it; a residual block's output node has two
    (the branch and the skip).

    Attributes:
        edges: the incoming :class:`Edge` objects (at least one).
        activation: the activation module after ``a_k`` (``None``: identity, e.g. a linear output).
        units: the box unit set of ``activation`` (``None`` when it is not a box projection).
    """

    edges: tuple[Edge, ...]
    activation: nn.Module | None
    units: Box | None

    @classmethod
    def of_chain(cls, source: int, maps: Sequence[nn.Module], activation: nn.Module | None, units: Box | None,
                 names: Sequence[str]) -> "Node":
        """The link of a chain: one edge from ``source`` (the node before)."""
        return cls((Edge(source, tuple(maps), tuple(names)),), activation, units)

    @property
    def maps(self) -> tuple[nn.Module, ...]:
        """Every module of the node's incoming maps (one edge: ``A_k``'s modules in order)."""
        return tuple(m for e in self.edges for m in e.maps)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for e in self.edges for n in e.names)

    @functools.cached_property
    def sources(self) -> tuple[int, ...]:
        """The nodes the node reads, in the order of its edges (a joint edge's several sources in its order)."""
        return tuple(s for e in self.edges for s in e.sources)

    @functools.cached_property
    def joint(self) -> bool:
        """Whether an incoming map reads several nodes or is a traced function (a :class:`JointEdge`)."""
        return any(isinstance(e, JointEdge) for e in self.edges)

    @functools.cached_property
    def affine(self) -> bool:
        """Whether every incoming map is affine (no joint edge)."""
        return all(e.affine for e in self.edges)

    @functools.cached_property
    def reads_hidden(self) -> bool:
        """Whether an edge reads a hidden node (else the node's error is never sent down: the input is fixed)."""
        return any(s > 0 for s in self.sources)

    @functools.cached_property
    def linear(self) -> nn.Linear | None:
        """The ``nn.Linear`` of a one-edge node whose map is one (possibly after a ``Flatten``), else ``None``."""
        return self.edges[0].linear if len(self.edges) == 1 else None

    @functools.cached_property
    def lone_linear(self) -> bool:
        return len(self.edges) == 1 and self.edges[0].lone_linear

    def map(self, z: torch.Tensor) -> torch.Tensor:
        """``a_k = A_k(z)`` of a one-edge node (a chain's link)."""
        if len(self.edges) != 1:
            raise TypeError("Node.map needs a node with one incoming edge; use Node.pre for graph nodes")
        return self.edges[0].map(z)

    def pre(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``a_k = Σ_e A_e(z_{source(e)})`` given the values ``zs = [x, z_1, …]`` of the nodes before it."""
        edges = self.edges
        if len(edges) == 1:
            return edges[0].apply(zs)
        a = edges[0].apply(zs)
        for e in edges[1:]:
            a = a + e.apply(zs)
        return a

    def act(self, a: torch.Tensor) -> torch.Tensor:
        """``f_k(a_k)`` (the identity without an activation)."""
        return a if self.activation is None else self.activation(a)

    def parameters(self):
        seen = set()
        for e in self.edges:
            for p in e.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p


class Graph:
    """A model read as a directed acyclic graph of :class:`Node` nodes (build with :func:`read_graph`).

    Nodes ``1 … L`` are in topological order (every edge reads an earlier node or the input, node 0);
    node ``L`` is the output and every other node feeds at least one later node. A chain is the case
    where node ``k``'s only edge reads node ``k − 1``.

    Attributes:
        links: ``L`` nodes; hidden variables sit at nodes ``1 … L−1``, the output at node ``L``.
        model: the model it was read from.
        modules: every module of the nodes' maps (and, for a chain, its units), in the order read.
    """

    def __init__(self, model: nn.Module, links: Sequence[Node], modules: Sequence[nn.Module]):
        self.model, self.nodes, self.modules = model, tuple(links), tuple(modules)
        self.read_key: tuple | None = None   # set by the reader: how the graph was read, to tell whether it is current

    @property
    def depth(self) -> int:
        """The number of nodes ``L`` (a chain's number of layers)."""
        return len(self.nodes)

    def prime(self) -> "Graph":
        """Compute every cached property of the chain, its nodes and its edges now: a function that
        ``torch.compile`` traces reads them, and dynamo cannot trace the lock of a first computation."""
        if not self.__dict__.get("_primed"):
            for obj in (self, *self.nodes, *(e for link in self.nodes for e in link.edges)):
                for name, attr in vars(type(obj)).items():
                    if isinstance(attr, functools.cached_property):
                        getattr(obj, name)
            self._primed = True
        return self

    @functools.cached_property
    def is_chain(self) -> bool:
        """True when every node has one edge, from the node before it."""
        return all(l.sources == (k - 1,) for k, l in enumerate(self.nodes, start=1))

    @functools.cached_property
    def children(self) -> tuple[tuple[tuple[int, Edge], ...], ...]:
        """``children[k]``: the ``(child node, edge)`` pairs reading node ``k`` (index 0: the input)."""
        out: list[list] = [[] for _ in range(self.depth + 1)]
        for c, link in enumerate(self.nodes, start=1):
            for e in link.edges:
                for s in dict.fromkeys(e.sources):
                    out[s].append((c, e))
        return tuple(tuple(o) for o in out)

    @functools.cached_property
    def levels(self) -> tuple[int, ...]:
        """``levels[k]``: the longest path from the input to node ``k`` (``k`` on a chain; ``levels[0] = 0``).

        The lifted energies weight node ``k``'s term by ``γ^{levels[k] − 1}``, so that every edge carries a
        feedback ratio of at most ``γ``."""
        lv = [0]
        for link in self.nodes:
            lv.append(1 + max(lv[s] for s in link.sources))
        return tuple(lv)

    @functools.cached_property
    def is_dense(self) -> bool:
        """True when the model is a chain whose every map is one ``nn.Linear`` (a ``Flatten`` may precede the
        first), every hidden unit a box and the output linear: the case the fused MLP paths specialise."""
        if not self.is_chain or any(l.linear is None for l in self.nodes) or not self.linear_output:
            return False
        if any(isinstance(m, nn.Flatten) for l in self.nodes[1:] for m in l.maps):
            return False
        return all(l.units is not None for l in self.nodes[:-1])

    @functools.cached_property
    def linear_output(self) -> bool:
        """True when the last link has no activation (or an identity)."""
        last = self.nodes[-1]
        return last.activation is None or (last.units is not None and last.units.is_linear)

    def forward_all(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``([x, z_1, …, z_L], [x, a_1, …, a_L])``: activations and pre-activations of the forward pass."""
        zs, pre = [x], [x]
        for link in self.nodes:
            a = link.pre(zs)
            pre.append(a)
            zs.append(link.act(a))
        return zs, pre

    def check_structure(self, need: str, rule: str) -> None:
        """Raise ``ValueError`` naming the first module that ``rule`` cannot handle.

        Args:
            need: :data:`AFFINE` (affine maps, box units, linear output), :data:`DIFFERENTIABLE`, or :data:`COUPLED`
                (differentiable, with BatchNorm in training mode and dropout: :mod:`inferlearn.rules.batch_layers`).
        """
        for k, link in enumerate(self.nodes, start=1):
            if need == AFFINE and link.joint:
                where = ", ".join(n for e in link.edges if isinstance(e, JointEdge) for n in e.names[:4])
                raise ValueError(f"Rule {rule!r} cannot use node {k} ({where}): its prediction is a non-affine "
                                 "function of its inputs (a product of two tensors, attention, a gate or another "
                                 "traced operation); the lifted energies need affine maps. Use pc, epc, mac, "
                                 "fenchel-bp or backprop on this model")
            for name, m in zip(link.names, link.maps):
                if need == AFFINE and not is_affine(m):
                    why = ("batch normalisation in training mode is not affine (call model.eval() or "
                           "remove it)") if isinstance(m, NORM_TYPES) else "it is not an affine map"
                    raise ValueError(f"Rule {rule!r} cannot use module {name!r} ({type(m).__name__}): {why}. "
                                     "The lifted energies need affine layer maps (Linear, Conv, AvgPool, Flatten, "
                                     "sums, scalings, concatenation, slicing) with box units; declare your own affine "
                                     "module with inferlearn.declare_affine, or use backprop, fenchel-bp or pc")
                if isinstance(m, NORM_TYPES) and m.training and need != COUPLED:
                    raise ValueError(f"Rule {rule!r} cannot use module {name!r} ({type(m).__name__}) in training "
                                     "mode: it mixes the samples of a batch, which this rule's inference does not "
                                     "model; call model.eval() on it (or fold it into the layer before), or use pc, "
                                     "epc or backprop")
                if isinstance(m, DROPOUT_TYPES) and m.training and m.p > 0 and need != COUPLED:
                    raise ValueError(f"Rule {rule!r} cannot use module {name!r} ({type(m).__name__}) in training "
                                     "mode: it is random at every evaluation; call model.eval() on it, or use pc, "
                                     "epc or backprop (which hold one mask per batch)")
            if need == AFFINE and k < self.depth and link.units is None:
                where = link.names[-1] if link.names else f"node {k}"
                raise ValueError(f"Rule {rule!r} cannot use activation {type(link.activation).__name__} after "
                                 f"{where!r}: the lifted energies need box units (ReLU, ReLU6, Hardtanh, "
                                 "Identity, inferlearn.units.Clamp); use pc, backprop or fenchel-bp for other activations")
        if need == AFFINE and not self.linear_output:
            raise ValueError(f"Rule {rule!r} needs a linear output layer, but the model ends with "
                             f"{type(self.nodes[-1].activation).__name__}; remove the final activation")


def check_single_use(calls) -> None:
    """Raise ``ValueError`` naming the first module with parameters that ``calls`` (``(name, module)`` pairs, one per
    call of the forward pass) holds twice: shared weights, whose uses would need a value node each but share one
    gradient, which the energy rules do not model (back-propagation's autograd does)."""
    seen: dict[int, str] = {}
    for name, m in calls:
        if next(m.parameters(), None) is None:
            continue
        if id(m) in seen:
            raise ValueError(f"module {seen[id(m)]!r} is used twice; inference-learning rules need one use per "
                             "module (give each use its own module, e.g. copy.deepcopy; backprop and fenchel-bp "
                             "take shared weights)")
        seen[id(m)] = name


def check_graph(model: nn.Module, links: Sequence[Node]) -> None:
    """Raise ``ValueError`` unless ``links`` is a DAG in topological order whose only sink is the last node."""
    who = type(model).__name__
    if not links:
        raise ValueError(f"{who} has no layers")
    used = [False] * (len(links) + 1)
    for k, link in enumerate(links, start=1):
        if not link.edges:
            raise ValueError(f"{who}: node {k} has no inputs")
        for s in link.sources:
            if not (isinstance(s, int) and 0 <= s < k):
                raise ValueError(f"{who}: node {k} reads node {s}, which does not come before it "
                                 "(nodes must be in topological order; 0 is the input)")
            used[s] = True
    for k in range(1, len(links)):
        if not used[k]:
            name = links[k - 1].names[-1] if links[k - 1].names else f"node {k}"
            raise ValueError(f"{who}: the value after {name!r} (node {k}) is not used on the way to the output; "
                             "remove the dead branch")
    if not used[0]:
        raise ValueError(f"{who}: no node reads the model's input")
