"""Layered energies on any chain (conv nets included): one energy abstraction from per-layer terms.

For a :class:`~inferlearn.engine.chain.Chain` ``x → A_1 → C_1 → … → A_L`` with pre-activations
``a_k = A_k(z_{k-1})`` and term weights ``w_k``, the energy is ``E(z) = Σ_k w_k T_k(z_k, a_k)`` with one of
three per-layer terms (:data:`KINDS`)::

    lifted    T_k = ½‖z_k − a_k‖²,                        z_k ∈ C_k       (lifted / contrastive / EqProp)
    penalty   T_k = ½‖z_k − f_k(a_k)‖²,                   z_k free        (predictive coding)
    fenchel   T_k = ½‖z_k − a_k‖² − ½‖Π_{C_k}(a_k) − a_k‖², z_k ∈ C_k       (Fenchel–Young gap, lifted Fenchel)

(the ``fenchel`` term is ``G(z_k) + G*(a_k) − z_kᵀa_k ≥ 0`` for the box unit's potential ``G``, zero
exactly at ``z_k = Π(a_k)``). The output ``z_L`` of a row is *clamped* (``z_L := y``), *free* (a
variable; for the lifted term it is eliminated, ``z_L = a_L``) or *nudged* (free plus ``β gᵀz_L``, so
``z_L = a_L − βg/w_L``), as in the dense :class:`~inferlearn.engine.dense.LiftedProblem`.

What the engine needs from each layer map is its forward and, for the lifted and Fenchel terms
whose maps are affine, the adjoint ``A_kᵀ`` of its linear part: autograd's vector–Jacobian product
(exact for affine maps, at any point), with an analytic fast path ``rW`` for ``nn.Linear``. The
block gradient of hidden layer ``k`` is::

    ∂E/∂z_k = w_k (z_k − a_k) − w_{k+1} A_{k+1}ᵀ r_{k+1},   r_{k+1} = z_{k+1} − a_{k+1}  (lifted)
                                                          r_{k+1} = z_{k+1} − Π(a_{k+1}) (fenchel)

The ``penalty`` term (any differentiable map and activation) is differentiated by autograd as a
whole. Weight gradients come from the energy at the minimiser (envelope theorem): the terms are
re-evaluated at the fixed ``z*`` with the parameters in the graph and back-propagated
(:meth:`LayeredProblem.accumulate_weight_grads`), so conv layers need no gradient code of their own.

References:
    Zach & Estellers (2019), Eqs. 2, 7 and 9; Zach, "Bilevel programs meet deep learning", Table 1;
    Whittington & Bogacz (2017) (predictive coding); Gu et al. (2020) (Fenchel lifted networks).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..tensors import accumulate_grad
from .chain import Chain, Link, is_affine
from .compiled import CompiledStep

KINDS = ("lifted", "penalty", "fenchel")
#: output terms of the penalty energy: squared error ``½‖z_L − f_L(a_L)‖²`` or cross-entropy ``CE(z_L, softmax(f_L(a_L)))``
OUTPUTS = ("se", "ce")


class LayeredEnergy:
    """``E(z) = Σ_k w_k T_k(z_k, A_k(z_{k-1}))`` over a chain, with the term ``kind``.

    Args:
        chain: the model's chain.
        kind: ``"lifted"``, ``"penalty"`` or ``"fenchel"``.
        term_weights: ``[w_1, …, w_L]`` (positive).
        output: the output term of the ``penalty`` kind (:data:`OUTPUTS`): ``"se"``, the squared error
            ``½‖z_L − f_L(a_L)‖²``, or ``"ce"``, the cross-entropy ``−Σ_j z_{L,j} log softmax(f_L(a_L))_j`` of the
            clamped target ``z_L`` (PCX's classification energy), whose error sent down is ``z_L − softmax(a_L)``.
    """

    def __init__(self, chain: Chain, kind: str, term_weights: Sequence[float], output: str = "se"):
        if kind not in KINDS:
            raise ValueError(f"Unknown energy kind {kind!r}; choose one of {list(KINDS)}")
        if output not in OUTPUTS or (output != "se" and kind != "penalty"):
            raise ValueError(f"Invalid output: {output!r} (choose one of {list(OUTPUTS)}; 'ce' needs the penalty kind)")
        self.output = output
        if len(term_weights) != chain.depth or not all(math.isfinite(w) and w > 0 for w in term_weights):
            raise ValueError(f"Need {chain.depth} positive term weights, got {list(term_weights)}")
        self.chain, self.kind = chain, kind
        self.term_weights = [0.0] + [float(w) for w in term_weights]   # index k = 1 … L

    @classmethod
    def lifted(cls, chain: Chain, gamma: float, kind: str = "lifted") -> "LayeredEnergy":
        """Term weights ``w_k = γ^{ℓ_k − 1}`` (the lifted paper's feedback weight ``γ``), ``ℓ_k`` the longest path
        from the input to node ``k`` (:attr:`Chain.levels`; ``ℓ_k = k`` on a chain), so that every edge
        ``j → k`` has a feedback ratio ``w_k / w_j ≤ γ``."""
        return cls(chain, kind, [gamma ** (chain.levels[k] - 1) for k in range(1, chain.depth + 1)])

    @property
    def depth(self) -> int:
        return self.chain.depth

    def link(self, k: int) -> Link:
        return self.chain.links[k - 1]

    def feedback(self, k: int, child: int | None = None) -> float:
        """``ρ = w_c / w_k`` for the edge from node ``k`` to node ``c = child`` (default ``k + 1``: a chain's ``ρ_k``)."""
        return self.term_weights[k + 1 if child is None else child] / self.term_weights[k]

    def pre(self, k: int, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``a_k = Σ_{e into k} A_e(z_{source(e)})`` from the values ``zs = [x, z_1, …]`` (at least up to ``k − 1``)."""
        return self.chain.links[k - 1].pre(zs)

    def out_edges(self, k: int):
        """The ``(child, edge)`` pairs reading node ``k``."""
        return self.chain.children[k]

    def term(self, k: int, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Per-row ``T_k(z_k, a_k)`` (unweighted)."""
        link = self.link(k)
        if self.output == "ce" and k == self.depth:
            return -(z * torch.log_softmax(link.act(a).flatten(1), dim=1)).sum(1)
        if self.kind == "penalty":
            d = z - link.act(a)
        else:
            d = z - a
        v = 0.5 * d.pow(2).flatten(1).sum(1)
        if self.kind == "fenchel" and k < self.depth:
            v = v - 0.5 * (link.units.project(a) - a).pow(2).flatten(1).sum(1)
        return v

    def error(self, k: int, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """``r_k = −∂T_k/∂a_k``, the error sent down through ``A_kᵀ`` (box units or a linear output)::

            lifted  z − a      fenchel  z − Π(a)      penalty  (z − f(a)) ⊙ f'(a)

        (the linear output's ``z − a``, or ``z − softmax(a) Σ_j z_j`` with the cross-entropy output term: ``z − softmax(a)``
        for a target that sums to 1, such as a one-hot label; PCX's interpolated targets need not).
        """
        if k == self.depth:
            return cross_entropy_gradient(a, z).neg_() if self.output == "ce" else z - a
        units = self.link(k).units
        if self.kind == "lifted":
            return z - a
        if self.kind == "fenchel":
            return z - units.project(a)
        eps = z - units.project(a)
        return eps if units.is_linear else eps.masked_fill(units.engaged(a), 0.0)

    def project(self, k: int, z: torch.Tensor) -> torch.Tensor:
        """``Π_{C_k}`` for hidden layer ``k`` (the identity for the unconstrained penalty variables)."""
        if self.kind == "penalty":
            return z
        return self.link(k).units.project(z)


def cross_entropy_gradient(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``∂/∂p (−Σ_j t_j log softmax(p)_j) = softmax(p) Σ_j t_j − t`` per row (a new tensor)."""
    return torch.softmax(logits, dim=1).mul_(target.sum(1, keepdim=True)).sub_(target)


class _Adjoint:
    """``v ↦ Aᵀ v`` for the linear part of an affine edge map (a :class:`~inferlearn.engine.chain.Edge`, or a
    chain's one-edge link), at a fixed batch shape.

    ``nn.Linear`` uses ``v W``, the identity (a skip connection) ``v``; any other map autograd's
    vector–Jacobian product on a graph built once (at zero input) and reused (``retain_graph``), which
    for an affine map is the adjoint.
    """

    def __init__(self, edge, z_shape: torch.Size, dtype: torch.dtype, device: torch.device):
        self.linear = edge.linear if not any(isinstance(m, torch.nn.Flatten) for m in edge.maps) else None
        self.identity = not edge.maps
        self.edge, self.z_shape = edge, z_shape
        if self.linear is None and not self.identity:
            with torch.enable_grad():
                self._p = torch.zeros(z_shape, dtype=dtype, device=device, requires_grad=True)
                self._out = edge.map(self._p)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.linear is not None:
            return v.mm(self.linear.weight.detach())
        if self.identity:
            return v
        return torch.autograd.grad(self._out, self._p, v, retain_graph=True)[0]

    def add_to(self, base: torch.Tensor, v: torch.Tensor, alpha: float) -> torch.Tensor:
        """``base + α Aᵀv`` (one ``addmm`` for ``nn.Linear``)."""
        if self.linear is not None:
            return torch.addmm(base, v, self.linear.weight.detach(), alpha=alpha)
        return base.add(self(v), alpha=alpha)

    def add_to_(self, base: torch.Tensor, v: torch.Tensor, alpha: float) -> torch.Tensor:
        """``base += α Aᵀv`` in place."""
        if self.linear is not None:
            return base.addmm_(v, self.linear.weight.detach(), alpha=alpha)
        return base.add_(self(v), alpha=alpha)


def gram_norm_bound(W: torch.Tensor, squarings: int = 4) -> float:
    """An upper bound ``U`` of ``λ_max(WᵀW) = ‖W‖₂²`` from repeated squaring of the smaller Gram matrix ``G``::

        λ_max = ‖G^m‖₂^{1/m} ≤ ‖G^m‖_F^{1/m} = U ≤ n^{1/(2m)} λ_max,   m = 2^squarings (16)

    (``n`` the Gram matrix's size: ``U ≤ 1.14 λ_max`` for ``n = 64``; on the MNIST MLP at initialisation ``U`` is
    within 0.5 % of ``λ_max`` for the layers above the first, which the solver uses, and 1.8 % for the
    first, as the top eigenvalue dominates ``G^16``). ``G`` is divided by its trace first, so the
    powers stay in float64's range. Five small matrix products: about 40 % of the time of the symmetric eigen-solve
    it replaces, which cost more than back-propagation's whole step on the MLP. Returns ``inf`` for
    non-finite weights and 0 for zero weights. A pure function of ``W``.
    """
    W = W.detach().to(torch.float64)
    G = W.t() @ W if W.shape[0] >= W.shape[1] else W @ W.t()
    tr = G.trace()            # ≥ λ_max
    P = G / tr
    for _ in range(squarings):
        P = P @ P
    u = float(tr * P.norm() ** (0.5 ** squarings))
    if math.isfinite(u):
        return u
    t = float(tr)
    return 0.0 if t == 0.0 else math.inf


def operator_norm_sq(link, z_shape: Sequence[int], dtype: torch.dtype, device: torch.device,
                     iters: int = 30) -> float:
    """``λ_max(AᵀA) = ‖A‖₂²`` of the linear part of an affine map (an edge, or a chain's one-edge link) on
    inputs of shape ``z_shape`` (one row).

    ``nn.Linear``: :func:`gram_norm_bound` (an upper bound within a few per cent); the identity: 1. Other maps: ``iters``
    power iterations ``v ← Aᵀ(A v − A 0)`` through the map's forward and autograd's adjoint, from a fixed
    start (deterministic; a lower bound that approaches ``λ_max``; callers add a safety factor).
    """
    with torch.no_grad():
        lin = link.linear
        if lin is not None:
            return gram_norm_bound(lin.weight)
        if not link.maps:
            return 1.0
        shape = (1, *z_shape)
        adj = _Adjoint(link, torch.Size(shape), dtype, device)
        a0 = adj._out.detach()
        v = torch.ones(shape, dtype=dtype, device=device)
        v.view(-1)[1::2] = -0.5
        v = v / v.norm()
        lam = 0.0
        for _ in range(iters):
            w = adj(link.map(v) - a0)
            lam = float((v * w).sum())
            n = w.norm()
            if not bool(torch.isfinite(n)) or float(n) == 0.0:
                break
            v = w / n
        return lam


class BatchProblem:
    """What every inference problem answers: its batch size (rows) and depth ``L`` (a mixin)."""

    x: torch.Tensor

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def depth(self) -> int:
        return self.energy.depth


class LayeredProblem(BatchProblem):
    """One batch of inference problems ``min_z E`` on a :class:`LayeredEnergy` (rows may mix output modes).

    Args:
        energy: the layered energy.
        x: inputs (rows = samples, any shape the first map takes).
        target: output values of clamped rows (shape of the model's output).
        clamped: ``(rows,)`` bool mask of clamped rows (default: all rows when ``target`` is given).
        nudge: ``g``, the direction of the linear nudge ``β gᵀz_L`` on free rows (lifted term only).
        beta: the nudge strength (any sign).
        a1: the first pre-activation ``A_1(x)`` if already computed (stacked phases share it).
    """

    def __init__(self, energy: LayeredEnergy, x: torch.Tensor, target: torch.Tensor | None = None,
                 clamped: torch.Tensor | None = None, nudge: torch.Tensor | None = None, beta: float = 0.0,
                 a1: torch.Tensor | None = None):
        self.energy, self.x, self.target = energy, x, target
        B = x.shape[0]
        if clamped is None:
            clamped = torch.full((B,), target is not None, dtype=torch.bool, device=x.device)
        self.clamped = clamped
        self.n_clamped = int(clamped.sum())
        if self.n_clamped and target is None:
            raise ValueError("Clamped rows need a target")
        with torch.no_grad():
            self.a1 = energy.pre(1, [x]) if a1 is None else a1
        self._free_res = None
        if nudge is not None and beta != 0:
            r = (-beta / energy.term_weights[energy.depth]) * nudge
            if self.n_clamped:
                r = r * self._row_mask(~clamped, r)
            self._free_res = r
        self.nudge, self.beta = nudge, beta
        self._fwd = self._p1 = None

    @staticmethod
    def _row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return mask.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))

    def output(self, a_top: torch.Tensor) -> torch.Tensor:
        """``z_L`` given ``a_L``: the target on clamped rows, ``a_L`` (plus the nudge shift) on free rows."""
        free = a_top if self._free_res is None else a_top + self._free_res
        if self.n_clamped == 0:
            return free
        if self.n_clamped == self.batch:
            return self.target
        return torch.where(self._row_mask(self.clamped, a_top).bool(), self.target, free)

    @torch.no_grad()
    def forward_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``(hidden, pre)`` of the forward pass: ``z_k = f_k(a_k)``, ``pre[k] = a_k`` (``pre[0]`` is ``None``)."""
        if self._fwd is None:
            e, zs, pre = self.energy, [self.x], [None, self.a1]
            for k in range(1, self.depth):
                if k > 1:
                    pre.append(e.pre(k, zs))
                zs.append(e.link(k).act(pre[k]))
            pre.append(e.pre(self.depth, zs))
            self._fwd = (zs[1:], pre)
        return self._fwd

    def pre_of(self, hidden: Sequence[torch.Tensor], fresh_a1: bool = False) -> list[torch.Tensor | None]:
        """``[None, a_1, …, a_L]`` at ``hidden`` (``fresh_a1``: recompute ``a_1 = A_1(x)``, e.g. to
        differentiate with respect to the first layer's parameters, instead of the cached one)."""
        zs = [self.x, *hidden]
        links = self.energy.chain.links
        a1 = links[0].pre(zs) if fresh_a1 else self.a1
        return [None, a1] + [links[k - 1].pre(zs) for k in range(2, self.depth + 1)]

    def full(self, hidden: Sequence[torch.Tensor], pre: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
        """``[x, z_1, …, z_{L-1}, z_L]`` with the output clamped or eliminated."""
        if pre is None:
            a_top = self.energy.pre(self.depth, [self.x, *hidden])
        else:
            a_top = pre[self.depth]
        return [self.x, *hidden, self.output(a_top)]

    def value(self, hidden: Sequence[torch.Tensor], fresh_a1: bool | None = None) -> torch.Tensor:
        """Per-row energy (with the output clamped or eliminated, and the nudge term on free rows).

        Differentiable in ``hidden`` and, when grad mode is on (``fresh_a1`` defaults to it), in
        every parameter of the chain.
        """
        e = self.energy
        pre = self.pre_of(hidden, torch.is_grad_enabled() if fresh_a1 is None else fresh_a1)
        zs = self.full(hidden, pre)
        terms = [e.term(k, zs[k], pre[k]) for k in range(1, self.depth + 1)]
        capture = getattr(self, "_capture_terms", None)
        if capture is not None:   # gradient_step asked for the hidden terms' sums (the prediction errors' norms)
            capture.extend(t.detach().sum() for t in terms[:-1])
        v = sum(w * t for w, t in zip(e.term_weights[1:], terms))
        if self._free_res is not None:
            g = self.nudge * (1.0 if self.n_clamped == 0 else self._row_mask(~self.clamped, self.nudge))
            v = v + self.beta * (g * zs[-1]).flatten(1).sum(1)
        return v

    def adjoints(self, hidden: Sequence[torch.Tensor]) -> list[tuple[tuple[int, _Adjoint], ...] | None]:
        """``outs[k]``: the ``(child c, A_eᵀ)`` pairs of the edges ``e`` reading hidden node ``k`` (``k = 1 … L−1``;
        on a chain the one pair ``(k + 1, A_{k+1}ᵀ)``), for the batch's hidden shapes."""
        return [None] + [tuple((c, _Adjoint(edge, z.shape, z.dtype, z.device)) for c, edge in self.energy.out_edges(k))
                         for k, z in enumerate(hidden, start=1)]

    def down(self, k: int, hidden: Sequence[torch.Tensor], pre: Sequence[torch.Tensor], c: int) -> torch.Tensor:
        """The residual ``r_c`` that child ``c`` sends down its edges (the output's ``z_L − a_L`` for ``c = L``)."""
        if c == self.depth:
            return self.top_residual(pre[c])
        return self.energy.error(c, hidden[c - 1], pre[c])

    def top_residual(self, a_top: torch.Tensor) -> torch.Tensor:
        """``r_L = z_L − a_L``."""
        return self.output(a_top) - a_top

    def block_step(self, k: int, hidden: Sequence[torch.Tensor], pre: Sequence[torch.Tensor],
                   outs: Sequence[tuple[int, _Adjoint]], t: float, units=None) -> torch.Tensor:
        """One projected-gradient step on hidden node ``k`` (lifted and Fenchel terms), step ``t`` in units of
        ``∂E/∂z_k / w_k`` (a new tensor; ``outs``: the pairs :meth:`adjoints` gives for ``k``; ``units`` = the node's box, looked up
        when not given)::

            z_k ← Π_k( lerp(z_k, a_k, t) + t Σ_{e: k → c} ρ_{kc} A_eᵀ r_c )      (a chain: one child, c = k + 1)
        """
        e = self.energy
        new = hidden[k - 1].lerp(pre[k], t)
        if len(outs) == 1 and outs[0][0] == k + 1:   # a chain's block: inline (the hot path of every sweep)
            if k + 1 == self.depth:
                r = self.top_residual(pre[k + 1])
            else:
                r = e.error(k + 1, hidden[k], pre[k + 1])
            new = outs[0][1].add_to(new, r, t * e.term_weights[k + 1] / e.term_weights[k])
        else:
            for c, adjoint in outs:
                new = adjoint.add_to(new, self.down(k, hidden, pre, c), t * e.feedback(k, c))
        units = e.link(k).units if units is None else units
        lo, hi = units.clamp_bounds(new)
        return new if lo is None and hi is None else new.clamp_(min=lo, max=hi)   # a fresh tensor: in place

    def gradients(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``[∂E/∂z_1, …, ∂E/∂z_{L-1}]``.

        In closed form through the adjoints when every map is affine and every unit a box (for the
        penalty term ``∂E/∂z_k = w_k ε_k − w_{k+1} A_{k+1}ᵀ (ε_{k+1} ⊙ f'(a_{k+1}))``, ``ε_k = z_k − f(a_k)``);
        otherwise by autograd of the whole energy (any map, any activation).
        """
        if self._closed_form():
            return self._closed_form_gradients(hidden)
        if self._vjp_form():
            return self._penalty_gradients(hidden)
        with torch.enable_grad():
            hs = [h.detach().requires_grad_(True) for h in hidden]
            total = self.value(hs, fresh_a1=False).sum()
            return list(torch.autograd.grad(total, hs))

    def _vjp_form(self) -> bool:
        """Whether :meth:`_penalty_gradients` applies: the penalty energy with every row clamped, no nudge."""
        return self.energy.kind == "penalty" and self._free_res is None and self.n_clamped == self.batch

    def _first_prediction(self) -> torch.Tensor:
        """``f_1(a_1)``, which no value node changes (computed once per batch)."""
        if self._p1 is None:
            with torch.no_grad():
                self._p1 = self.energy.link(1).act(self.a1)
        return self._p1

    def _penalty_gradients(self, hidden: Sequence[torch.Tensor], errors: list | None = None) -> list[torch.Tensor]:
        """``∂E/∂z_k`` of the penalty energy for any maps (:func:`penalty_gradients`); ``errors`` (if given)
        receives ``‖ε_k‖`` of the hidden layers, as :meth:`gradient_step` documents."""
        if not hidden:
            return []
        e = self.energy
        grads, norms = penalty_gradients(e.chain.links, self.x, self._first_prediction(), self.target, list(hidden),
                                         tuple(e.term_weights), e.output, errors is not None)
        if errors is not None:
            errors.extend(norms)
        return grads

    def gradient_step(self, hidden: list[torch.Tensor], eta: float, errors: list | None = None) -> list[torch.Tensor]:
        """Simultaneous projected steps ``z_k ← Π_k(z_k − η ∂E/∂z_k)`` for every hidden layer.

        In closed form ``z_k − η w_k ε_k + η w_{k+1} A_{k+1}ᵀ r_{k+1}``, updating the tensors of ``hidden``
        in place (every term is computed from the old point before the first update); otherwise new
        tensors through :meth:`gradients`. Returns the updated list. With the penalty energy, a list passed as
        ``errors`` receives the norms ``‖ε_k‖`` of the prediction errors at the old point (0-d tensors, from what
        the step computes anyway: the closed form's ``ε_k``, or autograd's terms ``½‖ε_k‖²``; it stays empty
        where the step does not compute them).
        """
        e = self.energy
        want = errors is not None and e.kind == "penalty"
        if (hidden and len(hidden) == self.depth - 1 and LayeredProblem._vjp_form(self) and not e.chain.is_dense
                and PC_GRAPH_STEP.active(self.x.device)):
            # a graph's step (conv nets, residual networks) as one compiled call: see PC_GRAPH_STEP
            new, norms = PC_GRAPH_STEP(e.chain.prime().links, self.x, self._first_prediction(), self.target,
                                       list(hidden), float(eta), tuple(e.term_weights), e.output, want)
            if want:
                errors.extend(norms)
            return new
        if not self._closed_form() and self._vjp_form():
            grads = self._penalty_gradients(hidden, errors if want else None)
            return [z.sub(g, alpha=eta) for z, g in zip(hidden, grads)]   # the penalty variables are unconstrained
        if not self._closed_form():
            self._capture_terms = [] if want else None
            try:
                grads = self.gradients(hidden)
                if want and len(self._capture_terms) == len(hidden):
                    errors.extend((2.0 * t).clamp(min=0).sqrt() for t in self._capture_terms)
            finally:
                self._capture_terms = None
            return [e.project(k, z - eta * g) for k, (z, g) in enumerate(zip(hidden, grads), start=1)]
        parts = list(self._closed_form_parts(hidden))
        if want:
            errors.extend(torch._foreach_norm([own for _, _, own, _ in parts]))
        for k, z, own, downs in parts:
            z.add_(own, alpha=-eta * e.term_weights[k])
            for c, down, adj in downs:
                adj.add_to_(z, down, eta * e.term_weights[c])
            if e.kind != "penalty":
                lo, hi = e.link(k).units.clamp_bounds(z)
                if lo is not None or hi is not None:
                    z.clamp_(min=lo, max=hi)
        return hidden

    def _closed_form(self) -> bool:
        if getattr(self, "_affine", None) is None:
            chain = self.energy.chain
            self._affine = all(is_affine(m) for l in chain.links for m in l.maps) and all(
                l.units is not None for l in chain.links[:-1]) and chain.linear_output
        return self._affine

    def _closed_form_parts(self, hidden: Sequence[torch.Tensor]):
        """``(k, z_k, own_k, [(c, r_c, A_eᵀ), …])`` per hidden node: ``∂E/∂z_k = w_k own_k − Σ_{e: k→c} w_c A_eᵀ r_c``.

        Each node's pre-activation, projection and derivative mask are computed once per call.
        """
        e, L = self.energy, self.depth
        if getattr(self, "_adj", None) is None:
            self._adj = self.adjoints(hidden)
        pre = self.pre_of(hidden)
        zs = [self.x, *hidden, self.output(pre[L])]
        links = e.chain.links
        if e.kind != "penalty":
            errs = [None] + [e.error(c, zs[c], pre[c]) if links[c - 1].reads_hidden else None for c in range(1, L + 1)]
            for k in range(1, L):
                yield k, zs[k], zs[k] - pre[k], [(c, errs[c], adj) for c, adj in self._adj[k]]
            return
        # penalty: ε_k = z_k − f(a_k) is both layer k's own term and, masked by f'(a_k), the error sent down
        eps, down = [None] * (L + 1), [None] * (L + 1)
        for k in range(1, L):
            units = links[k - 1].units
            f = units.project(pre[k])
            eps[k] = zs[k] - f
            # f'(a) of a box unit is 1 exactly where the clamp leaves a unchanged (autograd's convention)
            if links[k - 1].reads_hidden:   # an error that only reads the input is never sent down
                down[k] = eps[k] if units.is_linear else eps[k] * (f == pre[k])
        eps[L] = down[L] = e.error(L, zs[L], pre[L])
        for k in range(1, L):
            yield k, zs[k], eps[k], [(c, down[c], adj) for c, adj in self._adj[k]]

    def _closed_form_gradients(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        w = self.energy.term_weights
        out = []
        for k, _, own, downs in self._closed_form_parts(hidden):
            g = w[k] * own
            for c, down, adj in downs:
                g = g - w[c] * adj(down)
            out.append(g)
        return out

    def layer_errors(self, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``ε_k = z_k − f_k(a_k)`` of the hidden nodes (the penalty energy's prediction errors; one forward pass)."""
        pre = self.pre_of(hidden)
        return [z - self.energy.link(k).act(pre[k]) for k, z in enumerate(hidden, start=1)]

    def residuals(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-row optimality residual ``max_k ‖z_k − Π_k(z_k − ∂E/∂z_k / w_k)‖_∞`` (0 at the minimiser)."""
        out = torch.zeros(self.batch, dtype=self.x.dtype, device=self.x.device)
        for k, (z, g) in enumerate(zip(hidden, self.gradients(hidden)), start=1):
            v = z - self.energy.project(k, z - g / self.energy.term_weights[k])
            out = torch.maximum(out, v.abs().flatten(1).amax(dim=1))
        return out

    def with_nudge(self, nudge: torch.Tensor) -> "LayeredProblem":
        """The same problem (rows, targets, ``β``, shared ``a_1``) with the nudge direction ``g`` replaced."""
        return LayeredProblem(self.energy, self.x, self.target, self.clamped, nudge, self.beta, self.a1)

    def stacked(self, copies: int, init: Sequence[torch.Tensor] | None = None, **kwargs) -> "LayeredProblem":
        """``copies`` stacked copies of this batch as one problem (phases solved together), sharing
        ``A_1(x)`` and the forward pass (or the point ``init``, e.g. the free equilibrium, as the start).

        ``kwargs`` (``target``, ``clamped``, ``nudge``, ``beta``) describe the stacked rows.
        """
        x, a1 = (self.x, self.a1) if copies == 1 else (torch.cat([self.x] * copies), torch.cat([self.a1] * copies))
        p = LayeredProblem(self.energy, x, a1=a1, **kwargs)
        hidden, pre = self.forward_state() if init is None else (list(init), self.pre_of(init))
        stack = (lambda t: t) if copies == 1 else (lambda t: torch.cat([t] * copies))   # the solvers copy what they change
        p._fwd = ([stack(h) for h in hidden], [None] + [stack(a) for a in pre[1:]])
        return p

    def check_feasible(self, hidden: Sequence[torch.Tensor]) -> None:
        """Raise ``ValueError`` if ``hidden`` has the wrong number of layers or shapes, or leaves a unit set."""
        fwd = self.forward_state()[0]
        if len(hidden) != len(fwd):
            raise ValueError(f"Expected {len(fwd)} hidden layers, got {len(hidden)}")
        for k, (z, f) in enumerate(zip(hidden, fwd), start=1):
            if z.shape != f.shape:
                raise ValueError(f"Hidden layer {k} must have shape {tuple(f.shape)}, got {tuple(z.shape)}")
            if self.energy.kind != "penalty" and not torch.equal(self.energy.project(k, z), z):
                raise ValueError(f"Hidden layer {k} leaves its unit set {self.energy.link(k).units.name}")

    def accumulate_weight_grads(self, hidden: Sequence[torch.Tensor], coef: torch.Tensor | float,
                                layer_scale: Sequence[float] | None = None, precise: bool = True) -> None:
        """Add ``Σ_rows coef_i Σ_k s_k w_k ∇_θ T_k(z*_k, A_k(z*_{k-1}))`` to the parameters' ``.grad``.

        The envelope theorem: at a minimiser ``z*`` (held fixed, including an eliminated output) the
        gradient of ``min_z E`` with respect to the parameters is the partial gradient of ``E``.

        Args:
            hidden: the hidden layers at the minimiser.
            coef: per-row coefficients ``(rows,)`` or a scalar.
            layer_scale: optional ``s_k`` per layer (``k = 1 … L``), e.g. ``1/w_k``; default 1.
            precise: evaluate the terms of non-``Linear`` maps in float64 when the model is in a lower precision
                (needed where rows of opposite sign cancel: two-phase contrastive differences); one-phase rules
                (predictive coding, MAC, LPOM, J0) pass ``False`` and keep the model's dtype, which on a conv net
                saves most of the weight-gradient time.
        """
        e = self.energy
        with torch.no_grad():
            zs = [z.detach() for z in self.full(hidden)]
        closed = self._closed_form()
        preds, cotangents = [], []   # the penalty terms' backward by hand: ∂T_k/∂p_k of p_k = f_k(a_k), one VJP
        with torch.enable_grad():
            total = 0.0
            for k in range(1, self.depth + 1):
                link = e.link(k)
                if not any(p.requires_grad for p in link.parameters()):
                    continue
                s = e.term_weights[k] * (1.0 if layer_scale is None else layer_scale[k - 1])
                lin = link.linear
                if closed and lin is not None and len(link.maps) == 1 and zs[k - 1].dim() == 2 and link.sources == (k - 1,):
                    with torch.no_grad():   # ∇_W (s T_k) = −s r_k z_{k-1}ᵀ for a Linear map: no graph
                        a = link.map(zs[k - 1])
                        r = e.error(k, zs[k], a) * (-s)
                        r = r * coef.reshape(-1, 1) if torch.is_tensor(coef) else r * coef
                        accumulate_grad(lin.weight, r.t().mm(zs[k - 1]), owned=True)
                        if lin.bias is not None:
                            accumulate_grad(lin.bias, r.sum(0), owned=True)
                    continue
                if e.kind == "penalty" and (zs[k].dtype == torch.float64 or not precise):
                    p = link.act(link.pre(zs))
                    d = (cross_entropy_gradient(p.detach(), zs[k]) if e.output == "ce" and k == self.depth
                         else p.detach() - zs[k])
                    c = coef.reshape(-1, *([1] * (d.dim() - 1))) if torch.is_tensor(coef) else coef
                    preds.append(p)
                    cotangents.append(d.mul_(c).mul_(s))
                    continue
                if zs[k].dtype == torch.float64 or not precise:
                    a = link.pre(zs)
                    t = e.term(k, zs[k], a)
                    total = total + s * ((t * coef).sum() if torch.is_tensor(coef) else coef * t.sum())
                    continue
                # Lower precision: evaluate the term in float64 on float64 copies of the parameters.
                # Contrastive estimates subtract two nearly equal gradients summed over every pixel
                # of a conv layer; in float32 that difference drowns in rounding (measured: conv-layer
                # cosine with back-propagation ≈ 0 in float32, 0.998 in float64: benchmarks/results/
                # conv_rules_at_0ba1548 and conv_alignment.md).
                a, leaves = _pre_float64(link, zs)
                t = e.term(k, zs[k].double(), a)
                c = coef.double() if torch.is_tensor(coef) else coef
                part = s * ((t * c).sum() if torch.is_tensor(c) else c * t.sum())
                params = [p for p, _ in leaves]
                for p, g in zip(params, torch.autograd.grad(part, [q for _, q in leaves])):
                    accumulate_grad(p, g, owned=True)
            if torch.is_tensor(total) and total.requires_grad:
                total.backward()
            kept = [(p, d) for p, d in zip(preds, cotangents) if p.requires_grad]
            if kept:
                torch.autograd.backward([p for p, _ in kept], [d for _, d in kept])


def penalty_gradients(links: Sequence[Link], x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor,
                      hidden: list[torch.Tensor], weights: tuple[float, ...], output: str, errors: bool
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``∂E/∂z_k`` of the penalty energy with a clamped output, for any maps (conv, pooling, a graph's sums), by
    one vector–Jacobian product through the predictions instead of autograd of the energy's value::

        ∂E/∂z_k = w_k ε_k + Σ_{c reads k} J_{p_c}(z_k)ᵀ g_c,   ε_k = z_k − p_k,  p_c = f_c(a_c(z)),
        g_c = −w_c ε_c (hidden c),  g_L = w_L ∂T_L/∂p_L at the clamped target ``t``: ``p_L − t`` (squared error)
        or ``softmax(p_L) Σ_j t_j − t`` (``output="ce"``)

    The same gradient as autograd of the energy's value (the squared terms' backward is done by hand:
    ``∂½‖z − p‖²/∂p = −ε``), without building and differentiating the terms, and in the value nodes' own memory
    layout. A pure function of tensors and constants (``links``: the graph's nodes, ``p1 = f_1(a_1)``, which no
    value node changes; ``weights``: ``w_0 … w_L``), so that :data:`PC_GRAPH_STEP` can compile it. Returns the
    gradients and, with ``errors``, the norms ``‖ε_k‖`` (0-d tensors; else an empty list)."""
    L = len(links)
    with torch.enable_grad():
        hs = [h.detach().requires_grad_(True) for h in hidden]
        zs = [x, *hs]
        preds = [links[k - 1].act(links[k - 1].pre(zs)) for k in range(2, L + 1)]
    own = [hidden[0] - p1] + [z - p.detach() for z, p in zip(hidden[1:], preds)]
    norms = list(torch._foreach_norm(own)) if errors and len(hidden) == L - 1 else []
    sent = [own[c - 1].mul(-weights[c]) for c in range(2, len(hidden) + 1)]
    if len(hidden) == L - 1:
        p_top = preds[-1].detach()
        d_top = cross_entropy_gradient(p_top, target) if output == "ce" else p_top - target
        sent.append(d_top.mul_(weights[L]))
    back = torch.autograd.grad(preds, hs, sent, allow_unused=True)
    grads = [d.mul(weights[k]) if b is None else b.add_(d, alpha=weights[k])
             for k, (d, b) in enumerate(zip(own, back), start=1)]
    return grads, norms


def _penalty_step(links: Sequence[Link], x: torch.Tensor, p1: torch.Tensor, target: torch.Tensor,
                  hidden: list[torch.Tensor], eta: float, weights: tuple[float, ...], output: str, errors: bool
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One simultaneous step ``z_k ← z_k − η ∂E/∂z_k`` of the clamped penalty energy on any graph
    (:func:`penalty_gradients`; the penalty variables are unconstrained): the new value nodes and the norms."""
    grads, norms = penalty_gradients(links, x, p1, target, hidden, weights, output, errors)
    return [z.sub(g, alpha=eta) for z, g in zip(hidden, grads)], norms


#: ``auto`` compiles a graph's predictive-coding step on CPU for runs of at least this many mini-batches, and
#: keeps it where it measures faster than eager on the step's first calls: compiled, the step took 0.54 and 0.62
#: of eager's time on the conv net and ResNet-20 but 1.06 on VGG-5, for 16-23 s of compiling
#: (``benchmarks/bench_graph_compile.py``)
GRAPH_AUTO_CPU_MIN_BATCHES = 500
#: Predictive coding's value-node step on a graph (conv nets, residual networks, any model the engine reads) as one
#: compiled call: forward predictions, their vector–Jacobian product (traced into the graph) and the update.
#: Used by :meth:`LayeredProblem.gradient_step` for the clamped penalty energy of every model but dense chains (whose
#: closed-form and whole-batch paths are faster), when compilation is active for it.
PC_GRAPH_STEP = CompiledStep(_penalty_step, "the predictive-coding step of a graph",
                             auto_cpu_min_batches=GRAPH_AUTO_CPU_MIN_BATCHES, autograd=True, measure=True)


def _pre_float64(link: Link, zs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``a_k = Σ_e A_e(z_{source(e)})`` in float64 through float64 copies of the maps' parameters (and buffers).

    Returns the output and the ``(parameter, float64 leaf)`` pairs of the trainable parameters.
    """
    leaves, a = [], None
    for edge in link.edges:
        z = zs[edge.source].double()
        for m in edge.maps:
            state = {n: b.double() if b.is_floating_point() else b for n, b in m.named_buffers()}
            for n, p in m.named_parameters():
                q = p.detach().double().requires_grad_(p.requires_grad)
                state[n] = q
                if p.requires_grad:
                    leaves.append((p, q))
            z = torch.func.functional_call(m, state, (z,))
        a = z if a is None else a + z
    return a, leaves


class NudgedOutputProblem(LayeredProblem):
    """A penalty-energy problem whose output ``z_L`` is a free value node nudged by the loss (nudged predictive
    coding): the variables are ``[z_1, …, z_{L-1}, z_L]`` (the output last) and the per-row energy is::

        F_s(z) = Σ_{k≤L} w_k ½‖z_k − f_k(a_k)‖² + s β ℓ(z_L),   ℓ = ½‖z_L − y‖² ("se") or CE(y, softmax(z_L)) ("ce")

    with a sign ``s`` per row (``+1``, ``−1``, or 0 for the free phase), so stacked rows solve several nudged
    phases at once. Without the nudge the minimum is the forward pass (every term zero). Gradients of the value
    nodes come from autograd of :meth:`value` (no closed form), and the weight gradient of the energy
    (:meth:`~LayeredProblem.accumulate_weight_grads`) leaves the nudge out (it does not depend on the parameters).

    Args:
        energy: a ``penalty`` energy with the squared-error output term.
        x: inputs (rows).
        target: ``y`` per row.
        signs: ``s`` per row ``(rows,)``.
        beta: ``β > 0``.
        loss: ``"se"`` or ``"ce"``.
        a1: ``A_1(x)`` if already computed.
    """

    def __init__(self, energy: LayeredEnergy, x: torch.Tensor, target: torch.Tensor, signs: torch.Tensor,
                 beta: float, loss: str = "se", a1: torch.Tensor | None = None):
        if energy.kind != "penalty" or energy.output != "se" or loss not in OUTPUTS:
            raise ValueError("A nudged output needs the penalty energy with the squared-error output term, and a loss "
                             f"in {list(OUTPUTS)}")
        super().__init__(energy, x, a1=a1)
        self.nudge_target, self.signs, self.nudge_beta, self.loss = target, signs, float(beta), loss

    @torch.no_grad()
    def forward_state(self):
        """The forward pass with the output node at ``a_L``: ``([z_1, …, z_{L-1}, a_L], pre)``."""
        if self._fwd is None:
            hidden, pre = super().forward_state()
            self._fwd = ([*hidden, pre[self.depth]], pre)
        return self._fwd

    def full(self, hidden, pre=None):
        return [self.x, *hidden]

    def _closed_form(self) -> bool:
        return False

    def _vjp_form(self) -> bool:
        return True

    def _penalty_gradients(self, hidden, errors=None):
        """:meth:`LayeredProblem._penalty_gradients` with the free output node's own term and its nudge
        ``s β ∂ℓ/∂z_L`` (``z_L − y``, or ``softmax(z_L) Σ_j y_j − y``) added to the last gradient."""
        grads = super()._penalty_gradients(hidden, errors)
        z, y = hidden[-1], self.nudge_target
        d = z - y if self.loss == "se" else cross_entropy_gradient(z, y)
        s = (self.nudge_beta * self.signs.to(z.dtype)).reshape(-1, *([1] * (z.dim() - 1)))
        grads[-1].addcmul_(s, d)
        return grads

    def value(self, hidden, fresh_a1=None):
        """Per-row ``F_s`` (differentiable in the value nodes and, in grad mode, the parameters)."""
        e, z = self.energy, hidden[-1]
        pre = self.pre_of(hidden, torch.is_grad_enabled() if fresh_a1 is None else fresh_a1)
        zs = self.full(hidden)
        v = sum(e.term_weights[k] * e.term(k, zs[k], pre[k]) for k in range(1, self.depth + 1))
        y = self.nudge_target
        if self.loss == "se":
            ell = 0.5 * (z - y).pow(2).flatten(1).sum(1)
        else:
            ell = -(y * torch.log_softmax(z.flatten(1), dim=1)).sum(1)
        return v + (self.nudge_beta * self.signs.to(v.dtype)) * ell
