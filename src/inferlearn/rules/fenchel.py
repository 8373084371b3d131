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

**Layer-wise β_k.** The nested recursion of the paper has one nudging strength per level (docs/maths.md
§B, "deeply nested problems": ``z̄_k = argmin E_k + β_k g_kᵀz``, ``g_{k-1} = (…)/β_k``), and nothing ties
the levels together: the finite difference of layer ``k`` is taken with its own ``β_k``::

    z̄_k = f(a_k − β_k g_k),   δ_k = (z_k − z̄_k) / β_k

Give them as ``betas="0.1,0.05,0.02"`` (one per activation of the chain, from the input side: the
``L − 1`` hidden layers of an MLP) or as a geometric schedule ``β_k = β · r^{k−1}`` (``beta_ratio=r``).
Equal ``β_k`` are the global-β rule exactly; every ``β_k → 0`` is back-propagation.

References:
    Zach, "Bilevel programs meet deep learning", Sec. 4.2 (Fenchel back-propagation) and Eq. 37
    (linearised surrogate); docs/maths.md §B.
"""
from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..engine.graph import dense_graph, read_graph
from ..engine.fused import DensePlan, dense_backward
from ..engine.phases import check_beta
from ..losses import check_loss, output_loss
from ..units import Clamp, Box
from .base import Rule, StepInfo, check_positive, register_rule


def fenchel_difference(f: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor, g: torch.Tensor,
                       beta: float) -> torch.Tensor:
    """``(f(a) − f(a − βg)) / β`` resolved relative to its own size (the differential form).

    In float32 the nudge ``βg`` drowns in the rounding of ``a`` once ``β|g| ≲ ε|a|`` (measured on the MNIST
    MLP: 10.6 % gradient error at β = 1e-6, 0.1 % at 1e-4). The difference of the two activations is therefore
    formed in float64 from the float32 ``a`` and ``g`` (element-wise, cheap beside the layer maps) and only the
    result ``δ`` is rounded back: ``δ`` then carries the relative precision of the dtype for every β the
    float64 range resolves.
    """
    if a.dtype == torch.float64:
        return (f(a) - f(a - beta * g)) / beta
    a64, g64 = a.double(), g.double()
    return ((f(a64) - f(a64 - beta * g64)) / beta).to(a.dtype)


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
            delta = fenchel_difference(ctx.f, a, g, b)
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


def convert_activations(model: nn.Module, beta: float | Sequence[float], inplace: bool = False) -> nn.Module:
    """Replace every supported activation module by a :class:`FenchelActivation` with ``β``.

    ``beta`` may be a sequence: one β per convertible activation, in the order :func:`activation_order`
    lists them (``model.modules()`` order, the forward order of an ``nn.Sequential``).

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
    betas = [check_beta(b) for b in beta] if isinstance(beta, Sequence) else None
    beta = check_beta(beta) if betas is None else None
    if not inplace:
        memo = {id(p): p for p in model.parameters()}
        memo.update({id(b): b for b in model.buffers()})
        model = copy.deepcopy(model, memo)
    n = 0
    # collect first (replacing while iterating would descend into the new wrappers), and read
    # _modules directly: named_children() skips a second use of the same activation instance
    found = [(parent, name, child) for parent, name, child in _activation_slots(model)
             if isinstance(child, (FenchelActivation,) + CONVERTIBLE)]
    if betas is not None and len(betas) != len(found):
        raise ValueError(f"Invalid beta: {len(betas)} values for the {len(found)} convertible activations of "
                         f"{type(model).__name__}")
    for parent, name, child in found:
        b = beta if betas is None else betas[n]
        if isinstance(child, FenchelActivation):
            child.beta = b
        else:
            setattr(parent, name, FenchelActivation(child, b))
        n += 1
    if n == 0 and not isinstance(model, FenchelActivation):
        raise ValueError(f"No activation module to convert in {type(model).__name__}; supported: "
                         f"{[c.__name__ for c in CONVERTIBLE]} (functional activations such as F.relu are not visible)")
    return model


def _activation_slots(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, name, child)`` for every child slot, in ``model.modules()`` order (a shared module once per use)."""
    return [(parent, name, child) for parent in model.modules(remove_duplicate=False)
            if not isinstance(parent, FenchelActivation) for name, child in parent._modules.items() if child is not None]


def activation_order(model: nn.Module) -> list[nn.Module]:
    """The convertible activation modules of ``model`` in the order :func:`convert_activations` visits them."""
    return [c for _, _, c in _activation_slots(model) if isinstance(c, (FenchelActivation,) + CONVERTIBLE)]


BETA_MIN, BETA_MAX = 1e-30, 1e6   # outside, β or the nudge a − βg leave float32 (NaN or overflow)


def parse_betas(value) -> tuple[float, ...] | None:
    """``"0.1,0.05"`` (or a sequence of numbers) → ``(0.1, 0.05)``; ``None`` stays ``None``.

    Raises:
        ValueError: ``Invalid betas: …`` for anything else, or a value outside ``[BETA_MIN, BETA_MAX]``.
    """
    if value is None:
        return None
    hint = "expected comma-separated positive numbers such as 0.1,0.05"
    if isinstance(value, str):
        try:
            vals = [float(v) for v in value.split(",")]
        except ValueError:
            raise ValueError(f"Invalid betas: {value!r} ({hint})") from None
    elif isinstance(value, Sequence) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                       for v in value):
        vals = [float(v) for v in value]
    else:
        raise ValueError(f"Invalid betas: {value!r} ({hint})")
    if not all(math.isfinite(v) and BETA_MIN <= v <= BETA_MAX for v in vals):
        raise ValueError(f"Invalid betas: {value!r} (every β_k must lie in [{BETA_MIN:g}, {BETA_MAX:g}])")
    return tuple(vals)


def check_fenchel_beta(beta, name: str = "beta") -> float:
    """β in ``[BETA_MIN, BETA_MAX]``: outside, β or the nudge ``a − βg`` leave float32 (``Invalid beta: …``)."""
    beta = check_beta(beta)
    if not BETA_MIN <= beta <= BETA_MAX:
        raise ValueError(f"Invalid {name}: {beta:g} (must lie in [{BETA_MIN:g}, {BETA_MAX:g}]: β or the nudge a − βg "
                         "would leave float32)")
    return beta


@register_rule
@dataclass
class FenchelBackProp(Rule):
    """Fenchel back-propagation: ``δ_k = (f(a_k) − f(a_k − β g_k))/β`` in place of ``f'(a_k) g_k``.

    Args:
        beta: ``β > 0``, measured against the per-sample loss gradient; ``β → 0`` is
            back-propagation.
        loss: ``"quadratic"`` (default) or ``"cross-entropy"``.
        betas: layer-wise ``β_k``, comma-separated (``"0.1,0.05,0.02"``), one per activation of the
            model's chain from the input side (an MLP's ``L − 1`` hidden layers; a non-linear output
            activation takes one more); overrides ``beta``. A wrong count is refused when the model is seen.
        beta_ratio: a geometric schedule ``β_k = β · r^{k−1}`` (``r > 0``); not with ``betas``.

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
    betas: str | None = None
    beta_ratio: float | None = None

    def __post_init__(self) -> None:
        check_fenchel_beta(self.beta)
        check_loss(self.loss)
        self._betas = parse_betas(self.betas)
        if self._betas is not None:
            self.betas = ",".join(f"{b:g}" for b in self._betas)   # canonical, JSON-clean (config.json)
        if self.beta_ratio is not None:
            check_positive("beta_ratio", self.beta_ratio)
            if self._betas is not None:
                raise ValueError("Invalid options: give either betas or beta_ratio, not both")

    def layer_betas(self, n: int) -> list[float] | None:
        """The ``n`` layer-wise ``β_k`` (``None``: one global β).

        Raises:
            ValueError: ``betas`` has another count than the model's ``n`` activation layers.
        """
        if self._betas is not None:
            if len(self._betas) != n:
                raise ValueError(f"Invalid betas: {len(self._betas)} values ({self.betas}) for a model with {n} "
                                 f"activation layers; give one β_k per layer")
            return list(self._betas)
        if self.beta_ratio is not None:
            try:
                return [check_fenchel_beta(self.beta * self.beta_ratio ** k, "beta_ratio") for k in range(n)]
            except OverflowError:
                raise ValueError(f"Invalid beta_ratio: {self.beta_ratio:g} (β·r^(k−1) overflows)") from None
        return None

    def dense_plan(self, model: nn.Module) -> DensePlan | None:
        """The fused dense backward (:func:`~inferlearn.engine.fused.dense_backward`) when ``model`` is a dense
        chain: ``constants = (loss, local backward)``; else ``None``."""
        chain = dense_graph(model)
        if chain is None:
            return None
        betas = self.layer_betas(chain.depth - 1) if self._betas is not None or self.beta_ratio is not None else None
        local = (partial(_fenchel_local, beta=self.beta) if betas is None
                 else [partial(_fenchel_local, beta=b) for b in betas])
        return DensePlan(chain, "bp", (self.loss, local))

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        plan = self.dense_plan(model)
        layerwise = self._betas is not None or self.beta_ratio is not None
        if plan is not None:
            loss, out = dense_backward(plan.graph, x, labels, *plan.constants)
            return StepInfo(loss=loss, output=out)
        graph = _functional_graph(model, x)
        if graph is not None:   # activations called as functions: convert the traced graph's nodes instead
            betas = self.layer_betas(len(graph.nodes) - 1 + (not graph.linear_output)) if layerwise else None
            forward = partial(_graph_forward, graph, betas=betas or self.beta)
        else:
            forward = converted_model(model, self._module_betas(model) if layerwise else self.beta)
        with torch.enable_grad():
            output = forward(x)
            loss = output_loss(self.loss, output, labels)
            loss.backward()
        return StepInfo(loss=float(loss.detach()), output=output.detach())


    def _module_betas(self, model: nn.Module) -> tuple[float, ...]:
        """The layer-wise β of each convertible activation module, in :func:`activation_order`."""
        try:
            chain = read_graph(model)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"Invalid betas for {type(model).__name__}: layer-wise β needs a model read as a graph "
                             f"({exc})") from None
        acts = [link.activation for link in chain.nodes[:-1]]
        if not chain.linear_output:
            acts.append(chain.nodes[-1].activation)
        betas = self.layer_betas(len(acts))
        pairs = [(a, b) for a, b in zip(acts, betas) if isinstance(a, (FenchelActivation,) + CONVERTIBLE)]
        if [id(a) for a, _ in pairs] != [id(a) for a in activation_order(model)]:
            raise ValueError(f"Invalid betas for {type(model).__name__}: its activation modules are registered in "
                             "another order than its forward pass applies them; use one global beta")
        return tuple(b for _, b in pairs)


def _functional_graph(model: nn.Module, x: torch.Tensor):
    """The traced graph of ``model`` when some of its activations are functions (``F.relu``), which module
    conversion cannot see; ``None`` when every activation is a module (or the model cannot be read)."""
    owned = {id(m) for m in model.modules()}
    try:
        graph = read_graph(model, example=x)
    except (ValueError, TypeError):
        return None
    hidden = [link.activation for link in graph.nodes]
    return graph if any(a is not None and id(a) not in owned for a in hidden) else None


def _graph_forward(graph, x: torch.Tensor, betas: float | Sequence[float]) -> torch.Tensor:
    """The model's output through its graph, each node's activation (in node order, the output's too unless
    linear) given Fenchel back-propagation's backward with its β."""
    zs, n = [x], 0
    for k, link in enumerate(graph.nodes, start=1):
        a = link.pre(zs)
        act = link.activation
        if act is None or (k == graph.depth and graph.linear_output):
            zs.append(act(a) if act is not None else a)
            continue
        b = betas if not isinstance(betas, Sequence) else betas[n]
        n += 1
        zs.append(FenchelActivation(act, b)(a) if isinstance(act, CONVERTIBLE) else act(a))
    return zs[-1]


def _fenchel_local(units: Box, z: torch.Tensor, a: torch.Tensor, g: torch.Tensor, beta: float) -> torch.Tensor:
    """``δ = (z − Π_C(a − βg))/β`` with the forward ``z = Π_C(a)``, in float64 below float64
    (:func:`fenchel_difference`: the differential form).

    Written ``a − β·g`` rather than ``torch.add(a, g, alpha=−β)``: torch 2.13's inductor folds the latter, with
    ``g`` a matrix product, into an ``addmm`` that drops ``alpha`` (wrong compiled gradients; the compiled
    step is tested equal to the eager one in ``tests/engine/test_compiled.py``)."""
    if a.dtype == torch.float64:
        return z.sub(units.project(a - beta * g)).div_(beta)
    return fenchel_difference(units.project, a, g, beta)


_CONVERTED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def converted_model(model: nn.Module, beta: float | Sequence[float]) -> nn.Module:
    """A parameter-sharing copy of ``model`` with its activations converted for ``β`` (cached per model and β;
    a sequence gives each activation its own, as in :func:`convert_activations`).

    The copy is rebuilt when the model's modules change (a cache, not rule state: the result is a
    function of the model and β).
    """
    per_model = _CONVERTED.setdefault(model, {})
    key = (tuple(beta) if isinstance(beta, Sequence) else beta, tuple(id(m) for m in model.modules()))
    conv = per_model.get(key)
    if conv is None:
        per_model.clear()
        conv = per_model[key] = convert_activations(model, beta)
    return conv
