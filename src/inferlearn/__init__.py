"""inferlearn: training neural networks by inference learning.

Lifted networks and contrastive learning, bilevel surrogates and Fenchel back-propagation, the
family of energy-based rules (CHL, equilibrium propagation, predictive coding), and stochastic
block-ADMM -- each a rule that fills ``.grad`` of a PyTorch model (or, for block-ADMM, a trainer).
"""
from .engine.chain import declare_affine, model_chain, model_graph
from .engine.graph_reader import Node, declare_map
from .errors import (ConvergenceError, ConvergenceWarning, DataError, DivergenceError, InferlearnError, InferlearnWarning,
                     NonFiniteError, PrecisionWarning)

__version__ = "0.1.0"

__all__ = ["declare_affine", "declare_map", "model_chain", "model_graph", "Node", "ConvergenceError", "ConvergenceWarning", "DataError", "DivergenceError", "InferlearnError",
           "InferlearnWarning", "NonFiniteError", "PrecisionWarning", "__version__"]
