"""Graph reading: a model as a :class:`Graph` of :class:`Node` objects joined by :class:`Edge` maps.

* :mod:`.types` -- the types, and what the engine accepts as a map or a unit (:func:`declare_affine`,
  :func:`declare_map`);
* :mod:`.sequential` -- the sequential reader (``nn.Sequential``, ``inferlearn_chain()``);
* :mod:`.tracing` -- ``torch.fx`` tracing of any other module;
* :mod:`.protocol` -- the graph protocol (``inferlearn_graph()`` returning :class:`NodeSpec` objects);
* :mod:`.reader` -- :func:`read_graph`, which picks the reader and caches the graph per model.

The modules import in that order (types ← readers ← reader): no cycle.
"""
from .protocol import NodeSpec, protocol_graph
from .reader import as_graph, dense_graph, read_graph
from .tracing import trace_graph
from .types import (ACTIVATION_TYPES, AFFINE, AFFINE_TYPES, COUPLED, DIFFERENTIABLE, DROPOUT_TYPES, NORM_TYPES, SMOOTH_TYPES, Edge, Graph,
                    JointEdge, JointMap, Node, check_graph, check_module, check_single_use, declare_affine, declare_map, is_activation, is_affine,
                    is_map)

__all__ = ["ACTIVATION_TYPES", "AFFINE", "AFFINE_TYPES", "COUPLED", "DIFFERENTIABLE", "DROPOUT_TYPES", "NORM_TYPES", "SMOOTH_TYPES", "Edge", "Graph",
           "JointEdge", "JointMap", "Node", "NodeSpec", "as_graph", "check_graph", "check_module", "check_single_use", "declare_affine",
           "declare_map", "dense_graph", "is_activation", "is_affine", "is_map", "protocol_graph", "read_graph", "trace_graph"]
