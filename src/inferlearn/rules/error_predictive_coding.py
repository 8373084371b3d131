"""Error-optimised predictive coding (ePC): predictive coding's energy, inferred in the coordinates of its errors.

The energy, its minimisers and the weight gradient are state-based predictive coding's
(:class:`~inferlearn.rules.predictive_coding.PredictiveCoding`: the penalty energy, squared-error or cross-entropy
output term, clamped or nudged output, ``∇_θ F / (Bπ)`` read off the state energy at the inferred point with the
states held fixed, so the weight update stays local); only the variables of inference change. ePC's variables are
the prediction errors ``e_k`` (started at 0, the forward pass), the states a function of them
(:mod:`inferlearn.engine.problems`)::

    s_k = f_k(a_k(s)) + e_k,     E(e) = Σ_{k<L} ½‖e_k‖² + π ℓ(f_L(a_L(s)), y),     e ← e − η ∂E/∂e   (K times)

and ``∂E/∂e`` is one forward pass with the errors injected and one reverse pass, so the output error reaches every
node at the first step. State PC moves it one node per step: after ``T`` steps node ``L − d`` has seen about
``C(T, d) ηᵈ`` of it, which is why deep state-based networks train only their top (``benchmarks/results/depth.md``).

**Regimes.** From ``e = 0`` one plain step gives ``e_k = −η δ_k``, ``δ_k`` back-propagation's delta of ``πℓ`` at node
``k`` (exactly, at zero errors), and ``K`` small steps ``e_k ≈ −(1 − (1 − η)^K) δ_k``; the weight gradient of a
hidden node's map is then ``c_K`` times back-propagation's, ``c_K = 1 − (1 − η)^K ≈ Kη``, and the output layer's is
back-propagation's itself (``O(η)`` corrections; tested). So with a small error step and few iterations ePC's update
is back-propagation's direction with the hidden layers scaled by ``c_K`` (its authors' ``BP = ePC / e_lr``); run to
convergence it is state-based PC's equilibrium, whose hidden errors are ``(I + JᵀJ)^{-1}``-filtered deltas. Both are
legitimate and differ. The defaults are in the first regime: ``η = 1e-4``, ``K = 5`` (``c_K = 5e-4``), chosen with
Adam on validation splits (``benchmarks/tune_defaults.py --rules epc``: η = 1e-4 and 1e-3 tied, larger steps scored
lower and η ≥ 0.01 collapsed at Adam 3e-3) and made the smaller of the two because η = 1e-3 (the ePC paper's VGG
setting) overshoots once training grows the network's gain — the regime needs ``η λ_max(1 + JᵀJ) ≪ 1`` (VGG-5 at
AdamW 3e-3 and the 128-layer residual MLP, ``benchmarks/results/tuning/epc.md``). There ePC trains like
back-propagation with Adam, which is blind to the per-layer scale; with plain SGD the hidden layers learn ``c_K``
times slower, so use Adam, or a larger ``step_size``. ``benchmarks/bench_epc_alignment.py`` measures how far
the defaults' gradient is from back-propagation's and from the equilibrium's.

Convergence: the checks of :class:`~inferlearn.engine.solvers.GradientSteps` (the first and the last step; a solve
whose last step is more than ``GROWTH_RTOL`` = 1.5 times the first warns once per run, here with the reading that the steps overshoot and the fix
of a smaller step), without its per-layer criterion, which detects an
output error that has not reached a layer: in error coordinates it reaches every layer on the first step.

References:
    Goemaere, Oliviers, Bogacz, Demeester, "ePC: Fast and Deep Predictive Coding in Digital Simulation", ICML 2026
    (arXiv:2505.20137); Whittington & Bogacz (2017).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import COUPLED, read_graph
from ..engine.problems import ErrorProblem
from ..engine.problems import LayeredProblem
from ..engine.solvers import GradientSteps
from .base import register_rule
from .predictive_coding import PredictiveCoding


#: the growth ``r_K / r_0`` of ePC's error steps above which they overshoot (the *far* warning)
GROWTH_RTOL = 1.5


@register_rule
@dataclass
class ErrorPredictiveCoding(PredictiveCoding):
    """Error-optimised predictive coding: PC's energy and weight gradient, ``K`` steps on the errors.

    Args:
        steps: error iterations ``K`` (5, as in the ePC paper's benchmarks); each costs one forward and one reverse
            pass, and the weight gradient one more.
        step_size: the error step ``η`` (1e-4, per sample: the energy is summed over the batch; ``< 2``, and small
            enough for the error energy's curvature ``1 + λ_max(JᵀJ)``, which grows with the network's gain).
        inference_optimizer: ``"sgd"`` (plain steps), ``"momentum"`` or ``"adam"`` on the errors (PC's options).
        engine: ``"auto"`` or ``"generic"`` (ePC has no fused dense loop: every model runs on the graph engine).
        rescale: divide each hidden node's term of the weight gradient by ``c_K = 1 − (1 − η)^K`` (default
            ``False``, the ePC paper's update). In the small-step regime the update is then back-propagation's at
            every layer, not only up to a per-layer scale (the authors' ``BP = ePC / e_lr``): plain SGD needs no
            larger rate, and hidden gradients of size ``c_K`` × BP's no longer fall under Adam's ``ε`` (on a
            transformer, where the error step must be ≤ 1e-5, they do). The output layer's term is unscaled.
            Plain error steps only (``c_K`` is their gain from ``e = 0``).

    The other options (``output``, ``output_weight``, ``nudging``, ``beta``, ``tol``, ``inference_momentum``) are
    :class:`PredictiveCoding`'s; ``weight_step`` (incremental PC) is not an ePC option.
    """

    name = "epc"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # benchmarks/tune_defaults.py --rules epc, validation splits
    steps: int = 5
    step_size: float = 0.0001
    rescale: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.rescale, bool):
            raise ValueError(f"Invalid rescale: {self.rescale!r} (true or false)")
        if self.rescale and self.inference_optimizer != "sgd":
            raise ValueError(f"Invalid rescale with inference_optimizer={self.inference_optimizer!r}: the scale "
                             "1 − (1 − η)^K is the gain of plain error steps; use inference_optimizer='sgd'")
        if self.rescale and self.nudging not in ("clamp", "target"):
            raise ValueError(f"Invalid rescale with nudging={self.nudging!r}: the nudged phases' hidden errors are "
                             "not c_K-scaled deltas; use nudging='clamp' or 'target'")
        if self.weight_step is not None:
            raise ValueError(f"Invalid weight_step: {self.weight_step} (incremental PC is a state-based option; "
                             "use --rule pc for iPC)")
        if self.engine == "fused":
            raise ValueError("Invalid engine: 'fused' (ePC runs on the graph engine; use engine='auto')")
        if isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps < 1:
            raise ValueError(f"Invalid steps: {self.steps} (ePC needs at least one error iteration: without one the "
                             "errors stay 0 and only the last layer learns; use steps >= 1)")
        super().__post_init__()

    def equilibrium_options(self) -> None:
        """``None``: at its defaults ePC stands for back-propagation's direction (the small-step regime, module
        docstring), not for the equilibrium, which ``step_size = 1e-4`` would take millions of steps to reach;
        ``benchmarks/bench_epc_alignment.py`` measures its distance from both."""
        return None

    def _inference_solver(self) -> GradientSteps:
        solver = super()._inference_solver()
        solver.far_layer = None   # the output error reaches every layer at the first step (module docstring)
        # from e = 0 the plain steps shrink while η λ_max(1 + JᵀJ) < 2: a growing step is an overshoot. In the
        # small-step regime (the defaults) the steps stay nearly equal (η λ ≪ 1: the last 1.007× the first on VGG-5),
        # which is not an overshoot: only a growth beyond GROWTH_RTOL (a per-step factor above 1.1 over K = 5) is
        solver.far_rtol = GROWTH_RTOL
        solver.growth_fix = ("the error steps overshoot: η λ_max(1 + JᵀJ) > 2, a curvature that grows with the network's "
                             "gain as training grows the weights; lower step_size (now {step_size:g})")
        return solver

    def hidden_gradient_scale(self) -> float:
        """``1 / c_K`` with ``rescale``, else 1: the factor of each hidden node's weight-gradient term."""
        return 1.0 / -math.expm1(self.steps * math.log1p(-self.step_size)) if self.rescale else 1.0

    def _infer(self, problem: LayeredProblem):
        """Solve the state problem in error coordinates; returns its value nodes at the final errors."""
        errors_problem = ErrorProblem(problem)
        errors, info = self._solver.solve(errors_problem)
        return (errors_problem.states(errors) if errors else []), info

    def _chain(self, model: nn.Module, x: torch.Tensor):
        return read_graph(model, COUPLED, self.name, example=x), False

    def dense_plan(self, model: nn.Module):
        """``None``: ePC has no whole-batch fused loop."""
        return None
