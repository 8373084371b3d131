"""The inner energies of the argmin layer: ``E(z; inputs)`` per sample, with its gradient, Lipschitz constant,
closed form and convex conjugate where they exist.

Energies return one value per sample (shape ``(batch,)``); the problem is separable over the batch,
and solvers treat the batch as one problem (sums of energies). Shipped energies:
:class:`QuadraticEnergy` (``½ zᵀQz − cᵀz``), :class:`LeastSquaresEnergy` (non-negative least squares
with ``Box.nonnegative()``), :class:`ProximalEnergy` (``½‖z − a‖²``: with ``Box(0, 1)`` its argmin is
the hard-sigmoid unit) and :class:`FunctionEnergy` (any Python function of ``z`` and the inputs).

References:
    Zach, "Bilevel programs meet deep learning", Sec. 2 (the inner problem); docs/maths.md §B.
"""
from __future__ import annotations

import abc
import math
from collections.abc import Callable

import torch
from torch import nn

from ..units import Box



class Energy(abc.ABC):
    """An inner objective ``E(z; inputs)``, one value per sample.

    Subclasses implement :meth:`value`; the others have generic defaults (autograd, backtracking).
    Parameters an energy owns (when it is also an ``nn.Module``) receive gradients from the layer.

    Attributes:
        convex: whether ``E`` is claimed convex in ``z``; solvers check what they can (divergence,
            a nudged solution with lower energy than the free one) whatever this says.
    """

    convex: bool = True

    @abc.abstractmethod
    def value(self, z: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``E(z; inputs)`` per sample, shape ``(batch,)``."""

    def grad_z(self, z: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``∇_z E`` (autograd by default; override with a closed form for speed)."""
        with torch.enable_grad():
            zz = z.detach().requires_grad_(True)
            e = self.value(zz, *[x.detach() for x in inputs]).sum()
            (g,) = torch.autograd.grad(e, zz)
        return g

    def lipschitz(self, *inputs: torch.Tensor) -> float | None:
        """A Lipschitz constant of ``∇_z E`` (``None``: solvers backtrack)."""
        return None

    def closed_form(self, box: Box, shift: torch.Tensor | None, *inputs: torch.Tensor) -> torch.Tensor | None:
        """``argmin_{z ∈ box} E(z) + shiftᵀz`` in closed form, or ``None`` when there is none."""
        return None

    def conjugate(self, s: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        """``E*(s) = sup_z sᵀz − E(z)`` per sample (of ``E`` without its box): the dual of the inner problem
        (:mod:`inferlearn.bilevel.duality`). Energies without a closed form raise ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no convex conjugate; pass conjugate= to FunctionEnergy "
                                  "or use an energy that has one")

    def initial(self, *inputs: torch.Tensor) -> torch.Tensor:
        """A starting point whose shape is the variable's shape."""
        raise ValueError(f"{type(self).__name__} cannot infer the shape of z; pass init= to the layer's forward")

    def parameters_for_grad(self) -> list[torch.Tensor]:
        """Tensors the energy owns that need gradients (its ``nn.Module`` parameters)."""
        if isinstance(self, nn.Module):
            return [p for p in self.parameters() if p.requires_grad]
        return []


class QuadraticEnergy(Energy):
    """``E(z; Q, c) = ½ zᵀ Q z − cᵀ z`` with ``Q`` (n, n) symmetric positive definite, ``c`` (batch, n).

    With ``Q = I`` and ``c = a`` this is the proximal energy whose box-constrained argmin is the
    clamp (hard sigmoid for ``[0, 1]``). Unconstrained problems and diagonal ``Q`` are solved in
    closed form; the others by an accelerated projected-gradient method.
    """

    def value(self, z, Q, c):
        return 0.5 * ((z @ Q) * z).sum(-1) - (c * z).sum(-1)

    def grad_z(self, z, Q, c):
        return z @ (0.5 * (Q + Q.mT)) - c

    def lipschitz(self, Q, c):
        return float(torch.linalg.eigvalsh(0.5 * (Q + Q.mT).detach().double()).abs().max())

    def conjugate(self, s, Q, c):
        """``E*(s) = ½ (s + c)ᵀ Q⁻¹ (s + c)``."""
        v = s + c
        return 0.5 * (v * torch.linalg.solve(0.5 * (Q + Q.mT), v.mT).mT).sum(-1)

    def strong_convexity(self, Q, c) -> float:
        """``μ = λ_min(Q)`` (Prop. 3)."""
        return float(torch.linalg.eigvalsh(0.5 * (Q + Q.mT).detach().double()).min())

    def closed_form(self, box, shift, Q, c):
        rhs = c if shift is None else c - shift
        if box.is_unconstrained:
            return torch.linalg.solve(0.5 * (Q + Q.mT), rhs.mT).mT
        if bool((Q == torch.diag_embed(torch.diagonal(Q))).all()):
            return box.project(rhs / torch.diagonal(Q))
        return None

    def initial(self, Q, c):
        return torch.zeros_like(c)


class ProximalEnergy(Energy):
    """``E(z; a) = ½‖z − a‖²``; its argmin over a box is ``Π_C(a)`` (ReLU, hard sigmoid, hard tanh).

    The nudged problem ``argmin ½‖z − a‖² + β gᵀz = Π_C(a − βg)`` is the Fenchel / proximal layer of
    Fenchel back-propagation (docs/maths.md §B), so a stack of these layers with the contrastive backward is
    :class:`inferlearn.rules.fenchel.FenchelBackProp`.
    """

    def value(self, z, a):
        return 0.5 * (z - a).pow(2).sum(-1)

    def grad_z(self, z, a):
        return z - a

    def lipschitz(self, a):
        return 1.0

    def conjugate(self, s, a):
        """``E*(s) = ½‖s‖² + sᵀa``."""
        return 0.5 * s.pow(2).sum(-1) + (s * a).sum(-1)

    def closed_form(self, box, shift, a):
        return box.project(a if shift is None else a - shift)

    def initial(self, a):
        return torch.zeros_like(a)


class LeastSquaresEnergy(nn.Module, Energy):
    """``E(z; y) = ½‖D z − y‖² + (ridge/2)‖z‖²`` with a learnable dictionary ``D`` (m, k).

    With ``Box.nonnegative()`` this is non-negative least squares (NNLS): the layer maps a signal
    ``y`` (batch, m) to non-negative codes ``z`` (batch, k). ``D`` is a parameter of this module and
    receives gradients from the layer's backward.

    Args:
        dictionary: initial ``D`` (m, k).
        ridge: ``ridge ≥ 0``; ``ridge > 0`` makes ``E`` strongly convex (unique codes).
    """

    def __init__(self, dictionary: torch.Tensor, ridge: float = 0.0):
        super().__init__()
        if dictionary.dim() != 2:
            raise ValueError(f"Expected a dictionary of shape (m, k), got {tuple(dictionary.shape)}")
        if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
            raise ValueError(f"Invalid ridge: {ridge}")
        self.D = nn.Parameter(dictionary.clone())
        self.ridge = float(ridge)

    def value(self, z, y):
        return 0.5 * (z @ self.D.mT - y).pow(2).sum(-1) + 0.5 * self.ridge * z.pow(2).sum(-1)

    def grad_z(self, z, y):
        D = self.D.detach()
        return (z @ D.mT - y) @ D + self.ridge * z

    def lipschitz(self, y):
        return float(torch.linalg.matrix_norm(self.D.detach().double(), ord=2) ** 2) + self.ridge

    def conjugate(self, s, y):
        """``E*(s) = ½ (s + Dᵀy)ᵀ (DᵀD + ridge·I)⁻¹ (s + Dᵀy) − ½‖y‖²`` (needs ``ridge > 0`` or ``D`` of full
        column rank)."""
        P = self.D.mT @ self.D + self.ridge * torch.eye(self.D.shape[1], dtype=self.D.dtype, device=self.D.device)
        v = s + y @ self.D
        return 0.5 * (v * torch.linalg.solve(P, v.mT).mT).sum(-1) - 0.5 * y.pow(2).sum(-1)

    def initial(self, y):
        return y.new_zeros(y.shape[:-1] + (self.D.shape[1],))


class FunctionEnergy(Energy):
    """A user-supplied energy ``fn(z, *inputs) -> (batch,)`` (gradients by autograd).

    Args:
        fn: the energy, per sample; must be differentiable in ``z`` and the inputs.
        init: ``init(*inputs) -> z0`` giving the starting point (and the shape of ``z``); otherwise
            pass ``init=`` to the layer's forward.
        lipschitz: a Lipschitz constant of ``∇_z fn`` if known (else backtracking).
        convex: whether ``fn`` is convex in ``z`` (informational; non-convexity that the solvers
            notice is reported either way).
        conjugate: ``conjugate(s, *inputs) -> (batch,)``, the convex conjugate ``fn*`` if known (for the
            dual, min–min–min form of :mod:`inferlearn.bilevel.duality`).
    """

    def __init__(self, fn: Callable[..., torch.Tensor], init: Callable[..., torch.Tensor] | None = None,
                 lipschitz: float | None = None, convex: bool = True,
                 conjugate: Callable[..., torch.Tensor] | None = None):
        if not callable(fn):
            raise TypeError(f"FunctionEnergy needs a callable, got {type(fn).__name__}")
        if lipschitz is not None and not (math.isfinite(lipschitz) and lipschitz > 0):
            raise ValueError(f"Invalid lipschitz: {lipschitz}")
        if conjugate is not None and not callable(conjugate):
            raise TypeError(f"conjugate must be callable, got {type(conjugate).__name__}")
        self.fn, self._init, self._lipschitz, self.convex, self._conjugate = fn, init, lipschitz, convex, conjugate

    def conjugate(self, s, *inputs):
        if self._conjugate is None:
            return super().conjugate(s, *inputs)
        return self._conjugate(s, *inputs)

    def value(self, z, *inputs):
        e = self.fn(z, *inputs)
        if e.shape != z.shape[:-1]:
            raise ValueError(f"The energy function must return one value per sample, shape {tuple(z.shape[:-1])}; "
                             f"got {tuple(e.shape)}")
        return e

    def lipschitz(self, *inputs):
        return self._lipschitz

    def initial(self, *inputs):
        if self._init is None:
            return super().initial(*inputs)
        return self._init(*inputs)


class Shifted(Energy):
    """``E(z) + sᵀz`` with a fixed shift ``s`` (the nudged problem ``E + β gᵀz``)."""

    def __init__(self, energy: Energy, shift: torch.Tensor | None):
        self.energy, self.shift = energy, shift

    def value(self, z, *inputs):
        e = self.energy.value(z, *inputs)
        return e if self.shift is None else e + (self.shift * z).sum(-1)

    def grad_z(self, z, *inputs):
        g = self.energy.grad_z(z, *inputs)
        return g if self.shift is None else g + self.shift

    def lipschitz(self, *inputs):
        return self.energy.lipschitz(*inputs)
