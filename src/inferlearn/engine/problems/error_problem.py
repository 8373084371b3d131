"""Inference in error coordinates (error-optimised predictive coding, ePC) on any graph the engine reads.

State-based predictive coding minimises the penalty energy over the value nodes ``z_k``
(:class:`~inferlearn.engine.layered.LayeredProblem`, kind ``penalty``). ePC minimises *the same energy* over the
prediction errors ``e_k = z_k − f_k(a_k(z))`` instead: the states are a function of the errors,
rebuilt by one forward pass with the errors injected::

    s_k(e) = f_k(a_k(s)) + e_k,   a_k(s) = Σ_{edges j → k} A_e(s_j),  s_0 = x
    E(e)   = Σ_{k ≤ n} (w_k/2)‖e_k‖² + O(s(e)),   n = L − 1 (clamped output) or L (a free, nudged output node)

with the output term ``O`` of the state problem: ``w_L T_L(y, f_L(a_L))`` with the clamped target (squared error or
cross-entropy), or ``s β ℓ(s_L)`` on a nudged output. The map ``e ↦ s`` is a bijection (``e = 0`` is the forward
pass), so ``E`` has exactly the state energy's minimisers, but its gradient::

    ∂E/∂e_k = w_k e_k + ∂O/∂s_k    (the total derivative of the output term through every path from node k)

comes from one reverse pass: the output error reaches every node on the first step, however deep the network,
where a state step moves it one node down. At ``e = 0`` the second part is exactly back-propagation's delta of the
output term at node ``k``. An :class:`ErrorProblem` wraps a state problem and answers what the inference solvers
(:class:`~inferlearn.engine.solvers.GradientSteps`, :class:`~inferlearn.engine.solvers.OptimizerSteps`) ask of a
problem, with the errors as its variables; :meth:`ErrorProblem.states` maps the solution back to value nodes, where
the state problem reads the weight gradient (states held fixed, so it stays local).

References:
    Goemaere, Oliviers, Bogacz, Demeester, "ePC: Fast and Deep Predictive Coding in Digital Simulation",
    ICML 2026 (arXiv:2505.20137), Eqs. 3-5.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..compiled import CompiledStep
from .layered import LayeredProblem
from .layered_energy import cross_entropy_gradient
from .nudged import NudgedOutputProblem
from .protocol import BatchProblem


def _states_of(links, x: torch.Tensor, p1: torch.Tensor, errors: Sequence[torch.Tensor], n: int):
    """``[s_1, …, s_n]`` and the top prediction ``f_L(a_L(s))`` (in the graph of the current grad mode)."""
    zs = [x, p1 + errors[0]]
    for k in range(2, n + 1):
        link = links[k - 1]
        zs.append(link.act(link.pre(zs)) + errors[k - 1])
    L = len(links)
    top = links[L - 1].act(links[L - 1].pre(zs)) if n < L else zs[L]
    return zs[1:], top


def error_gradients(links, x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor, errors: list[torch.Tensor],
                    weights: tuple[float, ...], output: str, nudge_scale: torch.Tensor | None
                    ) -> list[torch.Tensor]:
    """``∂E/∂e_k = w_k e_k + ∂O/∂s_k`` for every error variable: one forward pass with the errors injected and one
    vector–Jacobian product from the top, with the output term's derivative written out (no energy value built)::

        clamped (n = L − 1):  ∂O/∂p_L = w_L (p_L − y)  or  w_L (softmax(p_L) Σ_j y_j − y)  ("ce"),  p_L = f_L(a_L)
        nudged  (n = L):      ∂O/∂s_L = s β (s_L − y)  or  s β (softmax(s_L) Σ_j y_j − y),  ``nudge_scale`` = s β per row

    A pure function of tensors and constants (``links``: the graph's nodes; ``p1 = f_1(a_1)``, which no error
    changes; ``weights``: ``w_0 … w_L``), so that :data:`EPC_GRAPH_STEP` can compile it.
    """
    L, n = len(links), len(errors)
    with torch.enable_grad():
        es = [e.detach().requires_grad_(True) for e in errors]
        _, top = _states_of(links, x, p1, es, n)
        p = top.detach()
        d = cross_entropy_gradient(p, target) if output == "ce" else p - target
        if n < L:
            d = d.mul_(weights[L])
        else:
            d = d.mul_(nudge_scale.reshape(-1, *([1] * (d.dim() - 1))))
        back = torch.autograd.grad(top, es, d, allow_unused=True)
    return [e.mul(weights[k]) if b is None else b.add_(e, alpha=weights[k])
            for k, (e, b) in enumerate(zip(errors, back), start=1)]


def _error_step(links, x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor, errors: list[torch.Tensor],
                eta: float, weights: tuple[float, ...], output: str, nudge_scale: torch.Tensor | None
                ) -> list[torch.Tensor]:
    """One plain step ``e_k ← e_k − η ∂E/∂e_k`` (:func:`error_gradients`; the errors are unconstrained)."""
    grads = error_gradients(links, x, p1, target, errors, weights, output, nudge_scale)
    return [e.sub(g, alpha=eta) for e, g in zip(errors, grads)]


#: ePC's error step on any graph as one compiled call (forward pass with the errors injected, its vector–Jacobian
#: product traced into the graph, the update), used by :meth:`ErrorProblem.gradient_step` when compilation is active
#: for it; on CPU ``auto`` measures it against eager on its first calls and keeps the faster, as for PC's graph step
EPC_GRAPH_STEP = CompiledStep(_error_step, "the error-optimised PC step", auto_cpu_min_batches=500, autograd=True,
                              measure=True)


class ErrorProblem(BatchProblem):
    """A state problem of the penalty energy (:class:`LayeredProblem` with every row clamped, or
    :class:`NudgedOutputProblem`) solved in error coordinates: the variables are ``[e_1, …, e_n]``, started at 0
    (the forward pass), and :meth:`gradient_step` / :meth:`gradients` are those of ``E(e)`` (module docstring).

    Args:
        states: the state problem (its energy, inputs, targets and output term).
    """

    def __init__(self, states: LayeredProblem):
        e = states.energy
        nudged = isinstance(states, NudgedOutputProblem)
        if e.kind != "penalty" or not (nudged or LayeredProblem._vjp_form(states)):
            raise ValueError("Error coordinates need the penalty energy with a clamped or nudged output")
        self.states_problem, self.energy, self.x = states, e, states.x
        self.nudged = nudged
        if nudged:
            self._target, self._output = states.nudge_target, states.loss
            self._scale = states.nudge_beta * states.signs.to(states.x.dtype)
        else:
            self._target, self._output, self._scale = states.target, e.output, None
        self._zero = None

    @property
    def n_errors(self) -> int:
        return self.depth if self.nudged else self.depth - 1

    def forward_state(self):
        """``(errors, pre)`` at the start: zero errors (the forward pass), and the forward pass's pre-activations."""
        if self._zero is None:
            hidden, pre = self.states_problem.forward_state()
            self._zero = ([torch.zeros_like(h) for h in hidden], pre)
        return self._zero

    def check_feasible(self, errors: Sequence[torch.Tensor]) -> None:
        """Raise ``ValueError`` for the wrong number or shapes of error tensors."""
        zero = self.forward_state()[0]
        if len(errors) != len(zero) or any(e.shape != z.shape for e, z in zip(errors, zero)):
            raise ValueError(f"Expected {len(zero)} error tensors of shapes {[tuple(z.shape) for z in zero]}")

    def _args(self):
        links = self.energy.graph.prime().nodes
        return links, self.x, self.states_problem._first_prediction(), self._target

    def gradients(self, errors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``[∂E/∂e_1, …, ∂E/∂e_n]`` (:func:`error_gradients`)."""
        links, x, p1, target = self._args()
        return error_gradients(links, x, p1, target, list(errors), tuple(self.energy.term_weights), self._output,
                               self._scale)

    def gradient_step(self, errors: list[torch.Tensor], eta: float, norms: list | None = None) -> list[torch.Tensor]:
        """Simultaneous plain steps ``e_k ← e_k − η ∂E/∂e_k`` (new tensors); a list passed as ``norms`` receives the
        prediction errors' norms ``‖e_k‖`` at the old point (the variables themselves)."""
        if norms is not None:
            norms.extend(torch._foreach_norm(list(errors)))
        links, x, p1, target = self._args()
        args = (links, x, p1, target, list(errors), float(eta), tuple(self.energy.term_weights), self._output,
                self._scale)
        if EPC_GRAPH_STEP.active(x.device):
            return EPC_GRAPH_STEP(*args)
        return _error_step(*args)

    def layer_errors(self, errors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The prediction errors ``ε_k = s_k − f_k(a_k(s))`` at the point: the variables themselves."""
        return list(errors)

    @torch.no_grad()
    def states(self, errors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The value nodes ``[s_1, …, s_n]`` of the errors (one forward pass): the state problem's variables."""
        links, x, p1, _ = self._args()
        return _states_of(links, x, p1, list(errors), self.n_errors)[0]
