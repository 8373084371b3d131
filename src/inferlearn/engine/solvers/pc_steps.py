"""Predictive coding's inference: gradient steps on the value nodes, plain (:class:`GradientSteps`) or by an optimiser
(:class:`OptimizerSteps`), with the convergence checks of every solve."""
from __future__ import annotations

import math

import torch

from .info import (CONVERGED_RTOL, Solver, SolveInfo, act_on_failure, check_options, fixed_steps_verdict,
                   last_step_stats, max_abs, residual_floor, warn_far)


class GradientSteps(Solver):
    """Predictive coding's inference: simultaneous (projected) gradient steps on every hidden layer::

        z_k ← Π_k( z_k − η ∂E/∂z_k ),   k = 1 … L−1, all from the same point

    with ``∂E/∂z`` by autograd through each layer's forward (any differentiable map), ``steps``
    times, or until the largest step ``max |η ∂E/∂z|`` is at most ``tol`` (checked every 5 steps).

    **Convergence check** (every solve, by-products of two steps): the first step gives the signal
    ``r_0 = η max|∂E/∂z|`` at the forward pass (for a warm start, ``init``, one more gradient evaluation there);
    the last step gives, at its start, the residual ``r_T`` (the same measure, reported as
    ``SolveInfo.residual``) and per hidden layer the ratio ``q_k = ‖∂E/∂z_k‖ / ‖ε_k‖`` of its remaining
    gradient to its prediction error ``ε_k = z_k − f_k(a_k)`` (the error its weight gradient is made of; one
    forward pass). Without ``tol`` the solve is *converged* when ``r_T ≤ 1e-3 r_0``
    (:data:`CONVERGED_RTOL`), and *far* from equilibrium — warned once per solver, i.e. once per run — when

    * ``r_T > far_rtol · r_0`` (1): more residual left than the forward pass had, i.e. the steps did not
      relax the starting point (MAC's coordinates stored in an earlier epoch, at a smaller μ: measured
      4.8 … 37× the forward pass's after 30 steps in the digits demo, epochs 13-22, with a W-step gradient
      9 … 26× away from the Z-minimiser's); or
    * ``max_k q_k > far_layer`` (2): continuing would change some layer's error by more than twice its size,
      so its weight gradient reflects how far the output error propagated in ``T`` steps, not the equilibrium
      (the small-step limit, where layer ``d`` below the output receives ``(ηT)^d/d!`` of it).

    Predictive coding is not at equilibrium at its defaults by design (``T = 20`` steps of ``η = 0.1``; with
    ReLU units the steps never settle: the residual stalls at 0.1 of ``r_0`` even after 8000 steps, the
    kinks of ``f``), so "converged" is False there and the *far* thresholds sit above what the library's
    standard runs reach: ``max q_k`` ≤ 0.6 on the MNIST and digits MLPs, 0.8 on ``conv:8-16/64``, 1.4 on
    ``vgg5:width=0.25``, and ``r_T / r_0`` ≤ 0.5 (``benchmarks/investigations/convergence_checks.py``). PCX's
    setting (T = 15, η = 0.3) stays below 0.5; ``T = 5`` (``q`` up to 6.7), ``η ≤ 0.02`` (up to 15),
    ``vgg7`` (2.8) and ``resnet20`` (up to 24) warn.

    Args:
        steps: the number of steps ``T`` (PCX's benchmark setting: 15); 0 keeps the forward pass.
        step_size: the inference rate ``η``.
        tol: optional early-stopping tolerance (activation units); with ``tol`` set, stopping at
            ``steps`` before reaching it warns (``on_fail``).
        on_fail: ``"warn"``, ``"raise"`` or ``"ignore"`` (a missed ``tol``, or a solve far from equilibrium).
        far_rtol: the *far* threshold on ``r_T / r_0`` (``None``: off).
        far_layer: the *far* threshold on ``max_k q_k`` (``None``: off).
        label: the name the warnings give (e.g. ``"pc"``, ``"mac Z-step"``).
        advice: appended to the fix that a *far* warning suggests (a rule's own remedy).

    References:
        Whittington & Bogacz (2017); PCX (Pinchetti et al. 2024), T = 15.
    """

    name = "pc-steps"
    in_place = True    # Solver.solve hands over copies; the steps update them in place
    #: the reading and fix of a last step larger than the first (``{step_size}`` is filled in); ``None``: PC's (the
    #: steps did not relax the start); ePC sets it: there the steps overshoot
    growth_fix: str | None = None

    def __init__(self, steps: int = 15, step_size: float = 0.1, tol: float | None = None, on_fail: str = "warn",
                 far_rtol: float | None = 1.0, far_layer: float | None = 2.0, label: str | None = None,
                 advice: str = ""):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"Invalid steps: {steps}")
        if not (isinstance(step_size, (int, float)) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"Invalid step_size: {step_size}")
        check_options(max(steps, 1), tol, on_fail)
        self.steps, self.step_size, self.tol, self.on_fail = steps, float(step_size), tol, on_fail
        self.far_rtol, self.far_layer, self.label, self.advice = far_rtol, far_layer, label or self.name, advice

    def solve(self, problem, init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], SolveInfo]:
        """As :meth:`Solver.solve`; from a warm start ``init`` the signal ``r_0`` is measured at the forward pass."""
        if not callable(getattr(problem, "gradient_step", None)):
            raise TypeError(f"GradientSteps solves problems with a gradient_step method (value nodes or errors), not "
                            f"{type(problem).__name__}")
        if problem.depth == 1:
            return [], SolveInfo(self.name, 0, 0.0, True, None)
        signal = None
        if init is None:
            hidden = problem.forward_state()[0]
        else:
            problem.check_feasible(init)
            hidden = list(init)
            if self.steps:
                fwd = problem.forward_state()[0]
                with torch.no_grad():
                    grads = problem.gradients(fwd)
                    signal = self.step_size * float(torch.stack(max_abs(grads)).max())
        with torch.no_grad():
            return self._run(problem, [z.clone() for z in hidden], signal)

    def solve_from(self, problem, hidden, pre):
        return self._run(problem, hidden, None)

    def _run(self, problem, hidden: list[torch.Tensor], signal: float | None):
        eta = self.step_size
        if self.steps == 0:
            return hidden, SolveInfo(self.name, 0, 0.0, True, self.tol)
        it, move, first, ratios = 0, math.inf, None, None
        for it in range(1, self.steps + 1):
            last = it == self.steps
            check = it == 1 or last or (self.tol is not None and it % 5 == 0)
            old = [z.clone() for z in hidden] if check else None
            errors = [] if last else None
            hidden = problem.gradient_step(hidden, eta, errors)
            if last and not errors:   # not handed back by the step: one forward pass at the old point
                errors = torch._foreach_norm(problem.layer_errors(old))
            if check:   # one fused reduction per quantity over all layers, one synchronisation
                steps = torch._foreach_sub(hidden, old)
                big = max_abs(steps)
                if not last:
                    move = float(torch.stack(big).max())
                else:
                    n = len(steps)
                    stats = torch.stack([*big, *torch._foreach_norm(steps), *errors,
                                         *max_abs(hidden)]).tolist()
                    move = max(stats[:n])
                    ratios, floor = last_step_stats(stats, eta, hidden[0].dtype)
                first = move if it == 1 else first
            if self.tol is not None and check and move <= self.tol:
                break
        if ratios is None:
            floor = residual_floor(hidden)
        return hidden, self.report(it, move, first if signal is None else signal, ratios, floor)

    def report(self, iterations: int, residual: float, initial: float | None, layers: list | None,
               floor: float) -> SolveInfo:
        """The verdict of a solve (also for the fused predictive-coding loop, which measures the same quantities).

        Args:
            iterations: steps done.
            residual: ``r_T`` (the last step's size).
            initial: ``r_0`` (the signal).
            layers: per hidden layer ``(max|step_k|, ‖∂E/∂z_k‖, ‖ε_k‖)`` at the last step's start, or ``None``
                (stopped early by ``tol``).
            floor: :func:`residual_floor` of the value nodes.
        """
        if not math.isfinite(residual):   # diverged: the rules raise with the fix (lower step_size)
            return SolveInfo(self.name, iterations, residual, False, self.tol, initial)
        info = fixed_steps_verdict(self.name, residual, iterations, initial, floor, self.tol)
        if self.tol is not None and not info.converged:
            msg = (f"{self.label}: stopped after {iterations} iterations with largest step {residual:.3g} > tol {self.tol:.3g}; "
                   "raise steps or tol")
            act_on_failure(msg, self.on_fail, stacklevel=4)
            return info
        if info.converged or not initial:
            return info
        fix = f"raise steps (now {self.steps}) or step_size (now {self.step_size:g}){self.advice}"
        rho = residual / initial
        if self.far_rtol is not None and rho > self.far_rtol:
            grew = self.growth_fix.format(step_size=self.step_size) if self.growth_fix else (
                f"the gradient follows the starting point, not the equilibrium; {fix}")
            warn_far(self, info, f"{self.label}: inference far from equilibrium after {iterations} steps: the largest step "
                     f"left, {residual:.3g}, is {rho:.2g}x the forward pass's {initial:.3g} (> {self.far_rtol:g}), so "
                     f"{grew}", self.on_fail)
            return info
        if self.far_layer is not None and layers:
            negligible = max(CONVERGED_RTOL * initial, floor)
            q = [0.0 if big <= negligible else (g / e if e > 0 else math.inf) for big, g, e in layers]
            k = max(range(len(q)), key=q.__getitem__)
            if q[k] > self.far_layer:
                warn_far(self, info, f"{self.label}: inference far from equilibrium after {iterations} steps: value node "
                         f"{k + 1}'s remaining gradient is {q[k]:.2g}x its prediction error (> {self.far_layer:g}), so its "
                         f"weight gradient reflects how far the output error propagated in {iterations} steps of "
                         f"{self.step_size:g}, not the equilibrium; {fix}", self.on_fail)
        return info


class OptimizerSteps(GradientSteps):
    """Inference by an optimiser on the value nodes: heavy-ball momentum or Adam on ``∂E/∂z`` (PCX's optax
    optimisers on the value nodes, Pinchetti et al. 2024), with the updates of ``torch.optim.SGD`` (momentum,
    no dampening) and ``torch.optim.Adam``, all layers from the same point, the state fresh on every solve::

        momentum   m_k ← μ m_k + g_k,                         z_k ← z_k − η m_k
        adam       m_k ← β₁ m_k + (1 − β₁) g_k,  v_k ← β₂ v_k + (1 − β₂) g_k²,
                   z_k ← z_k − η m̂_k / (√v̂_k + ε),  m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)

    with ``g_k = ∂E/∂z_k`` (:meth:`LayeredProblem.gradients`) and the projection ``Π_k`` after the update.

    **What the convergence check measures**: the step is no longer ``−η ∂E/∂z`` (momentum carries the past, Adam
    normalises each coordinate), so its size says little about equilibrium (Adam's steps stay near ``η`` while the
    signs of ``g`` agree). The checks measure the *gradient* instead, in the plain steps' units: ``r = η max|∂E/∂z|``
    at a checked step's start (the step :class:`GradientSteps` would take there), ``r_0`` at the forward pass and
    ``r_T`` at the last step's start, and per hidden layer ``(η max|g_k|, ‖g_k‖, ‖ε_k‖)``; the verdicts
    (converged, *far*, ``tol``) are :meth:`GradientSteps.report`'s. ``tol`` stops when ``r ≤ tol`` (every fifth step).

    Args:
        optimizer: ``"momentum"`` or ``"adam"``.
        momentum: ``μ`` (momentum) or ``β₁`` (Adam), in ``[0, 1)``.
        beta2: Adam's ``β₂`` (0.999, torch's and optax's default).
        eps: Adam's ``ε`` (1e-8).

    The other arguments are :class:`GradientSteps`'s (``step_size`` is the optimiser's learning rate ``η``).
    """

    INFERENCE_OPTIMIZERS = ("momentum", "adam")

    def __init__(self, steps: int = 15, step_size: float = 0.1, tol: float | None = None, optimizer: str = "momentum",
                 momentum: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, **kwargs):
        super().__init__(steps, step_size, tol, **kwargs)
        if optimizer not in self.INFERENCE_OPTIMIZERS:
            raise ValueError(f"Invalid optimizer: {optimizer!r}; choose one of {list(self.INFERENCE_OPTIMIZERS)}")
        for key, v in (("momentum", momentum), ("beta2", beta2)):
            if not (isinstance(v, (int, float)) and 0 <= v < 1):
                raise ValueError(f"Invalid {key}: {v}")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"Invalid eps: {eps}")
        self.optimizer, self.momentum, self.beta2, self.eps = optimizer, float(momentum), float(beta2), float(eps)

    def _run(self, problem, hidden: list[torch.Tensor], signal: float | None):
        eta, e = self.step_size, problem.energy
        if self.steps == 0:
            return hidden, SolveInfo(self.name, 0, 0.0, True, self.tol)
        m = [torch.zeros_like(z) for z in hidden]
        v = [torch.zeros_like(z) for z in hidden] if self.optimizer == "adam" else None
        it, residual, first, layers = 0, math.inf, None, None
        for it in range(1, self.steps + 1):
            grads = problem.gradients(hidden)
            last = it == self.steps
            if it == 1 or last or (self.tol is not None and it % 5 == 0):
                big = [float(g.abs().max()) for g in grads]
                residual = eta * max(big)
                first = residual if it == 1 else first
                if last:
                    layers = [(eta * b, float(g.norm()), float(err.norm()))
                              for b, g, err in zip(big, grads, problem.layer_errors(hidden))]
                if self.tol is not None and residual <= self.tol:
                    break
            new = []
            for k, (z, g, mk) in enumerate(zip(hidden, grads, m), start=1):
                if v is None:
                    step = mk.mul_(self.momentum).add_(g)
                else:
                    mk.lerp_(g, 1.0 - self.momentum)
                    v[k - 1].mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
                    denom = (v[k - 1] / (1.0 - self.beta2 ** it)).sqrt_().add_(self.eps)
                    step = mk / (1.0 - self.momentum ** it) / denom
                new.append(e.project(k, z - eta * step))
            hidden = new
        return hidden, self.report(it, residual, first if signal is None else signal, layers, residual_floor(hidden))
