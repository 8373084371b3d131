"""inferlearn: training neural networks by inference learning.

Lifted networks and contrastive learning, bilevel surrogates and Fenchel back-propagation, the
family of energy-based rules (CHL, equilibrium propagation, predictive coding), and stochastic
block-ADMM -- each a rule that fills ``.grad`` of a PyTorch model (or, for block-ADMM, a trainer).
"""
import warnings as _warnings

from .engine.graph import NodeSpec, declare_affine, declare_map, read_graph
from .errors import (ConvergenceError, ConvergenceWarning, DataError, DivergenceError, InferlearnError, InferlearnWarning,
                     NonFiniteError, PrecisionWarning)

__version__ = "0.1.0"

__all__ = ["declare_affine", "declare_map", "read_graph", "NodeSpec", "ConvergenceError", "ConvergenceWarning", "DataError",
           "DivergenceError", "InferlearnError", "InferlearnWarning", "NonFiniteError", "PrecisionWarning", "__version__"]

#: names that changed, kept importable for a while with a DeprecationWarning naming the new one
_RENAMED = {"model_chain": ("read_graph", read_graph), "model_graph": ("read_graph", read_graph),
            "Node": ("NodeSpec", NodeSpec)}


def __getattr__(name: str):
    if name in _RENAMED:
        new, value = _RENAMED[name]
        _warnings.warn(f"inferlearn.{name} is renamed inferlearn.{new}; the old name will be removed",
                       DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'inferlearn' has no attribute {name!r}")
