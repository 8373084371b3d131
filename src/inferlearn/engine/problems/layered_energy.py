"""Layered energies on any chain (conv nets included): one energy abstraction from per-layer terms.

For a :class:`~inferlearn.engine.graph.Graph` ``x → A_1 → C_1 → … → A_L`` with pre-activations
``a_k = A_k(z_{k-1})`` and term weights ``w_k``, the energy is ``E(z) = Σ_k w_k T_k(z_k, a_k)`` with one of
three per-layer terms (:data:`KINDS`)::

    lifted    T_k = ½‖z_k − a_k‖²,                        z_k ∈ C_k       (lifted / contrastive / EqProp)
    penalty   T_k = ½‖z_k − f_k(a_k)‖²,                   z_k free        (predictive coding)
    fenchel   T_k = ½‖z_k − a_k‖² − ½‖Π_{C_k}(a_k) − a_k‖², z_k ∈ C_k       (Fenchel–Young gap, lifted Fenchel)

(the ``fenchel`` term is ``G(z_k) + G*(a_k) − z_kᵀa_k ≥ 0`` for the box unit's potential ``G``, zero
exactly at ``z_k = Π(a_k)``). The output ``z_L`` of a row is *clamped* (``z_L := y``), *free* (a
variable; for the lifted term it is eliminated, ``z_L = a_L``) or *nudged* (free plus ``β gᵀz_L``, so
``z_L = a_L − βg/w_L``), as in the dense :class:`~inferlearn.engine.problems.dense.LiftedProblem`.

What the engine needs from each layer map is its forward and, for the lifted and Fenchel terms
whose maps are affine, the adjoint ``A_kᵀ`` of its linear part: autograd's vector–Jacobian product
(exact for affine maps, at any point), with an analytic fast path ``rW`` for ``nn.Linear``. The
block gradient of hidden layer ``k`` is::

    ∂E/∂z_k = w_k (z_k − a_k) − w_{k+1} A_{k+1}ᵀ r_{k+1},   r_{k+1} = z_{k+1} − a_{k+1}  (lifted)
                                                          r_{k+1} = z_{k+1} − Π(a_{k+1}) (fenchel)

The ``penalty`` term (any differentiable map and activation) is differentiated by autograd as a
whole. Weight gradients come from the energy at the minimiser (envelope theorem): the terms are
re-evaluated at the fixed ``z*`` with the parameters in the graph and back-propagated
(:meth:`~inferlearn.engine.problems.layered.LayeredProblem.accumulate_weight_grads`), so conv layers need no gradient code of their own.

References:
    Zach & Estellers (2019), Eqs. 2, 7 and 9; Zach, "Bilevel programs meet deep learning", Table 1;
    Whittington & Bogacz (2017) (predictive coding); Gu et al. (2020) (Fenchel lifted networks).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...errors import NonFiniteError
from ..graph import Graph, Node

KINDS = ("lifted", "penalty", "fenchel")
#: output terms of the penalty energy: squared error ``½‖z_L − f_L(a_L)‖²`` or cross-entropy ``CE(z_L, softmax(f_L(a_L)))``
OUTPUTS = ("se", "ce")


class LayeredEnergy:
    """``E(z) = Σ_k w_k T_k(z_k, A_k(z_{k-1}))`` over a chain, with the term ``kind``.

    Args:
        graph: the model's graph.
        kind: ``"lifted"``, ``"penalty"`` or ``"fenchel"``.
        term_weights: ``[w_1, …, w_L]`` (positive).
        output: the output term of the ``penalty`` kind (:data:`OUTPUTS`): ``"se"``, the squared error
            ``½‖z_L − f_L(a_L)‖²``, or ``"ce"``, the cross-entropy ``−Σ_j z_{L,j} log softmax(f_L(a_L))_j`` of the
            clamped target ``z_L`` (PCX's classification energy), whose error sent down is ``z_L − softmax(a_L)``.
    """

    def __init__(self, graph: Graph, kind: str, term_weights: Sequence[float], output: str = "se"):
        if kind not in KINDS:
            raise ValueError(f"Unknown energy kind {kind!r}; choose one of {list(KINDS)}")
        if output not in OUTPUTS or (output != "se" and kind != "penalty"):
            raise ValueError(f"Invalid output: {output!r} (choose one of {list(OUTPUTS)}; 'ce' needs the penalty kind)")
        self.output = output
        if len(term_weights) != graph.depth or not all(math.isfinite(w) and w > 0 for w in term_weights):
            raise ValueError(f"Need {graph.depth} positive term weights, got {list(term_weights)}")
        self.graph, self.kind = graph, kind
        self.term_weights = [0.0] + [float(w) for w in term_weights]   # index k = 1 … L
        #: the block curvatures computed for the step sizes (:meth:`LayeredProblem.block_curvature`), by parameter version
        self.curvature_cache: dict = {}

    @classmethod
    def lifted(cls, graph: Graph, gamma: float, kind: str = "lifted") -> "LayeredEnergy":
        """Term weights ``w_k = γ^{ℓ_k − 1}`` (the lifted paper's feedback weight ``γ``), ``ℓ_k`` the longest path
        from the input to node ``k`` (:attr:`Graph.levels`; ``ℓ_k = k`` on a chain), so that every edge
        ``j → k`` has a feedback ratio ``w_k / w_j ≤ γ``."""
        return cls(graph, kind, [gamma ** (graph.levels[k] - 1) for k in range(1, graph.depth + 1)])

    @property
    def depth(self) -> int:
        return self.graph.depth

    def node(self, k: int) -> Node:
        return self.graph.nodes[k - 1]

    def feedback(self, k: int, child: int | None = None) -> float:
        """``ρ = w_c / w_k`` for the edge from node ``k`` to node ``c = child`` (default ``k + 1``: a chain's ``ρ_k``)."""
        return self.term_weights[k + 1 if child is None else child] / self.term_weights[k]

    def pre(self, k: int, zs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``a_k = Σ_{e into k} A_e(z_{source(e)})`` from the values ``zs = [x, z_1, …]`` (at least up to ``k − 1``)."""
        return self.graph.nodes[k - 1].pre(zs)

    def out_edges(self, k: int):
        """The ``(child, edge)`` pairs reading node ``k``."""
        return self.graph.children[k]

    def term(self, k: int, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Per-row ``T_k(z_k, a_k)`` (unweighted)."""
        link = self.node(k)
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
        units = self.node(k).units
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
        return self.node(k).units.project(z)


def cross_entropy_gradient(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``∂/∂p (−Σ_j t_j log softmax(p)_j) = softmax(p) Σ_j t_j − t`` per row (a new tensor)."""
    return torch.softmax(logits, dim=1).mul_(target.sum(1, keepdim=True)).sub_(target)


class Adjoint:
    """``v ↦ Aᵀ v`` for the linear part of an affine edge map (a :class:`~inferlearn.engine.graph.Edge`, or a
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
        adj = Adjoint(link, torch.Size(shape), dtype, device)
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


def gram_lambda_max(W: torch.Tensor) -> float:
    """``λ_max(WᵀW) = ‖W‖₂²``, bounded from above within a few per cent (:func:`gram_norm_bound`).

    A pure function of ``W`` (no state carried between calls, so a resumed run takes the same steps).
    Raises :class:`~inferlearn.errors.NonFiniteError` for non-finite weights.
    """
    lam = gram_norm_bound(W)
    if not math.isfinite(lam):
        raise NonFiniteError("Cannot solve the inference problem: non-finite weights")
    return lam


def version_key(module) -> tuple:
    """The identities and version counters of ``module``'s parameters (an edge or a node): a cached bound keyed on
    them is never reused after an in-place update (an optimiser step bumps every version)."""
    return tuple((id(p), p._version) for p in module.parameters())
