"""Predictive coding: clamp the output, infer by ``T`` gradient steps on the penalty energy, read off the weights.

Phase structure "one clamped phase" (docs/maths.md §B taxonomy). The penalty energy of the model's chain
(:mod:`inferlearn.engine.layered`, kind ``penalty``)::

    F(z) = Σ_{k<L} ½‖z_k − f_k(a_k)‖² + (π/2)‖y − f_L(a_L)‖²,   a_k = A_k(z_{k-1}),  z_L := y

with value nodes ``z_k`` started from the forward pass, ``T`` simultaneous gradient steps of size ``η``
(:class:`~inferlearn.engine.solvers.GradientSteps`; defaults T = 20, η = 0.1, chosen on validation
splits by ``benchmarks/tune_defaults.py``), and the envelope gradient
``∇_θ F / (Bπ)`` at the inferred ``z``. Any differentiable layer map (conv, max pooling, normalisation
in eval mode) and any element-wise activation are accepted; dense chains use the fused loop of
:func:`~inferlearn.engine.fused.dense_predictive_coding` (tested equal).

With the output error small the equilibrium errors are back-propagation's deltas and the gradient is
back-propagation's (Whittington & Bogacz 2017): exactly in the limit ``π → 0`` (weak clamping, tested);
with the usual hard clamp ``π = 1`` the hidden errors are ``(I + WᵀW)^{-1}``-filtered versions of
back-propagation's deltas. Run to convergence this is also the penalty form of MAC (auxiliary
coordinates with a quadratic penalty, weights updated at the minimiser), restarted on every batch.

References:
    Whittington & Bogacz (2017); Song et al. (2020); Pinchetti et al. (2024), PCX; Carreira-Perpiñán &
    Wang (2014), MAC; Zach, "Bilevel programs meet deep learning", Table 1 (PCN row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.chain import DIFFERENTIABLE, Chain, model_chain
from ..engine.fused import accumulate_dense_grads, dense_predictive_coding
from ..engine.layered import LayeredEnergy, LayeredProblem
from ..engine.solvers import GradientSteps, residual_floor
from ..errors import ConvergenceError
from ..losses import one_hot, quadratic_loss
from ..models import all_finite
from .base import Rule, StepInfo, check_positive, register_rule
from .energy_rule import check_engine


def penalty_energy(chain: Chain, output_weight: float) -> LayeredEnergy:
    """``F(z) = Σ_{k<L} ½‖z_k − f_k(a_k)‖² + (π/2)‖z_L − f_L(a_L)‖²``: hidden terms weight 1, the output ``π``."""
    return LayeredEnergy(chain, "penalty", [1.0] * (chain.depth - 1) + [output_weight])


def check_inference_finite(name: str, chain: Chain, hidden, steps: int, step_size: float) -> None:
    """Raise :class:`ConvergenceError` when gradient-step inference left non-finite value nodes or gradients."""
    grads = [p.grad for link in chain.links for p in link.parameters() if p.grad is not None]
    if not all_finite(list(hidden) + grads):
        raise ConvergenceError(f"{name}: inference diverged (non-finite value nodes after {steps} steps); "
                               f"lower step_size (now {step_size:g})")


@register_rule
@dataclass
class PredictiveCoding(Rule):
    """Predictive coding: penalty energy, clamped output, ``T`` inference steps, weights at the end.

    Args:
        steps: inference steps ``T`` (20; PCX's benchmark setting is 15, which scored 0.003 lower on the
            validation splits, at η = 0.2, for 3/4 of the cost).
        step_size: the inference rate ``η`` (0.1; ``< 2``, since each value node's own term gives ``F`` a
            curvature of at least 1 for box units). Inference is stable only while ``η`` times the largest
            curvature of ``F`` (which grows with the weights) stays below 2: with SGD 0.4, ``η = 0.2``
            diverged in the third epoch on Fashion-MNIST and ``η ≥ 0.3`` fell apart within the first
            (``benchmarks/results/tuning/pc.md``, ``longer.md``).
        tol: stop early when the largest step is ``≤ tol`` (checked every 5 steps; warns when
            ``steps`` run out first); ``None``: exactly ``steps`` steps.
        output_weight: the precision ``π`` of the output term; the gradient is divided by ``π``.
        engine: ``auto`` (fused for dense chains), ``fused`` or ``generic``.

    Convergence: every batch checks the first and the last step
    (:class:`~inferlearn.engine.solvers.GradientSteps`, about 1 % of a batch). At the defaults inference is
    not at equilibrium by design (the gradient is 42-52 % from the equilibrium's on the MNIST MLP, and with ReLU
    units more steps do not settle it), so ``extras["converged"]`` is usually False and nothing warns; one
    :class:`~inferlearn.errors.ConvergenceWarning` per run says when inference is *far* from equilibrium: more
    residual left than the forward pass had, or a layer whose remaining gradient exceeds twice its prediction
    error (the output error has not propagated down: too few or too small steps for the depth, e.g. ``T = 5``,
    ``η ≤ 0.02``, VGG-7, ResNet-20).

    References:
        Whittington & Bogacz (2017); Zach, bilevel paper, Table 1 (PCN row).
    """

    name = "pc"
    recommended_lr = {"sgd": 0.4, "adam": 1e-4}   # benchmarks/tune_defaults.py, validation splits
    steps: int = 20
    step_size: float = 0.1
    tol: float | None = None
    output_weight: float = 1.0
    engine: str = "auto"

    def __post_init__(self) -> None:
        check_positive("output_weight", self.output_weight)
        check_engine(self.engine)
        if isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps == 0:
            raise ValueError("Invalid steps: 0 (predictive coding needs at least one inference step: without one the "
                             "output error stays at the top and only the last layer learns; use steps >= 1)")
        self._solver = GradientSteps(self.steps, self.step_size, self.tol, label=self.name)
        if self.step_size >= 2:   # F's curvature along a value node is at least 1 (its own term): η ≥ 2 diverges
            raise ValueError(f"Invalid step_size: {self.step_size} (must be < 2 for the inference steps to descend)")

    def energy(self, chain: Chain) -> LayeredEnergy:
        """The penalty energy of a chain (hidden terms weight 1, the output term ``π``)."""
        return penalty_energy(chain, self.output_weight)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain, fused = self._chain(model, x)
        if fused:
            return self._clamped(chain, True, x, one_hot(labels, chain.links[-1].linear.out_features, x.dtype))
        free = LayeredProblem(self.energy(chain), x)   # its forward pass gives the output width, and is reused
        n_out = free.forward_state()[1][chain.depth].shape[1]
        return self._clamped(chain, False, x, one_hot(labels, n_out, x.dtype), free)

    def clamped_backward(self, model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> StepInfo:
        """Clamp the output to ``target`` (any values, e.g. one-hot labels), infer and accumulate ``.grad``.

        ``StepInfo.extras`` holds ``inference_steps``, the inferred ``hidden`` layers, ``solver_residual``,
        ``converged`` and ``far`` (see the class docstring).
        """
        return self._clamped(*self._chain(model, x), x, target)

    def _chain(self, model: nn.Module, x: torch.Tensor):
        chain = model_chain(model, DIFFERENTIABLE, self.name, example=x)
        fused = chain.is_dense and self.engine != "generic"
        if self.engine == "fused" and not fused:
            raise ValueError(f"engine='fused' needs a dense chain; {type(model).__name__} is not one: use engine='auto'")
        return chain, fused

    def _clamped(self, chain, fused: bool, x: torch.Tensor, target: torch.Tensor,
                 free: LayeredProblem | None = None) -> StepInfo:
        B, L, pi = x.shape[0], chain.depth, self.output_weight
        if fused:
            grads, output, hidden, it, move, first, layers, floor = dense_predictive_coding(
                chain, x.reshape(B, -1), target, self.steps, self.step_size, pi, self.tol)
            # the same verdict (and warnings) as the generic solver's
            floor = residual_floor(hidden) if floor is None else floor
            info = self._solver.report(it, move, first, layers, floor) if it > 0 else None
            accumulate_dense_grads(chain, grads)
        else:
            free = LayeredProblem(self.energy(chain), x) if free is None else free
            output = chain.links[-1].act(free.forward_state()[1][L])
            problem = free.stacked(1, target=target)
            hidden, info = self._solver.solve(problem)
            it = info.iterations
            problem.accumulate_weight_grads(hidden, 1.0 / (B * pi), precise=False)
        check_inference_finite(self.name, chain, hidden, it, self.step_size)
        extras = {"inference_steps": it, "hidden": [h.detach() for h in hidden]}
        if info is not None:
            extras.update(solver_residual=info.residual, converged=info.converged, far=info.far)
        return StepInfo(loss=float(quadratic_loss(output, target)), output=output.detach(), extras=extras)
