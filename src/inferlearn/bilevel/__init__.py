"""Argmin layers with a contrastive (or implicit) backward: the bilevel paper in one autograd Function."""
from .layer import (AcceleratedProjectedGradient, ArgminLayer, BackwardInfo, Box, Energy, FunctionEnergy,
                    LeastSquaresEnergy, ProjectedGradient, ProximalEnergy, QuadraticEnergy, argmin,
                    conjugate_gradient, contrastive_surrogate, solve)

__all__ = ["AcceleratedProjectedGradient", "ArgminLayer", "BackwardInfo", "Box", "Energy", "FunctionEnergy",
           "LeastSquaresEnergy", "ProjectedGradient", "ProximalEnergy", "QuadraticEnergy", "argmin",
           "conjugate_gradient", "contrastive_surrogate", "solve"]
