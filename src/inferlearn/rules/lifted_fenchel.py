"""Lifted Fenchel networks / LPOM: clamped inference on the Fenchel–Young-gap energy, weights at the end.

The layer energy is the Fenchel–Young gap of the unit's convex potential, for a box unit ``C``
(``f = Π_C``; :mod:`inferlearn.engine.problems`, kind ``fenchel``)::

    E_k = G(z_k) + G*(a_k) − z_kᵀ a_k = ½‖z_k − a_k‖² − ½‖Π_C(a_k) − a_k‖²  ≥ 0,   z_k ∈ C

zero exactly when ``z_k = f(a_k)``; convex in ``z_k`` and in ``z_{k-1}`` separately (layer-wise
convex, jointly not), with ``∂E_k/∂a_k = Π_C(a_k) − z_k``. Term weights ``w_k = γ^{k-1}`` as in the
lifted energy, the output term is ``½‖y − a_L‖²`` (clamped). Inference: block (layer-wise) projected
gradient sweeps from the forward pass, each layer's step ``η/(w_k + w_{k+1}‖A_{k+1}‖²)``
(:class:`~inferlearn.engine.solvers.BlockProjectedGradient` with ``safe_steps``). The gradient of
layer ``k`` is divided by its term weight ``w_k`` (as :class:`~inferlearn.rules.lifted.LiftedJ0`
does). This is the lifted Fenchel network / LPOM row of the taxonomy, which does *not* contain
back-propagation as a limit case. Any chain of affine maps with box units. LPOM's own updates
(closed-form output, fixed-point block updates, the exact gradient of its objective) are the rule
:class:`~inferlearn.rules.lpom.LPOM` (``lpom``).

References:
    Gu et al. (2020), Fenchel lifted networks; Li et al. (2019), LPOM; Zach, "Bilevel programs meet
    deep learning", Table 1; docs/maths.md §B.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import AFFINE, Graph, read_graph
from ..engine.problems import check_gamma
from ..engine.problems import LayeredEnergy, LayeredProblem
from ..engine.solvers import EQUILIBRIUM_STEPS, BlockProjectedGradient
from ..losses import one_hot, quadratic_loss
from .base import Rule, StepInfo, check_positive, register_rule


@register_rule
@dataclass
class LiftedFenchel(Rule):
    """Lifted Fenchel network / LPOM: Fenchel–Young-gap energy, clamped output, block sweeps.

    Args:
        steps: block sweeps (0 keeps the forward pass).
        step_size: ``η ∈ (0, 2)``, the multiplier of the safe block step ``1/(w_k + w_{k+1}‖A_{k+1}‖²)``.
        gamma: term weights ``w_k = γ^{k-1}``.
        tol: stop early when the largest step (activation units) is ``≤ tol``; ``None``: exactly
            ``steps`` sweeps.

    References:
        Gu et al. (2020); Li et al. (2019); Zach, bilevel paper, Table 1.
    """

    name = "lifted-fenchel"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # SGD: benchmarks/tune_defaults.py (Adam: not tuned)
    steps: int = 15
    step_size: float = 1.0
    gamma: float = 1 / 8
    tol: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 0:
            raise ValueError(f"Invalid steps: {self.steps}")
        check_positive("step_size", self.step_size)
        if self.step_size >= 2:
            raise ValueError(f"Invalid step_size: {self.step_size} (must be < 2 for the sweeps to descend)")
        check_gamma(self.gamma)
        if self.tol is not None:
            check_positive("tol", self.tol)
        self._solver = BlockProjectedGradient(max_iter=max(self.steps, 1), tol=self.tol, check_every=1,
                                              on_fail="warn", relaxation=self.step_size, safe_steps=True)

    def equilibrium_options(self) -> dict:
        """:data:`~inferlearn.engine.solvers.EQUILIBRIUM_STEPS` steps of the recursion, no early stop."""
        return {"steps": max(self.steps, EQUILIBRIUM_STEPS), "tol": None}

    def energy(self, chain: Graph) -> LayeredEnergy:
        """The Fenchel–Young-gap energy of a chain, term weights ``γ^{k-1}``."""
        return LayeredEnergy.lifted(chain, self.gamma, kind="fenchel")

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        free = LayeredProblem(self.energy(read_graph(model, AFFINE, self.name, example=x)), x)
        output = free.forward_state()[1][free.depth]   # the output width, and a forward pass that is reused
        return self._clamped(free, one_hot(labels, output.shape[1], x.dtype))

    def clamped_backward(self, model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> StepInfo:
        """Clamp the output to ``target``, infer and accumulate ``.grad`` (``extras``: steps, ``hidden``)."""
        return self._clamped(LayeredProblem(self.energy(read_graph(model, AFFINE, self.name, example=x)), x), target)

    def _clamped(self, free: LayeredProblem, target: torch.Tensor) -> StepInfo:
        energy, B, L = free.energy, free.batch, free.depth
        output = free.forward_state()[1][L]
        problem = free.stacked(1, target=target)
        if self.steps:
            hidden, info = self._solver.solve(problem)
            it = info.iterations
        else:
            hidden, it = problem.forward_state()[0], 0
        problem.accumulate_weight_grads(hidden, 1.0 / B, [1.0 / w for w in energy.term_weights[1:]], precise=False)
        return StepInfo(loss=float(quadratic_loss(output, target)), output=output.detach(),
                        extras={"inference_steps": it, "hidden": [h.detach() for h in hidden]})
