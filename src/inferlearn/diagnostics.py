"""Diagnostics shared by all rules: active non-linearities, accuracy, gradient alignment with BP.

* ``active_fraction``: the share of hidden units (over a data set) whose non-linearity is engaged,
  i.e. where the projection ``Π_C`` changes the pre-activation (docs/maths.md §A: standard lifted training
  drives this towards 0; contrastive training keeps about half).
* ``gradient_alignment``: per-layer cosine similarity and norm ratio between a rule's gradient and
  back-propagation's on the same batch and weights.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from .engine.chain import model_chain

if TYPE_CHECKING:
    from .rules.base import Rule


@torch.no_grad()
def active_counts(model: nn.Module, x: torch.Tensor, batch_size: int = 2000) -> tuple[int, int] | None:
    """``(engaged, total)`` hidden box-unit evaluations over ``x`` (see :func:`active_fraction`).

    ``(0, 0)`` without box units; ``None`` for a model that is not a chain.
    """
    try:
        chain = model_chain(model)
    except (ValueError, TypeError):
        return None
    engaged, total = 0, 0
    last = [max((c for c, _ in chain.children[k]), default=0) for k in range(chain.depth + 1)]   # last reader
    for start in range(0, x.shape[0], batch_size):
        zs = [x[start:start + batch_size]]
        for k, link in enumerate(chain.links[:-1], start=1):
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

    Any chain (:func:`~inferlearn.engine.chain.model_chain`); hidden activations that are not box
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


def mean_weight_alignment(rows: list[dict]) -> float:
    """Mean cosine over the weight matrices (parameters whose name ends in ``weight``)."""
    vals = [r["cosine"] for r in rows if r["param"].endswith("weight")]
    return sum(vals) / len(vals) if vals else float("nan")
