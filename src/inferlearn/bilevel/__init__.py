"""Argmin layers with a contrastive (or implicit) backward: the bilevel paper in one autograd Function.

The constraint set :class:`Box` is the engine's one box type (:class:`inferlearn.units.Box`, alias
``UnitSet``), re-exported here; solves report :class:`inferlearn.engine.solvers.SolveInfo`.
"""
from ..units import Box
from .layer import (AcceleratedProjectedGradient, ArgminLayer, BackwardInfo, Energy, FunctionEnergy,
                    LeastSquaresEnergy, ProjectedGradient, ProximalEnergy, QuadraticEnergy, argmin,
                    conjugate_gradient, contrastive_surrogate, solve)
from .constrained import (AugmentedLagrangian, ConstrainedArgminLayer, Constraints, constrained_surrogate,
                          solve_constrained)
from .duality import dual_objective, dual_surrogate, solve_joint

__all__ = ["AcceleratedProjectedGradient", "ArgminLayer", "AugmentedLagrangian", "ConstrainedArgminLayer",
           "Constraints", "constrained_surrogate", "solve_constrained", "dual_objective", "dual_surrogate", "solve_joint", "BackwardInfo", "Box", "Energy", "FunctionEnergy",
           "LeastSquaresEnergy", "ProjectedGradient", "ProximalEnergy", "QuadraticEnergy", "argmin",
           "conjugate_gradient", "contrastive_surrogate", "solve"]
