"""The method of auxiliary coordinates (MAC): quadratic-penalty training with per-sample coordinates.

MAC (Carreira-Perpiñán & Wang 2014) makes every hidden activation of every training sample a
variable ``z_{k,n}`` (an *auxiliary coordinate*) and replaces the nested objective by the quadratic
penalty (docs/maths.md §B, taxonomy row "MAC / standard lifted")::

    E_Q(W, Z; μ) = Σ_n [ ½‖y_n − f_L(a_{L,n})‖² + (μ/2) Σ_{k<L} ‖z_{k,n} − f_k(a_{k,n})‖² ],
    a_{k,n} = A_k(z_{k−1,n}),  z_{0,n} = x_n

minimised alternately over ``Z`` and ``W`` while ``μ`` grows (``μ → ∞`` recovers the nested problem):

* **Z-step**: per sample, ``min_z E_Q`` — the predictive-coding energy with output precision
  ``π = 1/μ`` (``E_Q = μ F_π``, :func:`~inferlearn.rules.predictive_coding.penalty_energy`), solved by
  simultaneous gradient steps (:class:`~inferlearn.engine.solvers.GradientSteps`) **warm-started from
  the sample's coordinates of the previous epoch** (the forward pass on a sample's first visit);
* **W-step**: ``∇_W E_Q / B`` at the fixed ``Z`` (envelope form, :meth:`LayeredProblem.accumulate_weight_grads`).
  Each term involves one layer only, so each layer fits its own target: hidden layer ``k`` the
  regression ``z_{k−1} ↦ z_k`` through ``f_k``, the output layer the labels from ``z_{L−1}``. The rule
  fills ``.grad``; the optimiser steps (the stochastic W-step of MAC, one step per mini-batch);
* **μ schedule**: ``μ_e = min(μ_0 · growth^{e−1}, μ_max)`` in epoch ``e`` (:meth:`MAC.begin_epoch`).

The coordinates persist across epochs: the rule stores them per training sample (it reads the batch's
positions, ``Rule.backward(…, index=…)``, which the training loop passes), and its
:meth:`~MAC.state_dict` travels in the checkpoint so ``--resume`` is exact. Memory: one float per hidden
unit per training sample (MNIST 60000 × 192 units: 46 MB in float32). Called without ``index``
(a plain ``rule.backward(model, x, labels)``) each batch starts from the forward pass and the rule is
stateless — the penalty form of predictive coding restarted per batch (``pc`` with ``π = 1/μ``, its
gradient divided by ``π``).

Any chain with differentiable maps and element-wise activations (as for predictive coding).
As ``μ → ∞`` the Z-step moves the coordinates ``O(1/μ)`` away from the forward pass and ``∇_W E_Q``
tends to back-propagation's gradient (the predictive-coding limit ``π → 0``).

References:
    Carreira-Perpiñán & Wang, "Distributed optimization of deeply nested systems" (AISTATS 2014),
    Eqs. 2–3 and Sec. 3 (the quadratic-penalty MAC, the Z- and W-steps, the μ schedule); Zach,
    "Bilevel programs meet deep learning", Table 1 (MAC row).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import DIFFERENTIABLE, read_graph
from ..engine.problems import LayeredProblem
from ..engine.solvers import EQUILIBRIUM_STEPS, GradientSteps
from ..losses import one_hot, quadratic_loss
from .base import PerSampleRule, StepInfo, check_positive, register_rule
from .predictive_coding import check_inference_finite, penalty_energy


def _memory(device) -> int:
    """Bytes free on ``device`` (CUDA: ``mem_get_info``; otherwise the machine's available memory)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2 ** 62


MU_RANGE = (1e-8, 1e8)   # beyond: the loss (1/μ) or the gradient (μ × targets of size 1/μ) leaves float32


@register_rule
@dataclass
class MAC(PerSampleRule):
    """MAC: quadratic penalty ``½‖y − f_L(a_L)‖² + (μ/2)Σ_k‖z_k − f_k(a_k)‖²``, persistent per-sample ``z``.

    Args:
        mu0: the penalty ``μ`` of the first epoch (``> 0``).
        mu_growth: ``μ`` is multiplied by this factor every epoch (``≥ 1``; 1 keeps it fixed).
        mu_max: ``μ`` stops growing here (in float32 the hidden targets ``z_k − f(a_k) = O(1/μ)`` drown
            in rounding beyond about 1e4).
        steps: Z-step gradient steps per mini-batch (from the stored coordinates, or the forward pass).
        step_size: the Z-step rate ``η`` on ``E_Q/μ`` (stable for ``η(1 + ‖W‖²) < 2``, as predictive coding).
        tol: stop the Z-step early when the largest step is ``≤ tol`` (checked every 5 steps; warns
            when ``steps`` run out first); ``None``: exactly ``steps`` steps.
        warm_start: keep the coordinates per sample across epochs (MAC); ``False`` starts every
            Z-step from the forward pass and stores nothing (an ablation).

    ``StepInfo.extras``: ``mu``, ``inference_steps``, ``warm_fraction`` (the share of the batch whose
    Z-step started from stored coordinates), and the Z-step's verdict ``solver_residual``, ``converged`` and
    ``far`` (:class:`~inferlearn.engine.solvers.GradientSteps`: its signal ``r_0`` is measured at the forward
    pass even when the steps start from stored coordinates).

    Convergence: with the defaults (30 steps) the Z-step is not at its minimiser. On the digits demo
    (``64-32-32-10``, ReLU, SGD 0.05) the stored coordinates stop fitting the weights as μ grows: from epoch 12
    the Z-step ends farther from equilibrium than the forward pass (a once-per-run ``ConvergenceWarning``)
    and training collapses to chance (test 0.08 after 30 epochs); ``warm_start=false`` reaches 0.94
    (back-propagation 0.94), ``steps=100`` 0.94. Against back-propagation's gradient (the μ → ∞ limit) the
    W-step at μ = 1e4 from the forward pass is 14 % away after 30 steps and 2e-4 after 300.
    How far the gradient is from the equilibrium's is not in ``StepInfo`` (it needs the equilibrium): measure
    it with :func:`inferlearn.diagnostics.equilibrium_gap`, or ``inferlearn train --check-equilibrium`` (after
    every epoch, one warning per run above 10 %).

    References:
        Carreira-Perpiñán & Wang (2014); Zach, bilevel paper, Table 1.
    """

    name = "mac"
    mu0: float = 1.0
    mu_growth: float = 1.5
    mu_max: float = 1e4
    steps: int = 30
    step_size: float = 0.2
    tol: float | None = None
    warm_start: bool = True

    def __post_init__(self) -> None:
        for key in ("mu0", "mu_max"):
            v = getattr(self, key)
            check_positive(key, v)
            if not MU_RANGE[0] <= v <= MU_RANGE[1]:
                raise ValueError(f"Invalid {key}: {v} (must lie in [{MU_RANGE[0]:g}, {MU_RANGE[1]:g}])")
        if not (isinstance(self.mu_growth, (int, float)) and math.isfinite(self.mu_growth) and self.mu_growth >= 1):
            raise ValueError(f"Invalid mu_growth: {self.mu_growth} (must be ≥ 1)")
        if self.mu_max < self.mu0:
            raise ValueError(f"Invalid mu_max: {self.mu_max} (must be ≥ mu0 = {self.mu0})")
        self._solver = GradientSteps(self.steps, self.step_size, self.tol, label="mac Z-step",
                                     advice=", or warm_start=false (coordinates stored in earlier epochs, at a "
                                            "smaller mu, may no longer fit the weights)")
        self._mu = float(self.mu0)
        self._z: list[torch.Tensor] | None = None   # per-sample auxiliary coordinates, one tensor per hidden layer
        self._seen: torch.Tensor | None = None      # (n,) bool: the sample has stored coordinates
        self._n_samples: int | None = None          # the training set's size (begin_epoch), bounds the positions

    @property
    def mu(self) -> float:
        """The current penalty ``μ`` (``mu0`` until :meth:`begin_epoch` is called)."""
        return self._mu

    def mu_at(self, epoch: int) -> float:
        """``μ_e = min(μ_0 · growth^{e−1}, μ_max)``."""
        if self.mu_growth == 1:
            return float(self.mu0)
        log_mu = math.log(self.mu0) + (epoch - 1) * math.log(self.mu_growth)
        return float(min(math.exp(min(log_mu, 700.0)), self.mu_max))

    def equilibrium_options(self) -> dict:
        """The Z-step run :data:`~inferlearn.engine.solvers.EQUILIBRIUM_STEPS` steps from the forward pass
        (``warm_start=False``), no early stop."""
        return {"steps": max(self.steps, EQUILIBRIUM_STEPS), "warm_start": False, "tol": None}

    def begin_epoch(self, epoch: int, n_samples: int) -> None:
        """Set ``μ`` for ``epoch`` (1-based); a training set of another size drops the stored coordinates."""
        self._mu = self.mu_at(epoch)
        self._n_samples = int(n_samples)
        if self._seen is not None and self._seen.shape[0] != n_samples:
            self.reset()

    def reset(self) -> None:
        """Forget the stored auxiliary coordinates (the next epoch starts from forward passes)."""
        self._z, self._seen = None, None

    def state_dict(self) -> dict:
        return {"mu": self._mu, "z": self._z, "seen": self._seen}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self._mu, self._z, self._seen = state["mu"], state["z"], state["seen"]

    def sample_state(self, index: torch.Tensor) -> torch.Tensor | None:
        """Rows ``[seen, z_1, …, z_{L-1}]`` (flattened) of the samples ``index``."""
        if self._z is None:
            return None
        self._grow(int(index.max()) + 1, [z[:1] for z in self._z], index.device)
        return torch.cat([self._seen[index, None].to(self._z[0].dtype)] + [z[index].flatten(1) for z in self._z], 1)

    def set_sample_state(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        self._grow(int(index.max()) + 1, [z[:1] for z in self._z], index.device)
        self._seen[index] = rows[:, 0] > 0.5
        offset = 1
        for z in self._z:
            width = z[0].numel()
            z[index] = rows[:, offset:offset + width].reshape(-1, *z.shape[1:]).to(z.dtype)
            offset += width

    def _grow(self, need: int, like: list[torch.Tensor], device) -> None:
        """Make room for ``need`` samples' coordinates (shaped like ``like``), keeping those stored.

        Raises:
            ValueError: before allocating, when ``need`` exceeds the training set of :meth:`begin_epoch` or the
                coordinates would not fit in the device's memory (a position far beyond the data).
        """
        if self._z is not None and self._seen.shape[0] >= need:
            return
        size = need * (1 + sum(h[0].numel() * h.element_size() for h in like))
        limit = self._n_samples if self._n_samples is not None else None
        room = _memory(device)
        if (limit is not None and need > limit) or size > room:
            where = (f"the {limit} training samples of begin_epoch(epoch, n_samples={limit})" if limit is not None
                     else f"what fits in memory ({room / 2**30:.1f} GB free; {size / 2**30:.1f} GB needed)")
            raise ValueError(f"Invalid index: sample position {need - 1} is beyond {where}; index holds the batch's "
                             "positions in the training set, 0 … n_samples − 1")
        old_z, old_seen = self._z, self._seen
        self._z = [h.new_zeros((need, *h.shape[1:])) for h in like]
        self._seen = torch.zeros(need, dtype=torch.bool, device=device)
        if old_z is not None:
            n = old_seen.shape[0]
            for z, o in zip(self._z, old_z):
                z[:n] = o
            self._seen[:n] = old_seen

    def _warm_start(self, forward: list[torch.Tensor], index: torch.Tensor) -> tuple[list[torch.Tensor], float]:
        """Stored coordinates for the samples seen before, the forward pass for the others."""
        need = int(index.max()) + 1
        if self._z is not None and [tuple(z.shape[1:]) for z in self._z] != [tuple(h.shape[1:]) for h in forward]:
            raise ValueError("Invalid index: the stored auxiliary coordinates belong to a model with other layer "
                             "shapes; call rule.reset() before training another model")
        self._grow(need, forward, index.device)
        seen = self._seen[index]
        init = [torch.where(seen.reshape(-1, *([1] * (h.dim() - 1))), z[index].to(h.dtype), h)
                for h, z in zip(forward, self._z)]
        return init, float(seen.float().mean())

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor,
                  index: torch.Tensor | None = None) -> StepInfo:
        chain = read_graph(model, DIFFERENTIABLE, self.name, example=x)
        B, L, mu = x.shape[0], chain.depth, self._mu
        free = LayeredProblem(penalty_energy(chain, 1.0 / mu), x)   # E_Q / μ: hidden terms 1, the loss 1/μ
        forward, pre = free.forward_state()
        output = chain.nodes[-1].act(pre[L])
        y = one_hot(labels, output.shape[1], x.dtype)
        problem = free.stacked(1, target=y)
        warm = 0.0
        init = None
        persist = index is not None and L > 1 and self.warm_start
        if persist:
            init, warm = self._warm_start(forward, index)
        hidden, info = self._solver.solve(problem, init)                  # Z-step
        problem.accumulate_weight_grads(hidden, mu / B, precise=False)                   # W-step gradient: ∇_W E_Q / B
        check_inference_finite(self.name, chain, hidden, info.iterations, self.step_size)
        if persist:
            for z, h in zip(self._z, hidden):
                z[index] = h.detach().to(z.dtype)
            self._seen[index] = True
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(),
                        extras={"mu": mu, "inference_steps": info.iterations, "warm_fraction": warm,
                                "solver_residual": info.residual, "converged": info.converged, "far": info.far})
