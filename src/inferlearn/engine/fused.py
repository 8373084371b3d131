"""Fused paths for dense chains (``Linear`` layers with box units): hand-written loops, no autograd graph.

They specialise the generic engine (:mod:`inferlearn.engine.problems`) and the autograd rules to the
MLP, where a few ``addmm`` calls per layer beat autograd's bookkeeping, and are tested equal to the
generic paths in float64 (``tests/engine/test_engine_generic.py``).

* :func:`dense_backward` -- back-propagation with a pluggable local backward of the units: the
  derivative mask (:class:`~inferlearn.rules.backprop.BackProp`) or Fenchel back-propagation's
  finite difference (:class:`~inferlearn.rules.fenchel.FenchelBackProp`);
* :func:`dense_predictive_coding` -- predictive coding's ``T`` simultaneous steps on the penalty energy.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import torch

import torch.nn.functional as F

from ..losses import one_hot, quadratic_loss
from ..tensors import accumulate_grad
from ..units import Box
from .graph import Graph
from .compiled import CompiledStep
from .solvers import last_step_stats, max_abs, residual_floor_of

LocalBackward = Callable[[Box, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def accumulate_dense_grads(chain: Graph, grads) -> None:
    """Accumulate ``[(∇W_k, ∇b_k)]`` (fresh tensors, owned by the caller) into the ``Linear`` layers' ``.grad``."""
    for link, (gw, gb) in zip(chain.nodes, grads):
        layer = link.linear
        for p, g in ((layer.weight, gw), (layer.bias, gb)):
            if p is not None:
                accumulate_grad(p, g, owned=True)


def dense_forward(chain: Graph, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``([x, z_1, …, z_L], [x, a_1, …, a_L])`` with one ``addmm`` per layer (the input flattened)."""
    zs, pre = [x.reshape(x.shape[0], -1)], [None]
    for k, link in enumerate(chain.nodes, start=1):
        lin = link.linear
        a = torch.addmm(lin.bias, zs[-1], lin.weight.t()) if lin.bias is not None else zs[-1].mm(lin.weight.t())
        pre.append(a)
        zs.append(a if k == chain.depth else link.units.project(a))
    pre[0] = zs[0]
    return zs, pre


@torch.no_grad()
def dense_backward(chain: Graph, x: torch.Tensor, labels: torch.Tensor, loss: str,
                   local: LocalBackward | Sequence[LocalBackward]) -> tuple[float, torch.Tensor]:
    """Back-propagate the loss through a dense chain with ``δ_k = local(units, z_k, a_k, g_k)``.

    ``g_k = W_kᵀ δ_{k+1}`` is the gradient arriving at ``z_k``; ``δ_L`` is the per-sample output gradient
    (the output is linear). Weight gradients ``δ_{k+1} z_kᵀ / B`` (batch mean) accumulate into ``.grad``.
    ``local`` is one function for every hidden layer or a sequence of ``L − 1``, one per hidden layer
    ``k = 1 … L−1`` (e.g. Fenchel back-propagation with a per-layer ``β_k``).

    Returns:
        ``(loss, output)``.
    """
    Ws, bs, units, func, kw = bp_step_arguments(chain, local)
    y = one_hot(labels, Ws[-1].shape[0], x.dtype)   # outside the step: F.one_hot checks its input's values
    value, out, grads = BP_STEP(x.reshape(x.shape[0], -1), labels, y, Ws, bs, units, loss, func, kw)
    accumulate_dense_grads(chain, grads)
    return float(value), out


def bp_step_arguments(chain: Graph, local: LocalBackward | Sequence[LocalBackward]) -> tuple:
    """``(Ws, bs, units, local, constants)``: the arguments of :func:`bp_step` after the batch, for a dense chain."""
    Ws = [l.linear.weight for l in chain.nodes]
    bs = [l.linear.bias for l in chain.nodes]
    units = tuple(l.units for l in chain.nodes[:-1])
    if isinstance(local, Sequence):   # one local backward per hidden layer (e.g. Fenchel BP's β_k)
        parts = [_constants(f) for f in local]
        return Ws, bs, units, tuple(f for f, _ in parts), tuple(k for _, k in parts)
    return (Ws, bs, units, *_constants(local))


def _constants(local: LocalBackward) -> tuple:
    """``(function, keyword constants)`` of a local backward (a ``functools.partial`` carries e.g. β)."""
    if isinstance(local, functools.partial):   # constants of the compiled step
        return local.func, tuple(sorted(local.keywords.items()))
    return local, ()


def bp_step(x: torch.Tensor, labels: torch.Tensor, y: torch.Tensor, Ws: list, bs: list, units: tuple, loss: str, local, kw: tuple):
    """Forward and backward of a dense chain: ``(loss, output, [(∇W_k, ∇b_k)])`` (batch mean)."""
    zs, pres = [x], [x]
    L = len(Ws)
    for k in range(1, L + 1):
        b = bs[k - 1]
        a = torch.addmm(b, zs[-1], Ws[k - 1].t()) if b is not None else zs[-1].mm(Ws[k - 1].t())
        pres.append(a)
        zs.append(a if k == L else units[k - 1].project(a))
    out = zs[-1]
    if loss == "quadratic":   # losses.loss_and_gradient, given the one-hot targets
        value, delta = quadratic_loss(out, y), out - y
    else:
        value, delta = F.cross_entropy(out, labels.long()), torch.softmax(out, dim=1) - y
    scale = 1.0 / x.shape[0]
    grads = [None] * L
    for k in range(L - 1, -1, -1):
        ds = delta * scale
        grads[k] = (ds.t().mm(zs[k]), ds.sum(0))
        if k > 0:
            g = delta.mm(Ws[k])
            u = units[k - 1]
            fn, kwk = (local[k - 1], kw[k - 1]) if isinstance(local, tuple) else (local, kw)   # per layer or one
            delta = g if u.is_linear else fn(u, zs[k], pres[k], g, **dict(kwk))
    return value, out, grads


BP_STEP = CompiledStep(bp_step, "the back-propagation step")


@torch.no_grad()
def dense_predictive_coding(chain: Graph, x: torch.Tensor, target: torch.Tensor, steps: int, eta: float,
                            precision: float, tol: float | None, output: str = "se") -> tuple:
    """Predictive coding on a dense chain: ``T`` simultaneous steps, then the envelope gradient.

    The penalty energy ``F = Σ_{k<L} ½‖z_k − f_k(a_k)‖² + (π/2)‖y − a_L‖²`` (``π`` = ``precision``), or with
    ``output="ce"`` the cross-entropy output term ``π CE(y, softmax(a_L))``, whose output error is
    ``d_L = y − softmax(a_L)`` instead of ``y − a_L``. With ``ε_k = z_k − f_k(a_k)`` and ``d_k = ε_k ⊙ f_k'(a_k)``::

        z_k ← z_k − η ε_k + η W_kᵀ d_{k+1}          (simultaneous, from the forward pass)
        ∇W_{k-1} = −d_k z_{k-1}ᵀ / (Bπ),   ∇b_{k-1} = −d_k / (Bπ)

    The first and the last step are checked (and every fifth with ``tol``): the first step's size is the
    signal ``r_0``, the last one's ``r_T``, and per hidden layer ``(max|step_k|, ‖∂F/∂z_k‖, ‖ε_k‖)`` at its start
    (:meth:`~inferlearn.engine.solvers.GradientSteps.report` judges them).

    Without ``tol`` the whole batch (forward pass, ``T`` steps, gradient) is one call of
    :data:`PC_INFERENCE`, compiled as one graph when compilation is on (:mod:`inferlearn.engine.compiled`),
    with one synchronisation at its end; with ``tol`` the steps run one by one (:data:`PC_STEP`), since
    stopping early reads the step size on the host.

    Returns:
        ``(grads, output, hidden, steps_done, last_move, first_move, layers, floor, summary)`` (``layers`` and
        ``floor``, the :func:`~inferlearn.engine.solvers.residual_floor` of the value nodes, ``None`` when ``tol``
        stopped the steps early; ``summary``: ``(loss, total)`` of the whole-batch call, see
        :func:`pc_inference`, ``None`` with ``tol``).
    """
    Ws = [l.linear.weight for l in chain.nodes]
    bs = [l.linear.bias for l in chain.nodes]
    L, B = len(Ws), x.shape[0]
    x = x.reshape(B, -1)
    lin, bounds = pc_constants(chain, x)
    n = L - 1
    if tol is None and steps > 0:   # fixed steps: the whole inference in one (possibly compiled) call
        grads, out, hidden, s1, sT, summary = PC_INFERENCE(x, target, Ws, bs, lin, bounds, steps, eta, precision,
                                                           output)
        if s1 is None:
            loss, total = summary.tolist()
            return grads, out, hidden, steps, 0.0, 0.0, [], residual_floor_of(0.0, x.dtype), (loss, total)
        move, first, layers, floor, summary = pc_batch_stats(torch.cat([s1, sT, summary]).tolist(), n, eta, x.dtype)
        return grads, out, hidden, steps, move, first, layers, floor, summary
    a1, mu1, m1, hidden, out = _pc_forward(x, Ws, bs, lin, bounds)
    Wts = [W.t() for W in Ws]
    it, move, first, layers, floor = 0, math.inf, None, None, None
    for it in range(1, steps + 1):
        check = 2 if it == steps else int(it == 1 or (tol is not None and it % 5 == 0))
        hidden, m = PC_STEP(hidden, x, target, mu1, m1, Ws, Wts, bs, lin, bounds, eta, precision, check, output)
        if check:
            stats = m.tolist() if m is not None else []   # one synchronisation per checked step
            move = max(stats[:n], default=0.0)
            first = move if it == 1 else first
            if it == steps:
                layers, floor = last_step_stats(stats, eta, x.dtype)
            if tol is not None and move <= tol:
                break
    grads = _pc_grads(x, hidden, target, a1, Ws, bs, lin, bounds, precision, output)
    return grads, out, hidden, it, move, first, layers, floor, None


def pc_batch_stats(stats: list[float], n: int, eta: float, dtype: torch.dtype) -> tuple:
    """Read the statistics of a whole-batch predictive-coding call (``[stats_1, stats_T, loss, total]`` as floats,
    one synchronisation; ``n`` hidden layers): ``(r_T, r_0, layers, floor, (loss, total))``, see
    :func:`dense_predictive_coding`."""
    first, last, summary = stats[:n], stats[n:-2], tuple(stats[-2:])
    layers, floor = last_step_stats(last, eta, dtype)
    return max(last[:n]), max(first), layers, floor, summary


def pc_constants(chain: Graph, like: torch.Tensor) -> tuple:
    """``(lin, bounds)`` of a dense chain's hidden units for :func:`pc_inference` (bounds cast to ``like``)."""
    units = [l.units for l in chain.nodes[:-1]]
    return tuple([u.is_linear for u in units] + [True]), tuple(u.clamp_bounds(like) for u in units)


@dataclasses.dataclass(frozen=True, eq=False)
class DensePlan:
    """How a rule computes a dense chain's gradient as one pure call, for the training loop's fused step
    (:mod:`inferlearn.training.fused_step`, which adds the optimiser's update to the same compiled call).

    Attributes:
        chain: the dense chain.
        gradient: ``"bp"`` (:func:`bp_step`: ``constants = (units, loss, local backward, its constants)``) or
            ``"pc"`` (:func:`pc_inference`: ``constants = (lin, bounds, steps, η, π, output)``).
        constants: the call's constants.
        finish: host-side reading of a ``"pc"`` call's statistics (their floats), returning the batch's loss;
            it issues the rule's verdict and warnings, and raises on non-finite value nodes or gradients.
    """

    graph: Graph
    gradient: str
    constants: tuple
    finish: Callable | None = None


def _pc_forward(x: torch.Tensor, Ws: list, bs: list, lin: tuple, bounds: tuple):
    """The forward pass that starts predictive coding (every hidden error 0): ``(a_1, f(a_1), f'(a_1) or None,
    hidden copies, output)``."""
    L = len(Ws)
    a1 = torch.addmm(bs[0], x, Ws[0].t())
    mu1 = a1 if L == 1 or lin[0] else a1.clamp(min=bounds[0][0], max=bounds[0][1])
    m1 = None if L == 1 or lin[0] else mu1 == a1    # f'(a) of a box unit: 1 where the clamp leaves a unchanged
    z = [x]
    for k in range(1, L):
        if k > 1:
            a = torch.addmm(bs[k - 1], z[-1], Ws[k - 1].t())
            z.append(a if lin[k - 1] else a.clamp(min=bounds[k - 1][0], max=bounds[k - 1][1]))
        else:
            z.append(mu1)
    out = torch.addmm(bs[L - 1], z[L - 1], Ws[L - 1].t())
    return a1, mu1, m1, [t.clone() for t in z[1:L]], out


def _pc_grads(x: torch.Tensor, hidden: list, target: torch.Tensor, a1: torch.Tensor, Ws: list, bs: list,
              lin: tuple, bounds: tuple, precision: float, output: str = "se") -> list:
    """The envelope gradient at the value nodes: ``(∇W_{k-1}, ∇b_{k-1}) = (−d_k z_{k-1}ᵀ, −Σ d_k) / (Bπ)``."""
    L, B = len(Ws), x.shape[0]
    z = [x] + list(hidden) + [target]
    grads = []
    for k in range(1, L + 1):
        a = a1 if k == 1 else torch.addmm(bs[k - 1], z[k - 1], Ws[k - 1].t())
        if k < L:
            if lin[k - 1]:
                e = z[k] - a
            else:
                f = a.clamp(min=bounds[k - 1][0], max=bounds[k - 1][1])
                e = (z[k] - f) * (f == a).to(a.dtype)
        else:
            e = (z[k] - (torch.softmax(a, dim=1) if output == "ce" else a)) * precision
        e = e * (-1.0 / (B * precision))
        grads.append((e.t().mm(z[k - 1]), e.sum(0)))
    return grads


def pc_inference(x: torch.Tensor, target: torch.Tensor, Ws: list, bs: list, lin: tuple, bounds: tuple,
                  steps: int, eta: float, precision: float, output: str = "se"):
    """A whole batch of predictive coding as one pure function (forward pass, ``steps`` simultaneous steps,
    envelope gradient), so that one compiled call runs it: ``(grads, output, hidden, stats_1, stats_T, summary)``,
    the statistics of the first and the last step as :func:`_pc_step` returns them and ``summary`` =
    ``(quadratic loss of the output against the target, Σ of every value node and gradient entry)`` (a finite
    total proves them all finite), all read after the call in one synchronisation."""
    a1, mu1, m1, hidden, out = _pc_forward(x, Ws, bs, lin, bounds)
    Wts = [W.t() for W in Ws]
    first = last = None
    for it in range(1, steps + 1):
        hidden, m = _pc_step(hidden, x, target, mu1, m1, Ws, Wts, bs, lin, bounds, eta, precision,
                             2 if it == steps else int(it == 1), output)
        first = m if it == 1 else first
        last = m if it == steps else last
    grads = _pc_grads(x, hidden, target, a1, Ws, bs, lin, bounds, precision, output)
    total = torch.stack([t.sum() for t in hidden] + [t.sum() for pair in grads for t in pair]).sum()
    return grads, out, hidden, first, last, torch.stack([quadratic_loss(out, target), total])


def _pc_step(hidden: list, x: torch.Tensor, target: torch.Tensor, mu1: torch.Tensor, m1, Ws: list, Wts: list,
             bs: list, lin: tuple, bounds: tuple, eta: float, precision: float, check: int, output: str = "se"):
    """One simultaneous step of predictive coding on a dense chain (returns new hidden layers and, by ``check``:
    0 nothing, 1 the ``L−1`` step sizes ``max|Δz_k|``, 2 a ``4(L−1)`` tensor: ``max|Δz_k|``, ``‖Δz_k‖``, ``‖ε_k‖``
    and ``max|z_k|`` (after the step) for each hidden layer in turn; ``Δz_k = −η ∂F/∂z_k`` is the step and ``ε_k``
    the prediction error at the step's start).
    ``mu1 = f(a_1)`` and ``m1 = f'(a_1)`` are fixed (the input is), ``Wts[k] = W_kᵀ``; ``output="ce"``: the output
    error is ``y − softmax(a_L)``."""
    L = len(Ws)
    z = [x, *hidden, target]
    eps, d = [None] * (L + 1), [None] * (L + 1)
    for k in range(1, L + 1):
        if k == 1:
            if check < 2:   # layer 1's error is never sent down (the input is fixed): z_1 − ηε_1 is a lerp
                continue
            mu, m = mu1, m1
        else:
            b = bs[k - 1]
            a = torch.addmm(b, z[k - 1], Wts[k - 1]) if b is not None else z[k - 1].mm(Wts[k - 1])
            if k < L and not lin[k - 1]:
                lo, hi = bounds[k - 1]
                mu = a.clamp(min=lo, max=hi)
                m = mu == a
            else:
                mu, m = a, None
        eps[k] = z[k] - (torch.softmax(mu, dim=1) if k == L and output == "ce" else mu)
        d[k] = eps[k] if m is None else eps[k] * m
    if precision != 1.0:
        d[L] = d[L] * precision
    new = []
    for k in range(1, L):
        own = torch.lerp(z[1], mu1, eta) if k == 1 else torch.sub(z[k], eps[k], alpha=eta)   # z_k − η ε_k
        new.append(torch.addmm(own, d[k + 1], Ws[k], alpha=eta))
    if not check or not new:
        return new, None
    # element-wise only (the step is −η ∂F/∂z_k), one fused reduction per quantity over all layers
    step = torch._foreach_sub(new, z[1:L])
    if check == 1:
        return new, torch.stack(max_abs(step))
    return new, torch.stack([*max_abs(step), *torch._foreach_norm(step),
                             *torch._foreach_norm(eps[1:L]), *max_abs(new)])


PC_STEP = CompiledStep(_pc_step, "the predictive-coding step")
PC_INFERENCE = CompiledStep(pc_inference, "the predictive-coding inference of a batch", whole_batch=True)
