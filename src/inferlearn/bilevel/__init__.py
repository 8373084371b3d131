"""Argmin layers with a contrastive (or implicit) backward: the bilevel paper in one autograd Function.

The inner energies (:mod:`~inferlearn.bilevel.energies`), their solvers (:mod:`~inferlearn.bilevel.fista`) and the
layer (:mod:`~inferlearn.bilevel.layer`); beside them constraints that depend on θ through their multipliers
(:mod:`~inferlearn.bilevel.constrained`), the min–min–min form of the surrogate through duality
(:mod:`~inferlearn.bilevel.duality`) and the nested (multi-level) surrogates (:mod:`~inferlearn.bilevel.nested`).

The constraint set :class:`Box` is the engine's one box type (:class:`inferlearn.units.Box`, alias
``Box``), re-exported here; solves report :class:`inferlearn.engine.solvers.SolveInfo`.
"""
from ..units import Box
from .energies import Energy, FunctionEnergy, LeastSquaresEnergy, ProximalEnergy, QuadraticEnergy
from .fista import AcceleratedProjectedGradient, ProjectedGradient, conjugate_gradient, solve
from .layer import ArgminLayer, BackwardInfo, argmin, contrastive_surrogate
from .constrained import (AugmentedLagrangian, ConstrainedArgminLayer, Constraints, constrained_surrogate,
                          solve_constrained)
from .duality import dual_objective, dual_surrogate, solve_joint
from .nested import NestedSurrogate, bottomup_surrogate, layer_betas, topdown_surrogate

__all__ = ["AcceleratedProjectedGradient", "ArgminLayer", "AugmentedLagrangian", "BackwardInfo", "Box",
           "ConstrainedArgminLayer", "Constraints", "Energy", "FunctionEnergy", "LeastSquaresEnergy", "NestedSurrogate",
           "ProjectedGradient", "ProximalEnergy", "QuadraticEnergy", "argmin", "bottomup_surrogate", "conjugate_gradient",
           "constrained_surrogate", "contrastive_surrogate", "dual_objective", "dual_surrogate", "layer_betas", "solve",
           "solve_constrained", "solve_joint", "topdown_surrogate"]
