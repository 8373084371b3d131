"""Inference solvers: ``min_z E(z)`` over the hidden layers of a :class:`LiftedProblem`.

Three solvers, all started from the forward pass (the γ → 0 solution) and all returning the hidden
layers plus a :class:`SolveInfo`:

* :class:`CoordinateDescent` (``"cd"``) -- the paper's solver: every hidden unit in turn, in closed
  form, 15 sweeps. Vectorised over the batch, but a Python loop over units: the faithful reference.
* :class:`BlockProjectedGradient` (``"block-pg"``, the default for training) -- layer-wise
  (block Gauss-Seidel) projected-gradient sweeps with the block-optimal step size, both phases of a
  contrastive step fused into one batch, stopped by a tolerance on the step.
* :class:`ReferenceSolver` (``"reference"``) -- float64, block sweeps to a tight tolerance followed
  by active-set Newton polishing with the dense Hessian: machine-precision minimisers for tests.

The problem is a strongly convex QP with box constraints (docs/maths.md §A), so every convergent method
reaches the same minimiser. Non-convergence (iteration limit before the tolerance) warns with
:class:`~inferlearn.errors.ConvergenceWarning` or raises :class:`~inferlearn.errors.ConvergenceError`
(``on_fail``); a non-finite iterate always raises. Nothing loops without a bound.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Sec. 5 (coordinate
    descent, 15 sweeps, forward-pass initialisation); Tseng & Yun (2009) for block coordinate
    gradient descent.
"""
from .block_pg import BlockProjectedGradient
from .coordinate_descent import CoordinateDescent
from .info import (CONVERGED_RTOL, EQUILIBRIUM_STEPS, EQUILIBRIUM_SWEEPS, ON_FAIL, SolveInfo, Solver, act_on_failure,
                   check_options, far_from, finish, first_time, fixed_steps_verdict, judge_far, last_step_stats,
                   max_abs, residual_floor, residual_floor_of, warn_far)
from .lifted_sweep import LIFTED_SWEEP
from .pc_steps import GradientSteps, OptimizerSteps
from .reference import ReferenceSolver

SOLVERS = {"cd": CoordinateDescent, "block-pg": BlockProjectedGradient, "reference": ReferenceSolver}
DEFAULT_SOLVER = "block-pg"


def get_solver(name: str | Solver = DEFAULT_SOLVER, **options) -> Solver:
    """A solver by name (``cd``, ``block-pg``, ``reference``); options go to its constructor.

    Options set to ``None`` are dropped (the solver's default applies).
    """
    if isinstance(name, Solver):
        return name
    if name not in SOLVERS:
        raise ValueError(f"Unknown solver {name!r}; choose one of {sorted(SOLVERS)}")
    options = {k: v for k, v in options.items() if v is not None}
    if name == "cd" and "max_iter" in options:
        options["sweeps"] = options.pop("max_iter")
    return SOLVERS[name](**options)


__all__ = ["BlockProjectedGradient", "CONVERGED_RTOL", "CoordinateDescent", "DEFAULT_SOLVER", "EQUILIBRIUM_STEPS",
           "EQUILIBRIUM_SWEEPS", "GradientSteps", "LIFTED_SWEEP", "ON_FAIL", "OptimizerSteps", "ReferenceSolver", "SOLVERS",
           "SolveInfo", "Solver", "act_on_failure", "check_options", "far_from", "finish", "first_time",
           "fixed_steps_verdict", "get_solver", "judge_far", "last_step_stats", "max_abs", "residual_floor", "residual_floor_of", "warn_far"]
