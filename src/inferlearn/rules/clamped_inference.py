"""Clamped inference, weights from the equilibrium: predictive coding and lifted Fenchel networks.

Phase structure "one clamped phase" (MATH.md §B taxonomy): clamp the output to the target
``z_L := y``, infer the hidden layers by minimising a layered energy ``F(z) = Σ_k w_k E_k(z_k, z_{k-1})``
started from the forward pass, and accumulate the envelope gradient ``∇_W F`` at the inferred
``z`` (batch mean). The rules differ only in the layer energy:

* ``penalty`` (:class:`PredictiveCoding`, ``pc``): ``E_k = ½‖z_k − f_k(a_k)‖²`` with
  ``a_k = W_{k-1} z_{k-1} + b_{k-1}``, ``f_k`` the unit's activation, hidden ``z_k`` unconstrained
  (value nodes), ``w_k = 1``. With ``ε_k = z_k − f_k(a_k)`` and ``d_k = ε_k ⊙ f_k'(a_k)``::

      ∂F/∂z_k = ε_k − W_kᵀ d_{k+1},      ∇W_{k-1} F = −d_k z_{k-1}ᵀ,   ∇b_{k-1} F = −d_k

  Inference is ``T`` simultaneous gradient steps of size ``η`` (PCX's setting: T = 15). With the
  output error small, the equilibrium errors are back-propagation's deltas and the gradient is
  back-propagation's (Whittington & Bogacz 2017; tested). Run to convergence this is also the
  penalty form of MAC (auxiliary coordinates with a quadratic penalty, weights updated at the
  minimiser), restarted from the forward pass on every batch.

* ``fenchel`` (:class:`LiftedFenchel`, ``lifted-fenchel``): the Fenchel-Young gap of the unit's
  convex potential, for a box unit ``C`` (``f = Π_C``)::

      E_k = G(z_k) + G*(a_k) − z_kᵀ a_k = ½‖z_k − a_k‖² − ½‖Π_C(a_k) − a_k‖²  ≥ 0,  z_k ∈ C

  zero exactly when ``z_k = f(a_k)``; convex in ``z_k`` and in ``z_{k-1}`` separately (layer-wise
  convex, jointly not), with ``∂E_k/∂a_k = Π_C(a_k) − z_k``. Term weights ``w_k = γ^{k-1}`` as in
  the lifted energy, the output term is ``½‖y − a_L‖²``. Inference: block (layer-wise) projected
  gradient sweeps, each layer's step ``1/(w_k + w_{k+1}‖W_k‖²)``. The gradient of layer ``k−1`` is
  divided by its term weight ``w_k`` (as :class:`~inferlearn.rules.lifted.LiftedJ0` does).
  This is the lifted Fenchel network / LPOM row of the taxonomy, which does *not* contain
  back-propagation as a limit case.

References:
    Whittington & Bogacz (2017), predictive coding approximates back-propagation; Song et al. (2020);
    Gu et al. (2020), Fenchel lifted networks; Li et al. (2019), LPOM; Carreira-Perpiñán & Wang
    (2014), MAC; Zach, "Bilevel programs meet deep learning", Table 1; MATH.md §B.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..units import UnitSet
from ..engine.dense import check_gamma
from ..errors import ConvergenceError
from ..losses import one_hot, quadratic_loss
from ..models import MLP
from .base import Rule, StepInfo, accumulate_grad, check_positive, register_rule

ENERGIES = ("penalty", "fenchel")


def _deriv_mask(units: UnitSet, a: torch.Tensor) -> torch.Tensor | None:
    """``f'(a)`` of a box unit as a 0/1 tensor (autograd's convention at the kinks); ``None`` if linear."""
    if units.is_linear:
        return None
    return (~units.engaged(a)).to(a.dtype)


@dataclass
class ClampedInference(Rule):
    """Base of the clamped-inference rules (abstract: use :class:`PredictiveCoding` or :class:`LiftedFenchel`).

    Args:
        steps: inference steps ``T`` (``penalty``: gradient steps; ``fenchel``: block sweeps).
        step_size: ``penalty``: the inference rate ``η``; ``fenchel``: a multiplier of the block
            step ``1/(w_k + w_{k+1}‖W_k‖²)`` (1 = the safe step).
        gamma: term weights ``w_k = γ^{k-1}`` (``fenchel`` only).
        tol: stop early when the largest step (activation units) is ``≤ tol`` (``None``: exactly
            ``steps`` steps, checked every 5).
        output_weight: ``penalty`` only: the precision ``π`` of the output term
            ``(π/2)‖y − a_L‖²``; the gradient is divided by ``π``. ``π → 0`` (weak clamping) is the
            regime in which predictive coding's gradient is back-propagation's (tested); with the
            usual hard clamp ``π = 1`` the hidden errors are ``(I + WᵀW)^{-1}``-filtered versions of
            back-propagation's deltas even for tiny output errors (tested on a linear network).
    """

    energy = "penalty"
    steps: int = 15
    step_size: float = 0.1
    gamma: float = 1.0
    tol: float | None = None
    output_weight: float = 1.0

    def __post_init__(self) -> None:
        check_positive("output_weight", self.output_weight)
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 0:
            raise ValueError(f"Invalid steps: {self.steps}")
        check_positive("step_size", self.step_size)
        check_gamma(self.gamma)
        if self.tol is not None:
            check_positive("tol", self.tol)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        if not isinstance(model, MLP):
            raise TypeError(f"{self.name} needs an inferlearn.models.MLP, got {type(model).__name__}")
        y = one_hot(labels, model.out_features, x.dtype)
        grads, out, extras = self.infer_and_grad(model, x, y)
        for layer, (gw, gb) in zip(model.layers, grads):
            accumulate_grad(layer.weight, gw, owned=True)
            accumulate_grad(layer.bias, gb, owned=True)
        return StepInfo(loss=float(quadratic_loss(out, y)), output=out, extras=extras)

    @torch.no_grad()
    def infer_and_grad(self, model: MLP, x: torch.Tensor, target: torch.Tensor):
        """Clamp ``z_L := target``, infer, and return ``([(∇W_k, ∇b_k)], forward output, extras)``.

        The inferred hidden layers are kept in ``self.last_hidden`` (for diagnostics and tests).
        """
        if self.energy == "penalty":
            return self._penalty(model, x, target)
        return self._fenchel(model, x, target)

    # -- predictive coding -------------------------------------------------------------------------
    def _penalty(self, model: MLP, x: torch.Tensor, target: torch.Tensor):
        Ws = [l.weight for l in model.layers]
        bs = [l.bias for l in model.layers]
        L, B, eta, pi = len(Ws), x.shape[0], self.step_size, self.output_weight
        units = list(model.units)
        # a_1 = W_0 x + b_0 never changes during inference: compute μ_1 and f'_1 once
        a1 = torch.addmm(bs[0], x, Ws[0].t())
        lin = [u.is_linear for u in units] + [True]
        mu1 = units[0].project(a1) if L > 1 else a1
        # f'(a) of a box unit is 1 exactly where the clamp leaves a unchanged (BP's convention at kinks)
        m1 = None if L == 1 or lin[0] else mu1 == a1
        z = [x]
        for k in range(1, L):                            # forward pass: hidden errors start at 0
            z.append(mu1 if k == 1 else units[k - 1].project(torch.addmm(bs[k - 1], z[-1], Ws[k - 1].t())))
        out = torch.addmm(bs[L - 1], z[L - 1], Ws[L - 1].t())
        z = [x] + [t.clone() for t in z[1:L]] + [target]
        it, move = 0, math.inf
        eps = [None] * (L + 1)
        d = [None] * (L + 1)                              # d_k = ε_k ⊙ f'(a_k)
        for it in range(1, self.steps + 1):
            for k in range(1, L + 1):
                if k == 1:
                    mu, m = mu1, m1
                else:
                    a = torch.addmm(bs[k - 1], z[k - 1], Ws[k - 1].t())
                    if k < L and not lin[k - 1]:
                        mu = units[k - 1].project(a)
                        m = mu == a
                    else:
                        mu, m = a, None
                eps[k] = z[k] - mu
                d[k] = eps[k] if m is None else eps[k] * m
            if pi != 1.0:
                d[L] = d[L] * pi
            check = self.tol is not None and it % 5 == 0
            moves = []
            for k in range(1, L):
                # z_k ← z_k − η ∂F/∂z_k = z_k − η ε_k + η W_kᵀ d_{k+1}   (simultaneous: ε, d are from before)
                if check:
                    moves.append(torch.addmm(eps[k], d[k + 1], Ws[k], alpha=-1.0).abs().max())
                z[k].sub_(eps[k], alpha=eta).addmm_(d[k + 1], Ws[k], alpha=eta)
            if check:
                move = float(torch.stack(moves).max()) * eta
                if move <= self.tol:
                    break
        # envelope gradient at the inferred z (recompute the errors there)
        grads = []
        for k in range(1, L + 1):
            a = a1 if k == 1 else torch.addmm(bs[k - 1], z[k - 1], Ws[k - 1].t())
            if k < L:
                e = z[k] - units[k - 1].project(a)
                m = _deriv_mask(units[k - 1], a)
                if m is not None:
                    e = e * m
            else:
                e = (z[k] - a) * pi
            e = e * (-1.0 / (B * pi))
            grads.append((e.t().mm(z[k - 1]), e.sum(0)))
        self.last_hidden = z[1:L]
        return grads, out, {"inference_steps": it}

    # -- lifted Fenchel networks -------------------------------------------------------------------
    def _fenchel(self, model: MLP, x: torch.Tensor, target: torch.Tensor):
        Ws = [l.weight for l in model.layers]
        bs = [l.bias for l in model.layers]
        L, B = len(Ws), x.shape[0]
        units = list(model.units)
        w = [0.0] + [self.gamma ** (k - 1) for k in range(1, L + 1)]
        a = [None, torch.addmm(bs[0], x, Ws[0].t())]
        z = [x]
        for k in range(1, L):
            if k > 1:
                a.append(torch.addmm(bs[k - 1], z[-1], Ws[k - 1].t()))
            z.append(units[k - 1].project(a[k]))
        a.append(torch.addmm(bs[L - 1], z[L - 1], Ws[L - 1].t()))
        out = a[L].clone()
        z.append(target)
        steps = []
        for k in range(1, L):
            lam = float(torch.linalg.matrix_norm(Ws[k].detach().double(), ord=2)) ** 2
            steps.append(self.step_size / (w[k] + w[k + 1] * lam))
        if not all(math.isfinite(s) for s in steps):
            raise ConvergenceError(f"{self.name}: non-finite weights; cannot infer")

        def proj_up(k):   # Π_{C_k}(a_k); the output is linear
            return a[k] if k == L else units[k - 1].project(a[k])

        it = 0
        for it in range(1, self.steps + 1):
            move = 0.0
            for k in range(1, L):
                # ∂F/∂z_k = w_k (z_k − a_k) + w_{k+1} W_kᵀ (Π(a_{k+1}) − z_{k+1})
                grad = torch.addmm((z[k] - a[k]) * w[k], proj_up(k + 1) - z[k + 1], Ws[k], alpha=w[k + 1])
                new = units[k - 1].project(z[k] - steps[k - 1] * grad)
                if self.tol is not None:
                    move = max(move, float((new - z[k]).abs().max()) / steps[k - 1] / w[k])
                z[k] = new
                a[k + 1] = torch.addmm(bs[k], new, Ws[k].t())
            if self.tol is not None and move <= self.tol:
                break
        grads = []
        for k in range(1, L + 1):
            r = (proj_up(k) - z[k]) * (1.0 / B)       # ∂E_k/∂a_k, divided by its term weight w_k
            grads.append((r.t().mm(z[k - 1]), r.sum(0)))
        self.last_hidden = z[1:L]
        return grads, out, {"inference_steps": it}

    def energy_value(self, model: MLP, x: torch.Tensor, hidden: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        """Per-sample ``F(z)`` for hidden layers ``hidden`` and clamped output ``target`` (for tests)."""
        zs = [x, *hidden, target]
        L = model.depth
        total = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        for k in range(1, L + 1):
            a = model.layers[k - 1](zs[k - 1])
            if self.energy == "penalty":
                mu = a if k == L else model.units[k - 1].project(a)
                total = total + 0.5 * (self.output_weight if k == L else 1.0) * (zs[k] - mu).pow(2).sum(1)
            else:
                p = a if k == L else model.units[k - 1].project(a)
                gap = 0.5 * (zs[k] - a).pow(2).sum(1) - 0.5 * (p - a).pow(2).sum(1)
                total = total + self.gamma ** (k - 1) * gap
        return total


@register_rule
@dataclass
class PredictiveCoding(ClampedInference):
    """Predictive coding: penalty energy, clamped output, ``T`` inference steps, weights at the end.

    Defaults follow PCX's benchmark setting: ``T = 15`` steps of size ``η = 0.1``.

    References:
        Whittington & Bogacz (2017); Zach, bilevel paper, Table 1 (PCN row).
    """

    name = "pc"
    energy = "penalty"
    steps: int = 15
    step_size: float = 0.1


@register_rule
@dataclass
class LiftedFenchel(ClampedInference):
    """Lifted Fenchel network / LPOM: Fenchel-Young-gap energy, clamped output, block sweeps.

    References:
        Gu et al. (2020), Fenchel lifted networks; Li et al. (2019), LPOM; Zach, bilevel paper, Table 1.
    """

    name = "lifted-fenchel"
    energy = "fenchel"
    steps: int = 15
    step_size: float = 1.0
    gamma: float = 1 / 8
