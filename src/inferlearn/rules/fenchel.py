"""Fenchel back-propagation: back-propagation with finite-β targets ``z̄_k = f(a_k − β g_k)``.

The top-down linearised contrastive surrogate (docs/maths.md §B) with the Fenchel layer energy
``E_k(z_k, z_{k-1}) = G_k(z_k) − z_kᵀ(W_{k-1} z_{k-1} + b_{k-1})``, ``∇G_k* = f`` (or, equivalently for
box units, the proximal energy ``½‖z_k − a_k‖² + ι_C(z_k)``) has the nudged minimiser in closed form::

    a_k = W_{k-1} z_{k-1} + b_{k-1},   z_k = f(a_k)                               (forward)
    z̄_k = f(a_k − β g_k),   δ_k = (z_k − z̄_k) / β                                  (nudged layer)
    ∇W_{k-1} = δ_k z_{k-1}ᵀ,   ∇b_{k-1} = δ_k,   g_{k-1} = W_{k-1}ᵀ δ_k                (backward)

so it is back-propagation with each activation's derivative ``f'(a) g`` replaced by the finite
difference ``(f(a) − f(a − βg))/β``. As ``β → 0`` it is back-propagation (where ``f`` is
differentiable); at a kink it takes the one-sided derivative in the direction that lowers the
loss (Prop. 2), e.g. a ReLU at ``a = 0`` passes ``g`` when ``g < 0``.

Two ways in:

* :class:`FenchelBackProp` (rule ``fenchel-bp``): a learning rule. For an
  :class:`~inferlearn.models.MLP` it runs the recursion above directly (fused, no autograd graph);
  for any other ``nn.Module`` it runs autograd on a parameter-sharing copy whose activation modules
  (``nn.ReLU``, ``nn.Hardsigmoid``, ``nn.Hardtanh``, ``nn.Sigmoid``, ``nn.Tanh``, ``nn.LeakyReLU``, and
  :class:`FenchelActivation` itself) are converted by :func:`convert_activations`.
* :func:`convert_activations` (``inplace=False`` by default): convert a model once and train it
  with ordinary ``loss.backward()``.

β is measured against the *per-sample* loss gradient: the rule nudges by ``β · B · g`` for a batch
of ``B`` samples whose batch-mean gradient is ``g``, so β does not depend on the batch size.

References:
    Zach, "Bilevel programs meet deep learning", Sec. 4.2 (Fenchel back-propagation) and Eq. 37
    (linearised surrogate); docs/maths.md §B.
"""
from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..engine.chain import dense_chain
from ..engine.fused import dense_backward
from ..engine.phases import check_beta
from ..losses import check_loss, output_loss
from ..units import Clamp, UnitSet
from .base import Rule, StepInfo, register_rule


class _FenchelFn(torch.autograd.Function):
    """``y = f(a)``; backward ``δ = (f(a) − f(a − β' g))/β'`` with ``β' = β · batch`` (per-sample β)."""

    @staticmethod
    def forward(ctx, a, f, beta):
        ctx.f, ctx.beta = f, beta
        ctx.save_for_backward(a)
        with torch.no_grad():
            return f(a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        b = ctx.beta * (a.shape[0] if a.dim() > 1 else 1)
        with torch.no_grad():
            delta = (ctx.f(a) - ctx.f(a - b * g)) / b
        return delta, None, None


class FenchelActivation(nn.Module):
    """An element-wise activation ``f`` whose backward is Fenchel back-propagation's finite difference.

    Forward is exactly ``f(a)``. Backward receives ``g`` and returns ``(f(a) − f(a − β'g))/β'`` with
    ``β' = β × batch size`` (first dimension), i.e. the derivative of the Fenchel/proximal layer's
    linearised contrastive surrogate.

    Args:
        f: the activation (a function or an element-wise ``nn.Module``).
        beta: ``β > 0``.
    """

    def __init__(self, f: Callable[[torch.Tensor], torch.Tensor], beta: float = 1e-2):
        super().__init__()
        if not callable(f):
            raise TypeError(f"FenchelActivation needs a callable activation, got {type(f).__name__}")
        self.f = f
        self.beta = check_beta(beta)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not a.requires_grad:
            return self.f(a)
        return _FenchelFn.apply(a, self.f, self.beta)

    def extra_repr(self) -> str:
        return f"f={self.f!r}, beta={self.beta:g}"


CONVERTIBLE = (nn.ReLU, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.LeakyReLU, nn.ReLU6, Clamp)


def convert_activations(model: nn.Module, beta: float, inplace: bool = False) -> nn.Module:
    """Replace every supported activation module by a :class:`FenchelActivation` with ``β``.

    Supported: ``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardsigmoid``, ``nn.Hardtanh``, ``nn.Sigmoid``,
    ``nn.Tanh``, ``nn.LeakyReLU``, :class:`~inferlearn.units.Clamp` (and existing ``FenchelActivation`` modules, whose β is reset).
    Activations called functionally inside ``forward`` (``F.relu``) cannot be seen and stay
    back-propagated; an :class:`~inferlearn.models.MLP` is handled by the rule directly.

    Args:
        inplace: convert ``model`` itself; otherwise a copy that *shares the parameters* of
            ``model`` (gradients land in the original parameters) is converted and returned.

    Returns:
        the converted model. Raises ``ValueError`` if it contains no activation module to convert.
    """
    beta = check_beta(beta)
    if not inplace:
        memo = {id(p): p for p in model.parameters()}
        memo.update({id(b): b for b in model.buffers()})
        model = copy.deepcopy(model, memo)
    n = 0
    # collect first: replacing while iterating would descend into the new wrappers
    # collect first (replacing while iterating would descend into the new wrappers), and read
    # _modules directly: named_children() skips a second use of the same activation instance
    found = [(parent, name, child) for parent in model.modules(remove_duplicate=False)
             if not isinstance(parent, FenchelActivation) for name, child in parent._modules.items() if child is not None]
    for parent, name, child in found:
        if isinstance(child, FenchelActivation):
            child.beta = beta
            n += 1
        elif isinstance(child, CONVERTIBLE):
            setattr(parent, name, FenchelActivation(child, beta))
            n += 1
    if n == 0 and not isinstance(model, FenchelActivation):
        raise ValueError(f"No activation module to convert in {type(model).__name__}; supported: "
                         f"{[c.__name__ for c in CONVERTIBLE]} (functional activations such as F.relu are not visible)")
    return model


@register_rule
@dataclass
class FenchelBackProp(Rule):
    """Fenchel back-propagation: ``δ_k = (f(a_k) − f(a_k − β g_k))/β`` in place of ``f'(a_k) g_k``.

    Args:
        beta: ``β > 0``, measured against the per-sample loss gradient; ``β → 0`` is
            back-propagation.
        loss: ``"quadratic"`` (default) or ``"cross-entropy"``.

    References:
        Zach, bilevel paper, Sec. 4.2; docs/maths.md §B "Fenchel back-propagation".

    Note:
        The output layer is linear, so its δ is the loss gradient exactly (``z̄_L = a_L − βg``).
        Dense chains (Linear layers with box units) use the fused recursion of
        :func:`~inferlearn.engine.fused.dense_backward`; other models are converted with
        :func:`convert_activations` on a parameter-sharing copy (:func:`converted_model`).
    """

    name = "fenchel-bp"
    recommended_lr = {"sgd": 0.2, "adam": 1e-3}   # benchmarks/tune_defaults.py, validation splits
    beta: float = 0.1
    loss: str = "quadratic"

    def __post_init__(self) -> None:
        check_beta(self.beta)
        check_loss(self.loss)

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain = dense_chain(model)
        if chain is not None:
            loss, out = dense_backward(chain, x, labels, self.loss, partial(_fenchel_local, beta=self.beta))
            return StepInfo(loss=loss, output=out)
        conv = converted_model(model, self.beta)
        with torch.enable_grad():
            output = conv(x)
            loss = output_loss(self.loss, output, labels)
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())


def _fenchel_local(units: UnitSet, z: torch.Tensor, a: torch.Tensor, g: torch.Tensor, beta: float) -> torch.Tensor:
    """``δ = (z − Π_C(a − βg))/β`` with the forward ``z = Π_C(a)`` (four in-place-friendly operations)."""
    return z.sub(units.project(torch.add(a, g, alpha=-beta))).div_(beta)


_CONVERTED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def converted_model(model: nn.Module, beta: float) -> nn.Module:
    """A parameter-sharing copy of ``model`` with its activations converted for ``β`` (cached per model and β).

    The copy is rebuilt when the model's modules change (a cache, not rule state: the result is a
    function of the model and β).
    """
    per_model = _CONVERTED.setdefault(model, {})
    key = (beta, tuple(id(m) for m in model.modules()))
    conv = per_model.get(key)
    if conv is None:
        per_model.clear()
        conv = per_model[key] = convert_activations(model, beta)
    return conv
