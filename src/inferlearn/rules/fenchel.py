"""Fenchel back-propagation: back-propagation with finite-β targets ``z̄_k = f(a_k − β g_k)``.

The top-down linearised contrastive surrogate (MATH.md §B) with the Fenchel layer energy
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
    (linearised surrogate); MATH.md §B.
"""
from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from ..units import UnitSet
from ..losses import LOSSES, one_hot, quadratic_loss
from ..models import MLP
from .base import Rule, StepInfo, accumulate_grad, register_rule


def _check_beta(beta) -> float:
    ok = isinstance(beta, (int, float)) and not isinstance(beta, bool) and math.isfinite(beta) and beta > 0
    if not ok:
        raise ValueError(f"Invalid beta: {beta}")
    return float(beta)


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
        self.beta = _check_beta(beta)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not a.requires_grad:
            return self.f(a)
        return _FenchelFn.apply(a, self.f, self.beta)

    def extra_repr(self) -> str:
        return f"f={self.f!r}, beta={self.beta:g}"


CONVERTIBLE = (nn.ReLU, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.LeakyReLU, nn.ReLU6)


def convert_activations(model: nn.Module, beta: float, inplace: bool = False) -> nn.Module:
    """Replace every supported activation module by a :class:`FenchelActivation` with ``β``.

    Supported: ``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardsigmoid``, ``nn.Hardtanh``, ``nn.Sigmoid``,
    ``nn.Tanh``, ``nn.LeakyReLU`` (and existing ``FenchelActivation`` modules, whose β is reset).
    Activations called functionally inside ``forward`` (``F.relu``) cannot be seen and stay
    back-propagated; an :class:`~inferlearn.models.MLP` is handled by the rule directly.

    Args:
        inplace: convert ``model`` itself; otherwise a copy that *shares the parameters* of
            ``model`` (gradients land in the original parameters) is converted and returned.

    Returns:
        the converted model. Raises ``ValueError`` if it contains no activation module to convert.
    """
    beta = _check_beta(beta)
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


def fenchel_delta(units: UnitSet, a: torch.Tensor, g: torch.Tensor, beta: float) -> torch.Tensor:
    """``(Π_C(a) − Π_C(a − βg))/β`` for a box unit set (the MLP's hidden units)."""
    return (units.project(a) - units.project(a - beta * g)) / beta


@register_rule
@dataclass
class FenchelBackProp(Rule):
    """Fenchel back-propagation: ``δ_k = (f(a_k) − f(a_k − β g_k))/β`` in place of ``f'(a_k) g_k``.

    Args:
        beta: ``β > 0``, measured against the per-sample loss gradient; ``β → 0`` is
            back-propagation.
        loss: ``"quadratic"`` (default) or ``"cross-entropy"``.

    References:
        Zach, bilevel paper, Sec. 4.2; MATH.md §B "Fenchel back-propagation".

    Note:
        The output layer is linear, so its δ is the loss gradient exactly (``z̄_L = a_L − βg``).
        Non-MLP models are converted with :func:`convert_activations` on a parameter-sharing copy,
        cached per model.
    """

    name = "fenchel-bp"
    beta: float = 0.1
    loss: str = "quadratic"

    def __post_init__(self) -> None:
        _check_beta(self.beta)
        if self.loss not in LOSSES:
            raise ValueError(f"Unknown loss {self.loss!r}; choose one of {list(LOSSES)}")
        self._converted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        if isinstance(model, MLP):
            return self._mlp_backward(model, x, labels)
        conv = self._converted.get(model)
        if conv is None:
            conv = convert_activations(model, self.beta)
            self._converted[model] = conv
        with torch.enable_grad():
            output = conv(x)
            if self.loss == "quadratic":
                loss = quadratic_loss(output, one_hot(labels, output.shape[1], output.dtype))
            else:
                loss = F.cross_entropy(output, labels.long())
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())

    @torch.no_grad()
    def _mlp_backward(self, model: MLP, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        layers, B = model.layers, x.shape[0]
        zs, pres = model.forward_all(x)
        out = zs[-1]
        y = one_hot(labels, out.shape[1], out.dtype)
        if self.loss == "quadratic":
            loss = quadratic_loss(out, y)
            g = out - y                                   # per-sample ∂ℓ/∂z_L
        else:
            loss = F.cross_entropy(out, labels.long())
            g = torch.softmax(out, dim=1) - y
        delta = g                                         # linear output: z̄_L = a_L − βg exactly
        scale = 1.0 / B                                   # batch mean
        for k in range(len(layers) - 1, -1, -1):
            ds = delta * scale
            accumulate_grad(layers[k].weight, ds.t().mm(zs[k]), owned=True)
            accumulate_grad(layers[k].bias, ds.sum(0), owned=True)
            if k > 0:
                g = delta.mm(layers[k].weight)
                units = model.units[k - 1]
                if not units.is_linear:
                    # δ = (z_k − Π_C(a_k − βg))/β, reusing the forward z_k = Π_C(a_k); four in-place-friendly ops
                    nudged = units.project(torch.add(pres[k], g, alpha=-self.beta))
                    delta = zs[k].sub(nudged).div_(self.beta)
                else:
                    delta = g
        return StepInfo(loss=float(loss), output=out)
