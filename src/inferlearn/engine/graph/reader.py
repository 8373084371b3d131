"""Reading a model into its :class:`~inferlearn.engine.graph.types.Graph`, once per model (cached, re-read when
the model's modules change): by the graph protocol, by the sequential reader, or by ``torch.fx`` tracing."""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn

from . import protocol, sequential, tracing
from .types import Graph, Node


def _read(model: nn.Module, example: torch.Tensor | None) -> Graph:
    """A :class:`Graph` by the graph protocol, the chain reader (``nn.Sequential``, ``inferlearn_chain()``, one
    layer) or, for any other module, ``torch.fx`` tracing (:mod:`~inferlearn.engine.graph.tracing`)."""

    if callable(getattr(model, "inferlearn_graph", None)):
        chain = as_graph(model, protocol.protocol_graph(model))
        chain.read_key = ("graph", tuple(id(m) for m in chain.modules), None)
        return chain
    if callable(getattr(model, "inferlearn_chain", None)) or isinstance(model, nn.Sequential) or sequential.is_chain_leaf(model):
        try:
            chain = sequential.read_sequential(model)
            chain.read_key = ("chain", None, None)
            return chain
        except sequential.NotAChain:
            pass
    links, shaped = tracing.trace_graph(model, example)
    chain = as_graph(model, links)
    chain.read_key = ("traced", tuple(id(m) for m in model.modules()),
                  tuple(example.shape[1:]) if shaped and example is not None else None)
    return chain


def _current(chain: Graph, model: nn.Module, example: torch.Tensor | None) -> bool:
    """Whether a cached reading still describes ``model`` (same modules; same input shape where it matters)."""
    kind, ids, shape = chain.read_key
    if kind == "chain":
        return [id(m) for m in chain.modules] == sequential.leaf_ids(model)
    if kind == "graph":
        return callable(getattr(model, "inferlearn_graph", None)) and ids == tuple(
            id(m) for m in chain.modules)
    if ids != tuple(id(m) for m in model.modules()):
        return False
    return shape is None or example is None or shape == tuple(example.shape[1:])


_CACHE: "weakref.WeakKeyDictionary[nn.Module, Graph]" = weakref.WeakKeyDictionary()


def read_graph(model: nn.Module, need: str | None = None, rule: str = "this rule",
                example: torch.Tensor | None = None) -> Graph:
    """The graph of ``model`` (read once and cached per model), checked for what ``rule`` needs.

    An ``nn.Sequential`` or a module with ``inferlearn_chain()`` is read as a chain, a module with
    ``inferlearn_graph()`` by that protocol, any other module by ``torch.fx`` tracing
    (:func:`~inferlearn.engine.graph.tracing.trace_graph`).

    Args:
        need: :data:`AFFINE`, :data:`DIFFERENTIABLE` or ``None`` (no check).
        rule: the rule's name, for messages.
        example: an input batch (a traced model that concatenates needs its shape).

    Raises:
        ValueError: the model cannot be read, or a module is one ``rule`` cannot handle (the
            message names the module and the reason).

    Example:
        >>> from torch import nn
        >>> class Residual(nn.Module):          # relu(x + W x): read by torch.fx into a node with two edges
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.inp, self.w, self.act, self.out = nn.Linear(4, 8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)
        ...     def forward(self, x):
        ...         h = self.act(self.inp(x))
        ...         return self.out(self.act(h + self.w(h)))
        >>> graph = read_graph(Residual())
        >>> [node.sources for node in graph.nodes]    # node 2 sums the skip (from node 1) and the branch
        [(0,), (1, 1), (2,)]
        >>> graph.is_chain
        False
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


def dense_graph(model: nn.Module) -> Graph | None:
    """The chain of ``model`` when it is dense (:attr:`Graph.is_dense`), else ``None`` (also for non-chains)."""
    try:
        chain = read_graph(model)
    except (ValueError, TypeError):
        return None
    return chain if chain.is_dense else None


def as_graph(model: nn.Module, links: Sequence[Node]) -> Graph:
    return Graph(model, links, [m for link in links for m in link.maps])
