"""Layered models as the engine sees them: a chain ``x → A_1 → C_1 → A_2 → C_2 → … → A_L``.

Every energy method needs the same thing from a model: layer maps ``A_k`` (affine for the lifted,
contrastive and EqProp energies; any differentiable map for predictive coding) and, after each,
a unit ``C_k`` (a box projection for lifted energies, any element-wise activation for predictive
coding). :func:`model_chain` reads it off

* an ``nn.Sequential`` (nested ones are flattened) of layer maps, each optionally followed by a unit;
* any ``nn.Module`` that exposes its chain through the **chain protocol**: a method
  ``inferlearn_chain(self) -> Sequence[nn.Module]`` returning the modules in the order ``forward``
  applies them (the library's :class:`~inferlearn.models.MLP` does this);

and caches it per model. Consecutive maps without a unit between them form one layer map (e.g.
``AvgPool2d → Conv2d`` or ``Flatten → Linear``), so hidden variables ``z_k`` live exactly after the
units. A unit module is ``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardtanh`` (``nn.Hardtanh(0, 1)`` is the
hard sigmoid), ``nn.Identity`` (a linear unit) or :class:`~inferlearn.units.Clamp`; other
element-wise activations (``nn.Sigmoid``, ``nn.Tanh``, ``nn.Hardsigmoid``, ``nn.LeakyReLU``, ...) are
activations but not box units.

Affine maps: ``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.AvgPool1d/2d/3d``, ``nn.AdaptiveAvgPool1d/2d``,
``nn.Flatten``, ``nn.Unflatten``, batch normalisation in eval mode, and any module declared affine
with :func:`declare_affine`. Differentiable (non-affine) maps: max pooling, layer/group
normalisation, batch normalisation in eval mode. Anything else is refused by :func:`model_chain`
with a message naming the module and the reason.

References:
    Zach & Estellers (2019), Sec. 3 (layered energies); Zach, "Bilevel programs meet deep learning",
    Sec. 3 (layered bilevel programs).
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..units import UnitSet, units_of_module

AFFINE_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Unflatten)
SMOOTH_TYPES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
                nn.LayerNorm, nn.GroupNorm)
NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
ACTIVATION_TYPES = (nn.Sigmoid, nn.Tanh, nn.Hardsigmoid, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus,
                    nn.Mish, nn.Hardswish, nn.CELU, nn.SELU, nn.Softsign, nn.Tanhshrink)

AFFINE = "affine"               # what the lifted, contrastive, EqProp and lifted-Fenchel energies need
DIFFERENTIABLE = "differentiable"   # what predictive coding needs


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
    return isinstance(m, AFFINE_TYPES)


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


def _leaf_ids(module: nn.Module) -> list:
    """``[id(m) for _, m in _leaves(module, "")]`` without the paths (no ``named_modules`` walk): the cache check
    that runs on every rule call."""
    protocol = _chain_protocol(module)
    if callable(protocol):
        out = []
        for m in protocol():
            out += [id(m)] if m is module or not isinstance(m, nn.Module) else _leaf_ids(m)
        return out
    if isinstance(module, nn.Sequential):
        out = []
        for m in module._modules.values():
            out += _leaf_ids(m)
        return out
    return [id(module)]


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
    def _lone_linear(self) -> bool:
        return len(self.maps) == 1 and type(self.maps[0]) is nn.Linear

    def map(self, z: torch.Tensor) -> torch.Tensor:
        """``A(z)`` (one ``addmm`` for a lone ``nn.Linear`` on a matrix: no module dispatch)."""
        if self._lone_linear and z.dim() == 2:
            params = self.maps[0]._parameters   # the module's own dict: skips nn.Module.__getattr__
            w, b = params["weight"], params["bias"]
            return torch.addmm(b, z, w.t()) if b is not None else z.mm(w.t())
        for m in self.maps:
            z = m(z)
        return z

    def parameters(self):
        for m in self.maps:
            yield from m.parameters()


@dataclass(frozen=True, eq=False)
class Link:
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
    units: UnitSet | None

    @classmethod
    def of_chain(cls, source: int, maps: Sequence[nn.Module], activation: nn.Module | None, units: UnitSet | None,
                 names: Sequence[str]) -> "Link":
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
        return tuple(e.source for e in self.edges)

    @functools.cached_property
    def reads_hidden(self) -> bool:
        """Whether an edge reads a hidden node (else the node's error is never sent down: the input is fixed)."""
        return any(s > 0 for s in self.sources)

    @functools.cached_property
    def linear(self) -> nn.Linear | None:
        """The ``nn.Linear`` of a one-edge node whose map is one (possibly after a ``Flatten``), else ``None``."""
        return self.edges[0].linear if len(self.edges) == 1 else None

    @functools.cached_property
    def _lone_linear(self) -> bool:
        return len(self.edges) == 1 and self.edges[0]._lone_linear

    def map(self, z: torch.Tensor) -> torch.Tensor:
        """``a_k = A_k(z)`` of a one-edge node (a chain's link)."""
        if len(self.edges) != 1:
            raise TypeError("Link.map needs a node with one incoming edge; use Link.pre for graph nodes")
        return self.edges[0].map(z)

    def pre(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``a_k = Σ_e A_e(z_{source(e)})`` given the values ``zs = [x, z_1, …]`` of the nodes before it."""
        edges = self.edges
        if len(edges) == 1:
            return edges[0].map(zs[edges[0].source])
        a = edges[0].map(zs[edges[0].source])
        for e in edges[1:]:
            a = a + e.map(zs[e.source])
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


class Chain:
    """A model read as a directed acyclic graph of :class:`Link` nodes (build with :func:`model_chain`).

    Nodes ``1 … L`` are in topological order (every edge reads an earlier node or the input, node 0);
    node ``L`` is the output and every other node feeds at least one later node. A chain is the case
    where node ``k``'s only edge reads node ``k − 1``.

    Attributes:
        links: ``L`` nodes; hidden variables sit at nodes ``1 … L−1``, the output at node ``L``.
        model: the model it was read from.
    """

    def __init__(self, model: nn.Module, links: Sequence[Link], modules: Sequence[nn.Module]):
        self.model, self.links, self._modules = model, tuple(links), tuple(modules)

    @property
    def depth(self) -> int:
        """The number of nodes ``L`` (a chain's number of layers)."""
        return len(self.links)

    def prime(self) -> "Chain":
        """Compute every cached property of the chain, its nodes and its edges now: a function that
        ``torch.compile`` traces reads them, and dynamo cannot trace the lock of a first computation."""
        if not self.__dict__.get("_primed"):
            for obj in (self, *self.links, *(e for link in self.links for e in link.edges)):
                for name, attr in vars(type(obj)).items():
                    if isinstance(attr, functools.cached_property):
                        getattr(obj, name)
            self._primed = True
        return self

    @functools.cached_property
    def is_chain(self) -> bool:
        """True when every node has one edge, from the node before it."""
        return all(l.sources == (k - 1,) for k, l in enumerate(self.links, start=1))

    @functools.cached_property
    def children(self) -> tuple[tuple[tuple[int, Edge], ...], ...]:
        """``children[k]``: the ``(child node, edge)`` pairs reading node ``k`` (index 0: the input)."""
        out: list[list] = [[] for _ in range(self.depth + 1)]
        for c, link in enumerate(self.links, start=1):
            for e in link.edges:
                out[e.source].append((c, e))
        return tuple(tuple(o) for o in out)

    @functools.cached_property
    def levels(self) -> tuple[int, ...]:
        """``levels[k]``: the longest path from the input to node ``k`` (``k`` on a chain; ``levels[0] = 0``).

        The lifted energies weight node ``k``'s term by ``γ^{levels[k] − 1}``, so that every edge carries a
        feedback ratio of at most ``γ``."""
        lv = [0]
        for link in self.links:
            lv.append(1 + max(lv[s] for s in link.sources))
        return tuple(lv)

    @functools.cached_property
    def is_dense(self) -> bool:
        """True when the model is a chain whose every map is one ``nn.Linear`` (a ``Flatten`` may precede the
        first), every hidden unit a box and the output linear: the case the fused MLP paths specialise."""
        if not self.is_chain or any(l.linear is None for l in self.links) or not self.linear_output:
            return False
        if any(isinstance(m, nn.Flatten) for l in self.links[1:] for m in l.maps):
            return False
        return all(l.units is not None for l in self.links[:-1])

    @functools.cached_property
    def linear_output(self) -> bool:
        """True when the last link has no activation (or an identity)."""
        last = self.links[-1]
        return last.activation is None or (last.units is not None and last.units.is_linear)

    def forward_all(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``([x, z_1, …, z_L], [x, a_1, …, a_L])``: activations and pre-activations of the forward pass."""
        zs, pre = [x], [x]
        for link in self.links:
            a = link.pre(zs)
            pre.append(a)
            zs.append(link.act(a))
        return zs, pre

    def check_structure(self, need: str, rule: str) -> None:
        """Raise ``ValueError`` naming the first module that ``rule`` cannot handle.

        Args:
            need: :data:`AFFINE` (affine maps, box units, linear output) or :data:`DIFFERENTIABLE`.
        """
        for k, link in enumerate(self.links, start=1):
            for name, m in zip(link.names, link.maps):
                if need == AFFINE and not is_affine(m):
                    why = ("batch normalisation in training mode is not affine (call model.eval() or "
                           "remove it)") if isinstance(m, NORM_TYPES) else "it is not an affine map"
                    raise ValueError(f"Rule {rule!r} cannot use module {name!r} ({type(m).__name__}): {why}. "
                                     "The lifted energies need affine layer maps (Linear, Conv, AvgPool, Flatten, "
                                     "sums, scalings, concatenation, slicing) with box units; declare your own affine "
                                     "module with inferlearn.declare_affine, or use backprop, fenchel-bp or pc")
                if isinstance(m, NORM_TYPES) and m.training:
                    raise ValueError(f"Rule {rule!r} cannot use module {name!r} ({type(m).__name__}) in training "
                                     "mode: inference evaluates it many times and mixes the samples of a batch; "
                                     "call model.eval() on it (or fold it into the layer before)")
            if need == AFFINE and k < self.depth and link.units is None:
                where = link.names[-1] if link.names else f"node {k}"
                raise ValueError(f"Rule {rule!r} cannot use activation {type(link.activation).__name__} after "
                                 f"{where!r}: the lifted energies need box units (ReLU, ReLU6, Hardtanh, "
                                 "Identity, inferlearn.units.Clamp); use pc, backprop or fenchel-bp for other activations")
        if need == AFFINE and not self.linear_output:
            raise ValueError(f"Rule {rule!r} needs a linear output layer, but the model ends with "
                             f"{type(self.links[-1].activation).__name__}; remove the final activation")


def _parse(model: nn.Module) -> Chain:
    leaves = _leaves(model, "")
    if not leaves:
        raise ValueError(f"{type(model).__name__} has no layers")
    check_single_use(leaves)
    links: list[Link] = []
    maps: list[nn.Module] = []
    names: list[str] = []
    for name, m in leaves:
        units = units_of_module(m)
        if units is not None or isinstance(m, ACTIVATION_TYPES):
            if not maps:
                where = "starts the model" if not links else f"follows another activation ({links[-1].names[-1]!r})"
                raise ValueError(f"Activation {name!r} ({type(m).__name__}) {where}; a chain alternates layer maps "
                                 "and units (x → map → unit → map → … → map)")
            links.append(Link.of_chain(len(links), maps, m, units, names))
            maps, names = [], []
        elif is_affine(m) or isinstance(m, SMOOTH_TYPES + NORM_TYPES):
            maps.append(m)
            names.append(name)
        else:
            if any(True for _ in m.children()) or m is model:
                raise _NotAChain(name)   # a composite module (a residual block, ...): read the model as a graph
            raise ValueError(f"Module {name!r} ({type(m).__name__}) is neither a layer map nor a unit the engine "
                             "knows. Supported: Linear, Conv, AvgPool, MaxPool, Flatten, normalisation layers and "
                             "element-wise activations; expose your model's chain with an inferlearn_chain() method, "
                             "or declare an affine module with inferlearn.declare_affine")
    if maps:
        links.append(Link.of_chain(len(links), maps, None, None, names))
    return Chain(model, links, [m for _, m in leaves])


class _NotAChain(Exception):
    """The chain reader met a module it cannot read as a map or unit: read the model by tracing instead."""


def _is_chain_leaf(m: nn.Module) -> bool:
    return units_of_module(m) is not None or isinstance(m, ACTIVATION_TYPES) or is_affine(m) or isinstance(
        m, SMOOTH_TYPES + NORM_TYPES)


def _read(model: nn.Module, example: torch.Tensor | None) -> Chain:
    """A :class:`Chain` by the graph protocol, the chain reader (``nn.Sequential``, ``inferlearn_chain()``, one
    layer) or, for any other module, ``torch.fx`` tracing (:mod:`inferlearn.engine.graph_reader`)."""
    from . import graph_reader

    if callable(getattr(model, "inferlearn_graph", None)):
        chain = graph_reader.as_chain(model, graph_reader.protocol_graph(model))
        chain._key = ("graph", tuple(id(m) for m in chain._modules), None)
        return chain
    if callable(getattr(model, "inferlearn_chain", None)) or isinstance(model, nn.Sequential) or _is_chain_leaf(model):
        try:
            chain = _parse(model)
            chain._key = ("chain", None, None)
            return chain
        except _NotAChain:
            pass
    links, shaped = graph_reader.trace_graph(model, example)
    chain = graph_reader.as_chain(model, links)
    chain._key = ("traced", tuple(id(m) for m in model.modules()),
                  tuple(example.shape[1:]) if shaped and example is not None else None)
    return chain


def _current(chain: Chain, model: nn.Module, example: torch.Tensor | None) -> bool:
    """Whether a cached reading still describes ``model`` (same modules; same input shape where it matters)."""
    kind, ids, shape = chain._key
    if kind == "chain":
        return [id(m) for m in chain._modules] == _leaf_ids(model)
    if kind == "graph":
        return callable(getattr(model, "inferlearn_graph", None)) and ids == tuple(
            id(m) for m in chain._modules)
    if ids != tuple(id(m) for m in model.modules()):
        return False
    return shape is None or example is None or shape == tuple(example.shape[1:])


_CACHE: "weakref.WeakKeyDictionary[nn.Module, Chain]" = weakref.WeakKeyDictionary()


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


def model_chain(model: nn.Module, need: str | None = None, rule: str = "this rule",
                example: torch.Tensor | None = None) -> Chain:
    """The graph of ``model`` (read once and cached per model), checked for what ``rule`` needs.

    An ``nn.Sequential`` or a module with ``inferlearn_chain()`` is read as a chain, a module with
    ``inferlearn_graph()`` by that protocol, any other module by ``torch.fx`` tracing
    (:func:`~inferlearn.engine.graph_reader.trace_graph`).

    Args:
        need: :data:`AFFINE`, :data:`DIFFERENTIABLE` or ``None`` (no check).
        rule: the rule's name, for messages.
        example: an input batch (a traced model that concatenates needs its shape).

    Raises:
        ValueError: the model cannot be read, or a module is one ``rule`` cannot handle (the
            message names the module and the reason).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected an nn.Module, got {type(model).__name__}")
    chain = _CACHE.get(model)
    if chain is None or not _current(chain, model, example):
        chain = _read(model, example)
        _CACHE[model] = chain
    if need is not None:
        chain.check_structure(need, rule)
    return chain


model_graph = model_chain


def dense_chain(model: nn.Module) -> Chain | None:
    """The chain of ``model`` when it is dense (:attr:`Chain.is_dense`), else ``None`` (also for non-chains)."""
    try:
        chain = model_chain(model)
    except (ValueError, TypeError):
        return None
    return chain if chain.is_dense else None
