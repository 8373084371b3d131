"""Diagnostics shared by all rules: active non-linearities, accuracy, gradient alignment with BP.

* ``active_fraction``: the share of hidden units (over a data set) whose non-linearity is engaged,
  i.e. where the projection ``Π_C`` changes the pre-activation (docs/maths.md §A: standard lifted training
  drives this towards 0; contrastive training keeps about half).
* ``gradient_alignment``: per-layer cosine similarity and norm ratio between a rule's gradient and
  back-propagation's on the same batch and weights.
* ``equilibrium_gap``: how far a rule's gradient (at its inference settings) is from the gradient at the
  equilibrium that its inference approaches.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import TYPE_CHECKING

import torch
from torch import nn

from .engine.graph import read_graph

if TYPE_CHECKING:
    from .rules.base import Rule


@torch.no_grad()
def active_counts(model: nn.Module, x: torch.Tensor, batch_size: int = 2000) -> tuple[int, int] | None:
    """``(engaged, total)`` hidden box-unit evaluations over ``x`` (see :func:`active_fraction`).

    ``(0, 0)`` without box units; ``None`` for a model that is not a chain.
    """
    try:
        chain = read_graph(model)
    except (ValueError, TypeError):
        return None
    engaged, total = 0, 0
    last = [max((c for c, _ in chain.children[k]), default=0) for k in range(chain.depth + 1)]   # last reader
    for start in range(0, x.shape[0], batch_size):
        zs = [x[start:start + batch_size]]
        for k, link in enumerate(chain.nodes[:-1], start=1):
            a = link.pre(zs)
            if link.units is not None:
                engaged += int(link.units.engaged(a).sum())
                total += a.numel()
            zs.append(link.act(a))
            for j in link.sources:   # drop the values no later node reads (a deep net's batch stays small)
                if last[j] <= k:
                    zs[j] = None
    return engaged, total


def active_fraction(model: nn.Module, x: torch.Tensor, batch_size: int = 2000) -> float:
    """Fraction of hidden box-unit evaluations over ``x`` where ``Π_C(a) ≠ a`` (0 for linear networks).

    Any chain (:func:`~inferlearn.engine.graph.read_graph`); hidden activations that are not box
    units are not counted (0 without any). ``nan`` for a model that is not a chain.
    """
    counts = active_counts(model, x, batch_size)
    if counts is None:
        return float("nan")
    engaged, total = counts
    return engaged / total if total else 0.0


@torch.no_grad()
def correct_count(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, batch_size: int = 2000) -> int:
    """How many rows of ``x`` the model classifies right (``argmax model(x) == labels``)."""
    correct = 0
    for start in range(0, x.shape[0], batch_size):
        out = model(x[start:start + batch_size])
        correct += int((out.argmax(dim=1) == labels[start:start + batch_size]).sum())
    return correct


def evaluate(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, batch_size: int = 2000) -> float:
    """Classification accuracy of ``argmax model(x)``."""
    return correct_count(model, x, labels, batch_size) / max(1, x.shape[0])


def rule_gradients(rule, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradient a rule produces on one batch, on a copy of ``model`` (the model is untouched)."""
    clone = copy.deepcopy(model)
    clone.zero_grad(set_to_none=True)
    rule.backward(clone, x, labels)
    return {n: p.grad.detach().clone() for n, p in clone.named_parameters() if p.grad is not None}


def gradient_alignment(rule, model: nn.Module, x: torch.Tensor, labels: torch.Tensor,
                       reference: "Rule | None" = None) -> list[dict]:
    """Per-parameter cosine similarity and norm ratio of ``rule``'s gradient to the reference's.

    Args:
        reference: the reference rule, by default ``BackProp()`` with the quadratic loss.

    Returns:
        one dict per parameter: ``{"param", "cosine", "norm_ratio"}`` (``norm_ratio = ‖g‖/‖g_ref‖``).
    """
    from .rules import BackProp

    reference = reference or BackProp()
    g = rule_gradients(rule, model, x, labels)
    g_ref = rule_gradients(reference, model, x, labels)
    rows = []
    for name, ref in g_ref.items():
        if name not in g:
            continue
        a, b = g[name].flatten().double(), ref.flatten().double()
        denom = a.norm() * b.norm()
        rows.append({"param": name,
                     "cosine": float(a @ b / denom) if denom > 0 else float("nan"),
                     "norm_ratio": float(a.norm() / b.norm()) if b.norm() > 0 else float("nan")})
    return rows


def equilibrium_gap(rule: "Rule", model: nn.Module, x: torch.Tensor, labels: torch.Tensor,
                    epoch: int | None = None, n_samples: int | None = None) -> float | None:
    """``‖g − g*‖ / ‖g*‖`` over all parameters: the rule's gradient ``g`` at its own inference settings against
    ``g*``, the same rule run to its equilibrium (:meth:`~inferlearn.rules.Rule.equilibrium_options`: e.g.
    predictive coding with 3000 steps of the same updates), both in float64 on copies of ``model`` (model and
    rule untouched, their warnings silenced: this is a measurement). ``None`` for a rule without such a
    counterpart (back-propagation, rules solved to a tolerance, ePC in its small-step regime).

    The inference of PC, MAC and LPOM runs a fixed number of steps, and their fast paths do not know ``g*``:
    the per-batch verdicts (``StepInfo.extras["converged"]``, the *far* warning) judge the last step's
    residual, which does not bound the gradient's distance (PC's defaults leave the MNIST MLP's gradient 30-50 %
    from the equilibrium's by design, with nothing to warn about). This measures it: one solve of
    ``EQUILIBRIUM_STEPS`` steps, so use a few samples (``inferlearn train --check-equilibrium`` measures 32
    after every epoch and warns once per run above 10 %).

    Args:
        epoch: the epoch whose per-epoch options apply to ``g*`` (``begin_epoch``: MAC's μ, PC's β schedule);
            ``None``: the rule's first epoch's (``g`` always takes the rule's current state).
        n_samples: the training set's size that ``begin_epoch`` is told (default: the batch's).

    Example:
        >>> import torch
        >>> from inferlearn.models import MLP
        >>> from inferlearn.rules import make_rule
        >>> x, labels = torch.rand(8, 12, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 3
        >>> gap = equilibrium_gap(make_rule("pc", {"steps": 5}), MLP("12-8-8-3", "relu", seed=0), x, labels)
        >>> 0.0 < gap < 1.0
        True
    """
    options = rule.equilibrium_options()
    if options is None:
        return None
    mine, settled = copy.deepcopy(rule), dataclasses.replace(rule, **options)
    if epoch is not None:
        settled.begin_epoch(epoch, n_samples if n_samples is not None else x.shape[0])
    model64, x64 = copy.deepcopy(model).double(), x.double() if x.is_floating_point() else x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = rule_gradients(mine, model64, x64, labels)
        ref = rule_gradients(settled, model64, x64, labels)
    names = [n for n in ref if n in g]
    diff = torch.stack([(g[n] - ref[n]).norm() for n in names]).norm()
    size = torch.stack([ref[n].norm() for n in names]).norm()
    return float(diff / size) if size > 0 else float(diff)


def mean_weight_alignment(rows: list[dict]) -> float:
    """Mean cosine over the weight matrices (parameters whose name ends in ``weight``)."""
    vals = [r["cosine"] for r in rows if r["param"].endswith("weight")]
    return sum(vals) / len(vals) if vals else float("nan")
