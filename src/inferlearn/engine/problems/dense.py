"""Lifted network energies: free, clamped and nudged, with per-sample values and envelope gradients.

A network with weights ``W_k`` (``n_{k+1} × n_k``), biases ``b_k`` and hidden unit sets ``C_k`` defines
the lifted energy (docs/maths.md §A, Eq. 2 of the paper, with biases)::

    E(z; x) = Σ_{k=1}^{L} (w_k / 2) ‖z_k − W_{k-1} z_{k-1} − b_{k-1}‖²,   z_0 = x,  z_k ∈ C_k (1 ≤ k < L)

with term weights ``w_k = γ^{k-1}`` (``γ`` the feedback weight; ``w_L`` may be overridden, see
``output_weight``). The output ``z_L`` of a row of a :class:`LiftedProblem` is one of

* **free**: ``z_L`` is a variable; it is eliminated in closed form (``z_L = a_L``, the top term vanishes);
* **clamped**: ``z_L := y`` (the clamped energy ``Ê``; its top term is the quadratic loss times ``w_L``);
* **nudged**: free plus a linear term ``β gᵀ z_L`` (equilibrium propagation with a linearised loss);
  eliminating ``z_L`` gives ``z_L = a_L − β g / w_L``.

Because the output is eliminated, a problem's variables are the hidden layers ``z_1 … z_{L-1}`` only.
Its Hessian is block tridiagonal and the same for every row of one output mode, which the solvers
in :mod:`inferlearn.engine.dense_solvers` exploit.

Envelope theorem: at a minimiser ``z*`` the gradient of ``min_z E`` with respect to the weights is
the partial gradient of ``E`` at fixed ``z*``::

    ∇_{W_k} E = w_{k+1} (W_k z_k + b_k − z_{k+1}) z_kᵀ,   ∇_{b_k} E = w_{k+1} (W_k z_k + b_k − z_{k+1})

which :meth:`LiftedEnergy.weight_grads` evaluates for a weighted sum over rows (e.g. clamped minus
free for contrastive learning).

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 2, 7 and 9;
    docs/maths.md §A.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...units import Box, get_units
from ..solvers.lifted_sweep import LIFTED_SWEEP, plain_bounds
from .layered_energy import gram_lambda_max
from .protocol import BatchProblem


def check_gamma(gamma: float) -> float:
    """Validate the feedback weight: finite and strictly positive (``ValueError("Invalid gamma: 0")``)."""
    ok = isinstance(gamma, (int, float)) and not isinstance(gamma, bool) and math.isfinite(gamma) and gamma > 0
    if not ok:
        raise ValueError(f"Invalid gamma: {gamma}")
    return float(gamma)


class LiftedEnergy:
    """The lifted energy of a layered network (weights, biases, unit sets, feedback weight).

    Args:
        weights: ``[W_0, …, W_{L-1}]``, ``W_k`` of shape ``(n_{k+1}, n_k)``.
        biases: ``[b_0, …, b_{L-1}]`` (``None`` entries or ``None`` mean zero biases).
        units: one unit set (or name) per hidden layer, ``L − 1`` of them.
        gamma: feedback weight ``γ > 0`` (the paper uses 1/8).
        output_weight: weight ``w_L`` of the output term; ``None`` means ``γ^{L-1}`` (the paper).
            A different value gives, e.g., equilibrium propagation's soft clamping.

    The tensors are detached: gradients are computed in closed form (envelope theorem), not by
    autograd through the energy.

    References:
        Zach & Estellers (2019), Eq. 2 (free energy) and Eq. 7 (clamped energy).
    """

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None,
                 units: Sequence[str | Box], gamma: float = 1 / 8, output_weight: float | None = None):
        self.gamma = check_gamma(gamma)
        if len(weights) < 1:
            raise ValueError("A lifted energy needs at least one weight matrix")
        self.weights = [w.detach() for w in weights]
        if biases is None:
            biases = [None] * len(self.weights)
        if len(biases) != len(self.weights):
            raise ValueError(f"Got {len(biases)} biases for {len(self.weights)} weight matrices")
        for k, w in enumerate(self.weights):
            if w.dim() != 2:
                raise ValueError(f"W_{k} must be a matrix, got shape {tuple(w.shape)}")
            if k and w.shape[1] != self.weights[k - 1].shape[0]:
                raise ValueError(f"W_{k} has {w.shape[1]} columns but layer {k} has {self.weights[k - 1].shape[0]} units")
        self.biases = [torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if b is None else b.detach()
                       for w, b in zip(self.weights, biases)]
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            if b.shape != (w.shape[0],):
                raise ValueError(f"b_{k} must have shape ({w.shape[0]},), got {tuple(b.shape)}")
        units = [get_units(u) for u in units]
        if len(units) != len(self.weights) - 1:
            raise ValueError(f"Got {len(units)} unit sets for {len(self.weights) - 1} hidden layers")
        self.units: tuple[Box, ...] = tuple(units)
        #: ``λ_max(W_kᵀW_k)`` computed for the step sizes (:meth:`LiftedProblem.block_curvature`), by weight version
        self.curvature_cache: dict = {}
        L = len(self.weights)
        # term_weights[k] = w_k multiplies ½‖z_k − a_k‖² (index 0 unused)
        self.term_weights = [0.0] + [self.gamma ** (k - 1) for k in range(1, L + 1)]
        if output_weight is not None:
            if not (math.isfinite(output_weight) and output_weight > 0):
                raise ValueError(f"Invalid output_weight: {output_weight}")
            self.term_weights[L] = float(output_weight)

    @classmethod
    def from_model(cls, model, gamma: float = 1 / 8, output_weight: float | None = None,
                   dtype: torch.dtype | None = None) -> "LiftedEnergy":
        """Build the energy of a dense chain (an :class:`~inferlearn.models.MLP` or a plain ``nn.Sequential``
        of ``Linear`` layers and box units; weights detached, optionally cast)."""
        from ..graph import read_graph

        return cls.from_chain(read_graph(model), gamma, output_weight, dtype)

    @classmethod
    def from_chain(cls, chain, gamma: float = 1 / 8, output_weight: float | None = None,
                   dtype: torch.dtype | None = None) -> "LiftedEnergy":
        """Build the energy of a dense :class:`~inferlearn.engine.graph.Graph` (see :meth:`from_model`)."""
        if not chain.is_dense:
            raise ValueError(f"{type(chain.model).__name__} is not a dense chain (Linear layers with box units and "
                             "a linear output); use inferlearn.engine.layered.LayeredEnergy")
        layers = [link.linear for link in chain.nodes]
        ws = [layer.weight for layer in layers]            # detached by __init__
        bs = [layer.bias for layer in layers]
        units = [link.units for link in chain.nodes[:-1]]
        if dtype is not None:
            ws = [w.to(dtype) for w in ws]
            bs = [None if b is None else b.to(dtype) for b in bs]
        return cls(ws, bs, units, gamma=gamma, output_weight=output_weight)

    # -- shape ---------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Number of weight layers ``L``."""
        return len(self.weights)

    @property
    def sizes(self) -> list[int]:
        return [self.weights[0].shape[1]] + [w.shape[0] for w in self.weights]

    @property
    def dtype(self) -> torch.dtype:
        return self.weights[0].dtype

    @property
    def device(self) -> torch.device:
        return self.weights[0].device

    def to(self, dtype: torch.dtype) -> "LiftedEnergy":
        """A copy with weights cast to ``dtype`` (e.g. float64 for reference solves)."""
        out = LiftedEnergy([w.to(dtype) for w in self.weights], [b.to(dtype) for b in self.biases], self.units,
                           gamma=self.gamma)
        out.term_weights = list(self.term_weights)
        return out

    def feedback(self, k: int) -> float:
        """``ρ_k = w_{k+1} / w_k``: the weight of the feedback from layer ``k+1`` into hidden layer ``k``."""
        return self.term_weights[k + 1] / self.term_weights[k]

    # -- maths ---------------------------------------------------------------------------------
    def pre(self, k: int, z_prev: torch.Tensor) -> torch.Tensor:
        """Pre-activation ``a_k = W_{k-1} z_{k-1} + b_{k-1}`` for a batch ``z_prev`` (rows are samples)."""
        return torch.addmm(self.biases[k - 1], z_prev, self.weights[k - 1].t())

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Forward pass ``[x, z_1, …, z_L]`` with ``z_k = Π_{C_k}(a_k)`` (the γ → 0 minimiser)."""
        zs = [x]
        for k in range(1, self.depth + 1):
            a = self.pre(k, zs[-1])
            zs.append(a if k == self.depth else self.units[k - 1].project(a))
        return zs

    def terms(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-sample, per-term values ``(w_k / 2) ‖z_k − a_k‖²``, shape ``(batch, L)``.

        Args:
            zs: all layers ``[x, z_1, …, z_L]`` (constraints are not checked here).
        """
        self._check_layers(zs)
        cols = []
        for k in range(1, self.depth + 1):
            r = zs[k] - self.pre(k, zs[k - 1])
            cols.append(0.5 * self.term_weights[k] * r.pow(2).sum(dim=1))
        return torch.stack(cols, dim=1)

    def value(self, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-sample energy ``E(z)`` for given layers ``[x, z_1, …, z_L]`` (no constraint check)."""
        return self.terms(zs).sum(dim=1)

    def weight_grads(self, zs: Sequence[torch.Tensor], coef: torch.Tensor | float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Envelope gradients ``Σ_i coef_i ∇_{W_k, b_k} E(z^{(i)})`` at fixed layers ``zs``.

        ``∇_{W_k} E = w_{k+1} (a_{k+1} − z_{k+1}) z_kᵀ`` (docs/maths.md §A). At a minimiser over the free
        variables this is the gradient of the minimum value (envelope / Danskin theorem); for a
        nudged row pass its eliminated output ``z_L = a_L − βg/w_L`` (``LiftedProblem.full``),
        which makes the top term's gradient ``β g z_{L-1}ᵀ`` as it should be.

        Args:
            zs: ``[x, z_1, …, z_L]`` for a batch.
            coef: per-row coefficients ``(batch,)`` or a scalar (e.g. ``±1/(batch·γ^{L-1})``).

        Returns:
            ``[(grad W_k, grad b_k) for k = 0 … L−1]``.
        """
        self._check_layers(zs)
        out = []
        coef_col = coef.reshape(-1, 1) if torch.is_tensor(coef) else None
        for k in range(self.depth):
            r = self.pre(k + 1, zs[k]) - zs[k + 1]
            r = r * coef_col if coef_col is not None else r * coef
            r = r * self.term_weights[k + 1]
            out.append((r.t() @ zs[k], r.sum(dim=0)))
        return out

    def _check_layers(self, zs: Sequence[torch.Tensor]) -> None:
        if len(zs) != self.depth + 1:
            raise ValueError(f"Expected {self.depth + 1} layers [x, z_1, …, z_L], got {len(zs)}")
        for k, (z, n) in enumerate(zip(zs, self.sizes)):
            if z.dim() != 2 or z.shape[1] != n:
                raise ValueError(f"Layer {k} must have shape (batch, {n}), got {tuple(z.shape)}")

    # -- problems ------------------------------------------------------------------------------
    def problem(self, x: torch.Tensor, target: torch.Tensor | None = None, *, clamped: torch.Tensor | None = None,
                nudge: torch.Tensor | None = None, beta: float = 1.0, check: bool = True) -> "LiftedProblem":
        """An inference problem ``min_{z_1..z_{L-1}} E`` for a batch.

        Args:
            x: inputs ``(batch, n_0)``.
            target: ``(batch, n_L)`` output values of clamped rows (one-hot targets for ``Ê``).
            clamped: ``(batch,)`` bool, which rows are clamped; default: all rows when ``target`` is
                given, none otherwise. Mixed rows solve free and clamped phases in one batch.
            nudge: ``(batch, n_L)`` direction ``g`` of the linear nudge ``β gᵀ z_L`` on free rows.
            beta: the nudge strength ``β`` (any sign; 0 is the free phase).
            check: check ``x`` and ``target`` for NaN/inf (callers that validated them already skip it).

        Raises:
            ValueError: wrong shapes (e.g. target width ≠ number of outputs), non-finite values, or
                clamped rows without a target.
        """
        return LiftedProblem(self, x, target, clamped, nudge, beta, check)

    def hessian(self, clamped: bool) -> torch.Tensor:
        """Dense Hessian of a problem over the stacked hidden variables (free or clamped rows).

        Blocks: ``H_kk = w_k I + w_{k+1} W_kᵀW_k`` (for the top hidden layer only when the output is
        clamped; a free output is eliminated and contributes nothing), ``H_{k,k+1} = −w_{k+1} W_kᵀ``.
        Used by the reference solver and by tests; ``O((Σ n_k)²)`` memory.
        """
        L = self.depth
        n = self.sizes[1:L]
        offs = [0]
        for m in n:
            offs.append(offs[-1] + m)
        H = torch.zeros(offs[-1], offs[-1], dtype=self.dtype, device=self.device)
        for k in range(1, L):
            s = slice(offs[k - 1], offs[k])
            H[s, s] += self.term_weights[k] * torch.eye(n[k - 1], dtype=self.dtype, device=self.device)
            W = self.weights[k]
            if k < L - 1 or clamped:
                H[s, s] += self.term_weights[k + 1] * (W.t() @ W)
            if k < L - 1:
                s2 = slice(offs[k], offs[k + 1])
                H[s, s2] = -self.term_weights[k + 1] * W.t()
                H[s2, s] = -self.term_weights[k + 1] * W
        return H


@dataclass(eq=False)
class LiftedProblem(BatchProblem):
    """One batch of inference problems over the hidden layers of a :class:`LiftedEnergy`.

    Build with :meth:`LiftedEnergy.problem`. Rows may mix free, clamped and nudged outputs. The
    variables are the hidden layers ``z_1 … z_{L-1}`` (lists of ``(batch, n_k)`` tensors).
    """

    energy: LiftedEnergy
    x: torch.Tensor
    target: torch.Tensor | None = None
    clamped: torch.Tensor | None = None
    nudge: torch.Tensor | None = None
    beta: float = 1.0
    check: bool = True
    a1: torch.Tensor | None = None   # the first pre-activation, when stacked phases share it

    def __post_init__(self) -> None:
        e = self.energy
        x = self.x
        if x.dim() != 2 or x.shape[1] != e.sizes[0]:
            raise ValueError(f"Expected input of shape (batch, {e.sizes[0]}), got {tuple(x.shape)}")
        if self.check and not torch.isfinite(x).all():
            raise ValueError("Input contains NaN or inf values")
        B, n_out = x.shape[0], e.sizes[-1]
        if self.target is not None:
            t = self.target
            if t.dim() != 2 or t.shape[0] != B or t.shape[1] != n_out:
                raise ValueError(f"Target must have shape ({B}, {n_out}) (batch, outputs); got {tuple(t.shape)}")
            if self.check and not torch.isfinite(t).all():
                raise ValueError("Target contains NaN or inf values")
            self.target = t.to(x.dtype)
        if self.clamped is None:
            self.clamped = torch.full((B,), self.target is not None, dtype=torch.bool, device=x.device)
        else:
            self.clamped = torch.as_tensor(self.clamped, dtype=torch.bool, device=x.device).reshape(-1)
            if self.clamped.shape[0] != B:
                raise ValueError(f"clamped must have {B} entries, got {self.clamped.shape[0]}")
            if self.clamped.any() and self.target is None:
                raise ValueError("Clamped rows need a target")
        if self.nudge is not None:
            g = self.nudge
            if g.dim() != 2 or g.shape != (B, n_out):
                raise ValueError(f"Nudge must have shape ({B}, {n_out}); got {tuple(g.shape)}")
            if not (math.isfinite(self.beta) and torch.isfinite(g).all()):
                raise ValueError("Nudge contains NaN or inf values")
        self.n_clamped = int(self.clamped.sum())
        # r_L = z_L − a_L on rows whose output is free: the constant −βg/w_L (0 without nudge)
        wL = e.term_weights[e.depth]
        free_res = None
        if self.nudge is not None and self.beta != 0:
            free_res = (-self.beta / wL) * self.nudge.to(x.dtype)
            if self.n_clamped:
                free_res = free_res * (~self.clamped).to(x.dtype).unsqueeze(1)
        self.free_shift = free_res
        self.clamp_column = self.clamped.to(x.dtype).unsqueeze(1) if 0 < self.n_clamped < B else None
        if self.a1 is None:
            self.a1 = e.pre(1, x)

    def top_residual(self, a_top: torch.Tensor) -> torch.Tensor | None:
        """``r_L = z_L − a_L`` given the output pre-activation (``None`` means zero everywhere)."""
        if self.n_clamped == 0:
            return self.free_shift
        r = self.target - a_top
        if self.clamp_column is not None:
            r = r * self.clamp_column
        if self.free_shift is not None:
            r = r + self.free_shift
        return r

    #: the reference solver polishes with :meth:`LiftedEnergy.hessian`
    dense_hessian = True

    def feeds_only_output(self, k: int) -> bool:
        """Whether hidden layer ``k`` is the last one (it feeds only the output)."""
        return k == self.depth - 1

    def block_curvature(self, k: int, hidden: Sequence[torch.Tensor] | None = None) -> float:
        """``λ_max(W_kᵀW_k)`` (:func:`~inferlearn.engine.problems.layered_energy.gram_lambda_max`) for the block step
        sizes, remembered on the energy for the weight's current version."""
        W, cache = self.energy.weights[k], self.energy.curvature_cache
        key = (k, W.data_ptr(), W._version, tuple(W.shape), W.dtype)
        if key not in cache:
            cache[key] = gram_lambda_max(W)
        return cache[key]

    def block_sweeps(self, hidden: list[torch.Tensor], pre: list, steps: Sequence[float]):
        """``(sweep, result)`` of the block projected-gradient sweeps, each one
        :data:`~inferlearn.engine.solvers.lifted_sweep.LIFTED_SWEEP` (compiled where it is active: the step sizes as
        tensors, the step measured on every sweep); ``result()`` remembers the pre-activations of the point reached."""
        e, L = self.energy, self.depth
        t = list(steps)
        alpha = [t[k - 1] * e.feedback(k) for k in range(1, L)]
        bounds = tuple(plain_bounds(u, self.x) for u in e.units)
        Ws, bs = e.weights, e.biases
        Wts = [W.t() for W in Ws]
        top = ("dense", self.n_clamped == 0, self.target if self.n_clamped else None, self.clamp_column, self.free_shift)
        always = LIFTED_SWEEP.active(self.x.device)
        if always:
            t = torch.tensor(t, dtype=self.x.dtype, device=self.x.device)
            alpha = t * torch.tensor([e.feedback(k) for k in range(1, L)], dtype=t.dtype, device=t.device)
        state = {"h": hidden, "a": list(pre[1:])}

        def sweep(check: bool):
            h, a, move = LIFTED_SWEEP(state["h"], state["a"], Ws, Wts, bs, t, alpha, "lifted", bounds, top,
                                      check or always)
            state["h"], state["a"] = h, a
            return [move] if check else []

        def result() -> list[torch.Tensor]:
            self.remember_pre(state["h"], [None] + state["a"])
            return state["h"]

        return sweep, result

    def remember_pre(self, hidden: Sequence[torch.Tensor], pre: Sequence[torch.Tensor | None]) -> None:
        """Cache the pre-activations ``pre[k] = a_k`` (k = 1 … L) of the point ``hidden`` (a solver's result)."""
        self._pre_cache = (list(hidden), list(pre))

    def pre_of(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """``[None, a_1, …, a_L]`` at ``hidden``: from the cache if ``hidden`` is the remembered point."""
        cache = getattr(self, "_pre_cache", None)
        if cache is not None and len(cache[0]) == len(hidden) and all(a is b for a, b in zip(cache[0], hidden)):
            return cache[1]
        zs = [self.x, *hidden]
        return [None, self.a1] + [self.energy.pre(k, zs[k - 1]) for k in range(2, self.depth + 1)]

    def output(self, z_top_hidden: torch.Tensor, a: torch.Tensor | None = None) -> torch.Tensor:
        """The optimal / clamped output ``z_L`` given ``z_{L-1}`` (and optionally its ``a_L``)."""
        if a is None:
            a = self.energy.pre(self.depth, z_top_hidden)
        if self.n_clamped == 0:
            return a if self.free_shift is None else a + self.free_shift
        if self.clamp_column is None:
            return self.target   # exactly y, not a + (y − a)
        free = a if self.free_shift is None else a + self.free_shift
        return torch.where(self.clamped.unsqueeze(1), self.target, free)

    def with_nudge(self, nudge: torch.Tensor) -> "LiftedProblem":
        """The same problem (rows, ``β``, shared ``a_1``) with the nudge direction ``g`` replaced."""
        return dataclasses.replace(self, nudge=nudge, check=False)

    def full(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``[x, z_1, …, z_{L-1}, z_L]`` with the output eliminated or clamped."""
        top = hidden[-1] if hidden else self.x
        return [self.x, *hidden, self.output(top, self.pre_of(hidden)[self.depth])]

    def forward_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The forward pass (cached): hidden layers ``z_k = Π_{C_k}(a_k)`` and pre-activations.

        Returns:
            ``(hidden, pre)`` with ``pre[k] = a_k`` for ``k = 1 … L`` (``pre[0]`` is ``None``).
            Shared, read-only tensors; :meth:`forward_init` returns copies.
        """
        if getattr(self, "_fwd", None) is None:
            e = self.energy
            hidden, pre, z = [], [None, self.a1], self.x
            for k in range(1, self.depth):
                if k > 1:
                    pre.append(e.pre(k, z))
                z = e.units[k - 1].project(pre[k])
                hidden.append(z)
            pre.append(e.pre(self.depth, z))
            self._fwd = (hidden, pre)
        return self._fwd

    def forward_init(self) -> list[torch.Tensor]:
        """Copies of the forward pass ``z_k = Π_{C_k}(a_k)``: every solver's starting point."""
        return [z.clone() for z in self.forward_state()[0]]

    def value(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-sample energy at ``hidden`` (with the output eliminated/clamped and the nudge term)."""
        zs = self.full(hidden)
        v = self.energy.value(zs)
        if self.free_shift is not None:
            # the linear nudge β gᵀ z_L of free rows
            g = self.nudge.to(zs[-1].dtype)
            if self.n_clamped:
                g = g * (~self.clamped).to(g.dtype).unsqueeze(1)
            v = v + self.beta * (g * zs[-1]).sum(dim=1)
        return v

    def gradients(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``∂E/∂z_k = w_k (z_k − a_k) − w_{k+1} W_kᵀ (z_{k+1} − a_{k+1})`` for each hidden layer."""
        e = self.energy
        zs = self.full(hidden)
        grads = []
        for k in range(1, self.depth):
            a_k = self.a1 if k == 1 else e.pre(k, zs[k - 1])
            g = e.term_weights[k] * (zs[k] - a_k)
            r = zs[k + 1] - e.pre(k + 1, zs[k])
            grads.append(torch.addmm(g, r, e.weights[k], alpha=-e.term_weights[k + 1]))
        return grads

    def residuals(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-sample optimality residual ``max_k ‖z_k − Π_{C_k}(z_k − ∂E/∂z_k / w_k)‖_∞``.

        It is zero exactly at the minimiser (projected-gradient fixed point), measured in units of
        activations (the gradient of layer ``k`` is scaled by ``1/w_k = γ^{1-k}``).
        """
        out = torch.zeros(self.batch, dtype=self.x.dtype, device=self.x.device)
        for k, (z, g) in enumerate(zip(hidden, self.gradients(hidden)), start=1):
            v = self.energy.units[k - 1].normal_cone_violation(z, g / self.energy.term_weights[k])
            out = torch.maximum(out, v.abs().amax(dim=1))
        return out

    def check_feasible(self, hidden: Sequence[torch.Tensor]) -> None:
        """Raise ``ValueError`` if a hidden layer has the wrong shape or violates its unit set."""
        sizes = self.energy.sizes
        if len(hidden) != self.depth - 1:
            raise ValueError(f"Expected {self.depth - 1} hidden layers, got {len(hidden)}")
        for k, z in enumerate(hidden, start=1):
            if z.shape != (self.batch, sizes[k]):
                raise ValueError(f"Hidden layer {k} must have shape ({self.batch}, {sizes[k]}), got {tuple(z.shape)}")
            u = self.energy.units[k - 1]
            if (z < u.lower).any() or (z > u.upper).any():
                raise ValueError(f"Hidden layer {k} leaves its unit set {u.name}")

    def to(self, dtype: torch.dtype) -> "LiftedProblem":
        """The same problem in another dtype (e.g. float64 for the reference solver)."""
        return LiftedProblem(self.energy.to(dtype), self.x.to(dtype),
                             None if self.target is None else self.target.to(dtype), self.clamped,
                             None if self.nudge is None else self.nudge.to(dtype), self.beta)


def contrastive_problem(energy: LiftedEnergy, x: torch.Tensor, target: torch.Tensor, check: bool = True) -> LiftedProblem:
    """Free and clamped phases of a batch stacked into one problem: rows ``[free; clamped]``.

    Solving both phases together halves the number of (small, overhead-bound) tensor operations;
    the first pre-activation ``W_0 x + b_0`` (the largest product) is computed once for both.
    """
    B = x.shape[0]
    if target.dim() != 2 or target.shape[0] != B:
        raise ValueError(f"Target must have shape ({B}, {energy.sizes[-1]}); got {tuple(target.shape)}")
    if x.dim() != 2 or x.shape[1] != energy.sizes[0]:
        raise ValueError(f"Expected input of shape (batch, {energy.sizes[0]}), got {tuple(x.shape)}")
    clamped = torch.arange(2 * B, device=x.device) >= B
    a1 = energy.pre(1, x)
    return LiftedProblem(energy, torch.cat([x, x]), torch.cat([target, target]), clamped, check=check,
                         a1=torch.cat([a1, a1]))


def contrastive_grads(energy: LiftedEnergy, zs: Sequence[torch.Tensor], scale: float,
                      pre: Sequence[torch.Tensor | None] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``scale · Σ_i [∇_W E(ẑ^{(i)}) − ∇_W E(ž^{(i)})]`` for the stacked layers of :func:`contrastive_problem`
    (or of any two stacked copies of one batch: EqProp's two nudged phases).

    Equal to :meth:`LiftedEnergy.weight_grads` with coefficients ``−scale`` (free rows, first half)
    and ``+scale`` (clamped rows), but the first layer uses ``(a_1 − ẑ_1) − (a_1 − ž_1) = ž_1 − ẑ_1``
    exactly: no cancellation of the (large) pre-activations, and one product with ``x``, the
    largest, over ``B`` rows instead of ``2B``.

    Args:
        zs: ``[x, z_1, …, z_L]`` with ``2B`` rows, free rows first.
        pre: optional ``[None, a_1, …, a_L]`` at ``zs`` (e.g. :meth:`LiftedProblem.pre_of`), saving products.
    """
    B = zs[0].shape[0] // 2
    x = zs[0][:B]
    d = (zs[1][:B] - zs[1][B:]) * (scale * energy.term_weights[1])
    out = [(d.t() @ x, d.sum(dim=0))]
    sign = torch.ones(2 * B, 1, dtype=x.dtype, device=x.device)
    sign[:B] = -1.0
    for k in range(1, energy.depth):
        a = energy.pre(k + 1, zs[k]) if pre is None else pre[k + 1]
        r = (a - zs[k + 1]) * (sign * (scale * energy.term_weights[k + 1]))
        out.append((r.t() @ zs[k], r.sum(dim=0)))
    return out
