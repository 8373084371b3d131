"""Nudged predictive coding's problem: the output a free value node nudged by the loss."""
from __future__ import annotations

import torch

from .layered import LayeredProblem
from .layered_energy import OUTPUTS, LayeredEnergy, cross_entropy_gradient


class NudgedOutputProblem(LayeredProblem):
    """A penalty-energy problem whose output ``z_L`` is a free value node nudged by the loss (nudged predictive
    coding): the variables are ``[z_1, …, z_{L-1}, z_L]`` (the output last) and the per-row energy is::

        F_s(z) = Σ_{k≤L} w_k ½‖z_k − f_k(a_k)‖² + s β ℓ(z_L),   ℓ = ½‖z_L − y‖² ("se") or CE(y, softmax(z_L)) ("ce")

    with a sign ``s`` per row (``+1``, ``−1``, or 0 for the free phase), so stacked rows solve several nudged
    phases at once. Without the nudge the minimum is the forward pass (every term zero). Gradients of the value
    nodes come from autograd of :meth:`value` (no closed form), and the weight gradient of the energy
    (:meth:`~LayeredProblem.accumulate_weight_grads`) leaves the nudge out (it does not depend on the parameters).

    Args:
        energy: a ``penalty`` energy with the squared-error output term.
        x: inputs (rows).
        target: ``y`` per row.
        signs: ``s`` per row ``(rows,)``.
        beta: ``β > 0``.
        loss: ``"se"`` or ``"ce"``.
        a1: ``A_1(x)`` if already computed.
    """

    def __init__(self, energy: LayeredEnergy, x: torch.Tensor, target: torch.Tensor, signs: torch.Tensor,
                 beta: float, loss: str = "se", a1: torch.Tensor | None = None):
        if energy.kind != "penalty" or energy.output != "se" or loss not in OUTPUTS:
            raise ValueError("A nudged output needs the penalty energy with the squared-error output term, and a loss "
                             f"in {list(OUTPUTS)}")
        super().__init__(energy, x, a1=a1)
        self.nudge_target, self.signs, self.nudge_beta, self.loss = target, signs, float(beta), loss

    @torch.no_grad()
    def forward_state(self):
        """The forward pass with the output node at ``a_L``: ``([z_1, …, z_{L-1}, a_L], pre)``."""
        if self._fwd is None:
            hidden, pre = super().forward_state()
            self._fwd = ([*hidden, pre[self.depth]], pre)
        return self._fwd

    def full(self, hidden, pre=None):
        return [self.x, *hidden]

    def _closed_form(self) -> bool:
        return False

    def _vjp_form(self) -> bool:
        return True

    def _penalty_gradients(self, hidden, errors=None):
        """:meth:`LayeredProblem._penalty_gradients` with the free output node's own term and its nudge
        ``s β ∂ℓ/∂z_L`` (``z_L − y``, or ``softmax(z_L) Σ_j y_j − y``) added to the last gradient."""
        grads = super()._penalty_gradients(hidden, errors)
        z, y = hidden[-1], self.nudge_target
        d = z - y if self.loss == "se" else cross_entropy_gradient(z, y)
        s = (self.nudge_beta * self.signs.to(z.dtype)).reshape(-1, *([1] * (z.dim() - 1)))
        grads[-1].addcmul_(s, d)
        return grads

    def value(self, hidden, fresh_a1=None):
        """Per-row ``F_s`` (differentiable in the value nodes and, in grad mode, the parameters)."""
        e, z = self.energy, hidden[-1]
        pre = self.pre_of(hidden, torch.is_grad_enabled() if fresh_a1 is None else fresh_a1)
        zs = self.full(hidden)
        v = sum(e.term_weights[k] * e.term(k, zs[k], pre[k]) for k in range(1, self.depth + 1))
        y = self.nudge_target
        if self.loss == "se":
            ell = 0.5 * (z - y).pow(2).flatten(1).sum(1)
        else:
            ell = -(y * torch.log_softmax(z.flatten(1), dim=1)).sum(1)
        return v + (self.nudge_beta * self.signs.to(v.dtype)) * ell
