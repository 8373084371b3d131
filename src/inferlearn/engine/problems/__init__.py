"""Inference problems: one batch of ``min_z E(z)`` on an energy, behind one protocol (:mod:`.protocol`).

* :mod:`.layered_energy` -- the layered energies on any graph (lifted, penalty, Fenchel terms) and the bounds of
  their maps;
* :mod:`.layered` -- :class:`LayeredProblem`, a batch on a layered energy; :mod:`.nudged` -- its nudged-output form
  (nudged predictive coding); :mod:`.penalty` -- the penalty energy's compiled value-node gradients;
* :mod:`.dense` -- the dense lifted energy and :class:`LiftedProblem` (the paper's MLPs, with a dense Hessian);
* :mod:`.error_problem` -- :class:`ErrorProblem`, error-optimised PC's problem over the errors.
"""
from .dense import LiftedEnergy, LiftedProblem, check_gamma, contrastive_grads, contrastive_problem
from .error_problem import EPC_GRAPH_STEP, ErrorProblem, error_gradients
from .layered import LayeredProblem
from .layered_energy import (KINDS, OUTPUTS, Adjoint, LayeredEnergy, cross_entropy_gradient, gram_lambda_max,
                             gram_norm_bound, operator_norm_sq, version_key)
from .nudged import NudgedOutputProblem
from .penalty import GRAPH_AUTO_CPU_MIN_BATCHES, PC_GRAPH_STEP, penalty_gradients, pre_float64
from .protocol import BatchProblem, Problem

__all__ = ["Adjoint", "BatchProblem", "EPC_GRAPH_STEP", "ErrorProblem", "GRAPH_AUTO_CPU_MIN_BATCHES", "KINDS",
           "LayeredEnergy", "LayeredProblem", "LiftedEnergy", "LiftedProblem", "NudgedOutputProblem", "OUTPUTS",
           "PC_GRAPH_STEP", "Problem", "check_gamma", "contrastive_grads", "contrastive_problem", "cross_entropy_gradient",
           "error_gradients", "gram_lambda_max", "gram_norm_bound", "operator_norm_sq", "penalty_gradients",
           "pre_float64", "version_key"]
