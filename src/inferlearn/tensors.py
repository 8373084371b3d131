"""Tensor helpers shared by the models, the engine, the rules and ADMM: one home for each.

* :func:`accumulate_grad`: add a gradient to ``param.grad`` as autograd does (the rule contract: rules fill
  ``.grad`` and never step).
* :func:`all_finite` / :func:`has_only_finite`: NaN/inf checks with one synchronisation.
"""
from __future__ import annotations

import torch


def accumulate_grad(param: torch.Tensor, grad: torch.Tensor, owned: bool = False) -> None:
    """Add ``grad`` to ``param.grad`` (creating it), as autograd does: nothing for a parameter that does not
    require a gradient, ``grad`` cast to the parameter's dtype.

    Args:
        owned: ``grad`` is a fresh tensor that nobody else holds, so it may become ``param.grad``
            without a copy (hot paths).

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> accumulate_grad(w, torch.ones(2)); accumulate_grad(w, torch.ones(2))
        >>> w.grad.tolist()
        [2.0, 2.0]
    """
    if not param.requires_grad:
        return
    grad = grad.detach()
    if grad.dtype != param.dtype:
        grad, owned = grad.to(param.dtype), True
    if param.grad is None:
        param.grad = grad if owned else grad.clone()
    else:
        param.grad.add_(grad)


def all_finite(tensors) -> bool:
    """True when no tensor of ``tensors`` (a list) holds NaN/inf, with one synchronisation: a finite total of the
    tensors' sums proves it (NaN and inf propagate through sums); only a non-finite total (which a sum overflowing
    the dtype also gives) needs the element-wise check."""
    tensors = [t.detach() for t in tensors if t.numel()]
    if not tensors or bool(torch.isfinite(torch.stack([t.sum() for t in tensors]).sum())):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def has_only_finite(x: torch.Tensor) -> bool:
    """True when ``x`` has no NaN/inf (:func:`all_finite` of one tensor: a finite sum proves it, about 10× faster
    than ``isfinite(x).all()`` on a mini-batch)."""
    return all_finite([x])
