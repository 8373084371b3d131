"""Equilibrium propagation on the lifted energy: free phase and a ±β-nudged phase.

Phase structure "free and nudged" (docs/maths.md §B taxonomy): infer the free equilibrium ``z* = argmin E``
and a nudged one ``ẑ_β = argmin E + β ℓ̄``, and read the weight gradient off the energy at both::

    positive    ∇W = [∇W E(ẑ₊) − ∇W E(z*)] / (β w_L)
    negative    ∇W = [∇W E(z*) − ∇W E(ẑ₋)] / (β w_L)
    symmetric   ∇W = [∇W E(ẑ₊) − ∇W E(ẑ₋)] / (2β w_L)        (gradient error O(β²))

with ``E`` the lifted energy of :mod:`inferlearn.engine.problems` (feedback weight ``γ``, term weights
``w_k = γ^{k-1}``) and ``ℓ̄(z_L) = w_L gᵀ z_L`` the loss linearised at the free output, ``g = ∂ℓ/∂z_L``
per sample at the free equilibrium. Eliminating the output gives ``z_L = a_L ∓ β g``: β is the step
of the output along the loss gradient, measured against the output term (hence the ``1/w_L``, as
for contrastive learning's ``1/γ^{L-1}``). As ``β → 0`` the rule is implicit differentiation of
``ℓ(z_L*(W))`` through the free equilibrium (Prop. 1; tested against the argmin layer's implicit
backward). That equilibrium is the forward pass only as ``γ → 0`` (with constrained units the
feedback moves it), so the rule approaches back-propagation as ``β, γ → 0``.

The clamped phase instead of the nudged one (``z_L := y``) is contrastive Hebbian learning on the
lifted energy, i.e. :class:`~inferlearn.rules.contrastive.Contrastive` (J_1).

References:
    Scellier & Bengio (2017), equilibrium propagation; Laborieux et al. (2021), symmetric nudging;
    Zach, "Bilevel programs meet deep learning", Definition 1, Prop. 1, Table 1 and Eq. 37.

Note:
    By default (``nudge="linear"``) the nudge uses the linearised loss (the paper's linearised surrogate)
    rather than ``βℓ`` itself, so the nudged problem stays a convex QP for either sign of β and is solved by
    the lifted solvers; both have the same β → 0 limit. ``nudge="loss"`` nudges with the loss itself,
    ``± β w_L ℓ(z_L)`` with the output ``z_L`` a free node (``β CE(y, softmax(z_L))`` for the cross-entropy,
    Laborieux et al. 2021's nudging, on any chain the lifted energy takes: conv nets too). Its stationarity
    conditions are those of the linear nudge with ``g = ∇ℓ(ẑ_L)`` at the *nudged* output
    (``z_L = a_L ∓ β ∇ℓ(z_L)``), so it is solved as a sequence of those QPs: re-linearise at the nudged output,
    re-solve warm-started, until ``g`` moves by at most the phase solver's tolerance (1e-6 without one), at most
    :data:`NUDGE_ROUNDS` rounds (warns, or raises with ``on_fail="raise"``). The rounds contract roughly while
    ``β λ (1 + γ‖W_L‖²) < 1`` with ``λ = ‖∇²ℓ‖`` (½ for the cross-entropy, 1 for the squared error), slowest for
    the negative phase; about 3-6 rounds at β = 0.1. The weight gradient is read off ``E`` as before (the nudge term does not depend on ``W``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.problems import LiftedEnergy, LiftedProblem, contrastive_grads
from ..engine.differential import difference_grads, solve_difference
from ..engine.fused import accumulate_dense_grads
from ..engine.problems import LayeredProblem
from ..engine.phases import check_beta, check_nudging, nudged_phases
from ..engine.solvers import act_on_failure
from ..losses import check_loss, loss_and_gradient, one_hot, quadratic_loss
from .base import StepInfo, register_rule
from .energy_rule import LiftedEnergyRule, info_extras


def _stacked_problem(energy: LiftedEnergy, x: torch.Tensor, nudge: torch.Tensor, beta: float, copies: int,
                     a1: torch.Tensor | None = None) -> LiftedProblem:
    """A nudged dense problem over ``copies`` stacked copies of the batch sharing one ``a_1 = W_0 x + b_0`` (the
    free problem's, when given)."""
    a1 = energy.pre(1, x) if a1 is None else a1
    return LiftedProblem(energy, torch.cat([x] * copies), nudge=nudge, beta=beta, check=False,
                         a1=torch.cat([a1] * copies))


#: the most re-linearisations of a nudged phase with ``nudge="loss"``
NUDGE_ROUNDS = 50
NUDGES = ("linear", "loss")


def relinearised_phases(solver, problem, hidden, info, row_sign: torch.Tensor, labels: torch.Tensor, loss: str,
                        on_fail: str = "warn"):
    """Solve nudged phases with the loss itself: ``min_z E(z) + s β ℓ(z_L)`` per row (sign ``s``, ``row_sign``
    ``(rows, 1)``), from the linearised phases ``(problem, hidden, info)`` already solved.

    Repeats ``g ← s ∇ℓ(ẑ_L)`` at the nudged output and a warm-started solve of the linear nudge ``β gᵀz_L`` until
    ``max|Δg| ≤`` the solver's tolerance (1e-6 without one). Returns ``(problem, hidden, info, rounds)``: the last
    problem (its eliminated output is the nudged one) and its minimiser.
    """
    tol = getattr(solver, "tol", None) or 1e-6
    for rounds in range(1, NUDGE_ROUNDS + 1):
        with torch.no_grad():
            nudge = row_sign * loss_and_gradient(loss, problem.full(hidden)[-1], labels)[1]
        change = float((nudge - problem.nudge.detach()).abs().max())
        if change <= tol:
            return problem, hidden, info, rounds
        problem = problem.with_nudge(nudge)
        hidden, info = solver.solve(problem, init=hidden)
    msg = (f"eqprop: the loss nudge did not settle in {NUDGE_ROUNDS} re-linearisations (last change of its gradient "
           f"{change:.3g} > {tol:.3g}); lower beta")
    act_on_failure(msg, on_fail, stacklevel=4)
    return problem, hidden, info, NUDGE_ROUNDS


@register_rule
@dataclass
class EquilibriumPropagation(LiftedEnergyRule):
    """Equilibrium propagation (free and nudged phase) on the lifted energy.

    Args:
        beta: nudging strength ``β > 0`` (the output moves by ``β g``). ``β → 0`` is implicit
            differentiation through the *lifted* free equilibrium, which is back-propagation only as ``γ → 0``
            as well (the limit is 29 % from back-propagation's gradient at γ = 1/8 and 15 % at γ = 1/32 on an
            MNIST MLP 784-32-32-32-10 at initialisation; ``benchmarks/results/limits.md``).
        nudging: ``"positive"``, ``"negative"`` or ``"symmetric"`` (one stacked solve of ``±β``).
        loss: ``"quadratic"`` or ``"cross-entropy"`` (the loss whose gradient nudges the output).
        nudge: ``"linear"``, the loss linearised at the free output (``β w_L gᵀz_L``), or ``"loss"``, the loss
            itself (``β w_L ℓ(z_L)``, e.g. ``β CE(y, softmax(z_L))``; see the module's note). ``"loss"`` solves its
            phases directly (``phases="differential"`` is refused); ``extras["nudge_rounds"]`` counts its
            re-linearisations.

    The lifted-energy options (``gamma``, ``solver``, ``max_iter``, ``tol``, ``on_fail``, ``engine``) are
    those of :class:`~inferlearn.rules.energy_rule.LiftedEnergyRule`.

    References:
        Scellier & Bengio (2017); Zach, bilevel paper, Table 1 ("energy + β·loss, β → 0").
    """

    name = "eqprop"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # SGD: benchmarks/tune_defaults.py (Adam: not tuned)
    beta: float = 0.1
    nudging: str = "symmetric"
    loss: str = "quadratic"
    nudge: str = "linear"

    def __post_init__(self) -> None:
        check_beta(self.beta)
        super().__post_init__()
        check_nudging(self.nudging)
        check_loss(self.loss)
        if self.nudge not in NUDGES:
            raise ValueError(f"Invalid nudge: {self.nudge!r}; choose one of {list(NUDGES)}")
        if self.nudge == "loss" and self.phases == "differential":
            raise ValueError("Invalid phases: 'differential' (nudge='loss' solves its phases directly; use phases='auto')")

    def differential(self, fused: bool, depth: int, dtype: torch.dtype, beta: float | None = None) -> bool:
        return self.nudge == "linear" and super().differential(fused, depth, dtype, beta)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain, fused = self.chain(model, x)
        if self.differential(fused, chain.depth, x.dtype, beta=self.beta):
            return self._dense(chain, x, labels, differential=True)
        self.check_precision(chain.levels[-1], x.dtype, beta=self.beta)
        if fused:
            return self._dense(chain, x, labels)
        energy = self.layered_energy(chain)
        B, L = x.shape[0], energy.depth
        wL = energy.term_weights[L]
        free = LayeredProblem(energy, x)
        output = free.forward_state()[1][L]
        h_free, info_free = self._solver.solve(free)
        _, g = loss_and_gradient(self.loss, free.full(h_free)[-1], labels)   # at the free equilibrium
        phases = nudged_phases(self.nudging)
        nudge = torch.cat([p.sign * g for p in phases])
        # the stacked problem's starting point is the free equilibrium (its forward state)
        problem = free.stacked(len(phases), init=h_free, nudge=nudge, beta=self.beta * wL)
        solver = self.phase_solver(chain.levels[-1], self.beta)
        hidden, info = solver.solve(problem)
        extras = {}
        if self.nudge == "loss":
            signs = torch.cat([torch.full((B, 1), float(p.sign), dtype=x.dtype, device=x.device) for p in phases])
            problem, hidden, info, rounds = relinearised_phases(solver, problem, hidden, info, signs,
                                                                torch.cat([labels] * len(phases)), self.loss, self.on_fail)
            extras["nudge_rounds"] = rounds
        scale = 1.0 / (self.beta * wL * B)
        coef = torch.cat([torch.full((B,), p.weight * scale, dtype=x.dtype, device=x.device) for p in phases])
        problem.accumulate_weight_grads(hidden, coef)
        y = one_hot(labels, output.shape[1], output.dtype)
        extras = info_extras(info) | {"free_solver_iterations": info_free.iterations} | extras
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=extras)

    def _dense(self, chain, x: torch.Tensor, labels: torch.Tensor, differential: bool = False) -> StepInfo:
        energy, x, y = self.dense_inputs(chain, x, labels)
        B, L = x.shape[0], energy.depth
        wL = energy.term_weights[L]
        free = energy.problem(x, check=False)       # x was validated by Rule.backward
        output = free.forward_state()[1][L]          # the plain forward pass, reported as the loss
        h_free, info_free = self._solver.solve(free)
        zs_free = free.full(h_free)
        _, g = loss_and_gradient(self.loss, zs_free[-1], labels)   # at the free equilibrium z_L*
        scale = 1.0 / (self.beta * wL * B)
        if differential:   # each nudged phase for its difference from the free one (engine/differential.py)
            pre, b = free.pre_of(h_free), self.beta * wL
            grads, sweeps, rel = None, 0, 0.0
            for phase in nudged_phases(self.nudging):
                if phase.sign == 0:   # the free phase: its difference from itself is zero
                    continue
                steps = self.difference_steps(energy, x, nudge=phase.sign * g, b=b)
                delta, it, r = solve_difference(energy, x, h_free, pre, steps, nudge=phase.sign * g, b=b)
                sweeps, rel = sweeps + it, max(rel, r)
                coef = phase.weight * scale
                part = [(gw.mul_(coef), gb.mul_(coef)) for gw, gb in
                        difference_grads(energy, x, h_free, pre, delta, nudge=phase.sign * g, b=b)]
                grads = part if grads is None else [(a + c, d + e) for (a, d), (c, e) in zip(grads, part)]
            accumulate_dense_grads(chain, grads)
            extras = {"solver_iterations": sweeps, "solver_residual": rel, "free_solver_iterations": info_free.iterations}
            return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=extras)
        solver, extras = self.phase_solver(L, self.beta), {}
        if self.nudging == "symmetric":
            problem = _stacked_problem(energy, x, torch.cat([g, -g]), self.beta * wL, 2, a1=free.a1)
            hidden, info = solver.solve(problem, init=[torch.cat([h, h]) for h in h_free])
            if self.nudge == "loss":
                signs = torch.cat([torch.ones(B, 1, dtype=x.dtype, device=x.device), -torch.ones(B, 1, dtype=x.dtype,
                                                                                                   device=x.device)])
                problem, hidden, info, extras["nudge_rounds"] = relinearised_phases(
                    solver, problem, hidden, info, signs, torch.cat([labels, labels]), self.loss, self.on_fail)
            # ½·scale·Σ[∇E(z⁺) − ∇E(z⁻)]: the two halves share x, so the first layer's term is one product over B
            # rows, (z₁⁻ − z₁⁺) xᵀ, and the solver's pre-activations are reused (contrastive_grads)
            grads = contrastive_grads(energy, problem.full(hidden), -0.5 * scale, problem.pre_of(hidden))
        else:
            sign = 1.0 if self.nudging == "positive" else -1.0
            problem = _stacked_problem(energy, x, g, sign * self.beta * wL, 1)
            hidden, info = solver.solve(problem, init=list(h_free))
            if self.nudge == "loss":   # the sign is in β: the direction is ∇ℓ itself
                problem, hidden, info, extras["nudge_rounds"] = relinearised_phases(
                    solver, problem, hidden, info, torch.ones(B, 1, dtype=x.dtype, device=x.device), labels,
                    self.loss, self.on_fail)
            g_nudged = energy.weight_grads(problem.full(hidden), sign * scale)
            g_free = energy.weight_grads(zs_free, -sign * scale)
            grads = [(a + c, b + d) for (a, b), (c, d) in zip(g_nudged, g_free)]
        accumulate_dense_grads(chain, grads)
        extras = info_extras(info) | {"free_solver_iterations": info_free.iterations} | extras
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(), extras=extras)
