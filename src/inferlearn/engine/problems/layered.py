"""One batch of inference problems on a :class:`~inferlearn.engine.problems.layered_energy.LayeredEnergy` (any
graph the engine reads): the forward start, the energy, its gradients and block steps, and the weight gradients
at the minimiser (envelope theorem)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ...tensors import accumulate_grad
from ..solvers.lifted_sweep import LIFTED_SWEEP, plain_bounds
from ..graph import is_affine
from .layered_energy import Adjoint, LayeredEnergy, cross_entropy_gradient, operator_norm_sq, version_key
from .penalty import PC_GRAPH_STEP, penalty_gradients, pre_float64
from .protocol import BatchProblem


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
        self.free_shift = None
        if nudge is not None and beta != 0:
            r = (-beta / energy.term_weights[energy.depth]) * nudge
            if self.n_clamped:
                r = r * self._row_mask(~clamped, r)
            self.free_shift = r
        self.nudge, self.beta = nudge, beta
        self._fwd = self._p1 = None

    @staticmethod
    def _row_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return mask.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))

    def output(self, a_top: torch.Tensor) -> torch.Tensor:
        """``z_L`` given ``a_L``: the target on clamped rows, ``a_L`` (plus the nudge shift) on free rows."""
        free = a_top if self.free_shift is None else a_top + self.free_shift
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
                zs.append(e.node(k).act(pre[k]))
            pre.append(e.pre(self.depth, zs))
            self._fwd = (zs[1:], pre)
        return self._fwd

    def pre_of(self, hidden: Sequence[torch.Tensor], fresh_a1: bool = False) -> list[torch.Tensor | None]:
        """``[None, a_1, …, a_L]`` at ``hidden`` (``fresh_a1``: recompute ``a_1 = A_1(x)``, e.g. to
        differentiate with respect to the first layer's parameters, instead of the cached one)."""
        zs = [self.x, *hidden]
        links = self.energy.graph.nodes
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
        if self.free_shift is not None:
            g = self.nudge * (1.0 if self.n_clamped == 0 else self._row_mask(~self.clamped, self.nudge))
            v = v + self.beta * (g * zs[-1]).flatten(1).sum(1)
        return v

    def adjoints(self, hidden: Sequence[torch.Tensor]) -> list[tuple[tuple[int, Adjoint], ...] | None]:
        """``outs[k]``: the ``(child c, A_eᵀ)`` pairs of the edges ``e`` reading hidden node ``k`` (``k = 1 … L−1``;
        on a chain the one pair ``(k + 1, A_{k+1}ᵀ)``), for the batch's hidden shapes."""
        return [None] + [tuple((c, Adjoint(edge, z.shape, z.dtype, z.device)) for c, edge in self.energy.out_edges(k))
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
                   outs: Sequence[tuple[int, Adjoint]], t: float, units=None) -> torch.Tensor:
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
        units = e.node(k).units if units is None else units
        lo, hi = units.clamp_bounds(new)
        return new if lo is None and hi is None else new.clamp_(min=lo, max=hi)   # a fresh tensor: in place

    #: no dense Hessian to polish with: the reference solver sweeps to a tight tolerance in float64 instead
    dense_hessian = False

    def feeds_only_output(self, k: int) -> bool:
        """Whether every edge out of hidden node ``k`` reads into the output node."""
        return all(c == self.depth for c, _ in self.energy.out_edges(k))

    def block_curvature(self, k: int, hidden: Sequence[torch.Tensor]) -> float:
        """``λ_max(A_{k+1}ᵀA_{k+1})`` for the block step sizes (on a graph the bound ``Σ_c ρ_{kc} (Σ_{e: k→c} ‖A_e‖₂)²`` of
        the block's scaled curvature over its children ``c``, divided by ``ρ_k``), for the shapes of ``hidden``.

        Remembered on the energy (:attr:`LayeredEnergy.curvature_cache`) for the parameters' current versions: EqProp
        solves its free and nudged phases on one energy, and the second solve reuses the first one's bounds (for a
        conv net, 30 power iterations per layer); an optimiser step bumps the versions, so no stale value is reused.
        """
        e, z = self.energy, hidden[k - 1]
        cache, shape = e.curvature_cache, (tuple(z.shape[1:]), z.dtype, z.device)
        if e.graph.is_chain:
            link = e.node(k + 1)
            key = (k, *shape, version_key(link))
            if key not in cache:
                cache[key] = operator_norm_sq(link, z.shape[1:], z.dtype, z.device)
            return cache[key]
        total = 0.0
        for c in sorted({c for c, _ in e.out_edges(k)}):
            if c == self.depth and self.n_clamped == 0:
                continue   # a free output is eliminated: its term is constant in z_k
            norm = 0.0
            for cc, edge in e.out_edges(k):
                if cc == c:
                    key = (id(edge), *shape, version_key(edge))
                    if key not in cache:
                        cache[key] = operator_norm_sq(edge, z.shape[1:], z.dtype, z.device)
                    norm += math.sqrt(max(cache[key], 0.0))
            total += e.feedback(k, c) * norm ** 2
        return total / e.feedback(k)

    def block_sweeps(self, hidden: list[torch.Tensor], pre: list, steps: Sequence[float]):
        """``(sweep, result)`` of the block projected-gradient sweeps (:meth:`block_step` on every hidden node in
        turn, each child's pre-activation refreshed after it); on a chain whose maps above the first are lone
        ``nn.Linear`` layers, the compiled kernel :data:`~inferlearn.engine.solvers.lifted_sweep.LIFTED_SWEEP`."""
        e, L, t = self.energy, self.depth, list(steps)
        if LIFTED_SWEEP.active(self.x.device) and e.graph.is_chain and all(
                e.node(k).lone_linear for k in range(2, L + 1)) and all(h.dim() == 2 for h in hidden):
            return self._linear_sweeps(hidden, pre, t)
        adj = self.adjoints(hidden)
        units = [e.node(k).units for k in range(1, L)]
        links = e.graph.nodes
        children = [None] + [sorted({c for c, _ in e.out_edges(k)}) for k in range(1, L)]
        zs = [self.x, *hidden]
        chain = e.graph.is_chain

        def sweep(check: bool) -> list[torch.Tensor]:
            moves = []
            for k in range(1, L):
                z = hidden[k - 1]
                new = self.block_step(k, hidden, pre, adj[k], t[k - 1], units[k - 1])
                if check:
                    moves.append((new - z).abs_().max() / t[k - 1])
                hidden[k - 1] = zs[k] = new
                if chain:
                    pre[k + 1] = links[k].edges[0].map(new)
                    continue
                for c in children[k]:   # the children's pre-activations, fresh for the next blocks
                    pre[c] = links[c - 1].pre(zs)
            return moves

        return sweep, lambda: hidden

    def _linear_sweeps(self, hidden: list[torch.Tensor], pre: list, t: list[float]):
        """The compiled sweep on a chain whose maps above the first are lone ``nn.Linear`` layers."""
        e, L = self.energy, self.depth
        lins = [e.node(k).maps[0] for k in range(2, L + 1)]
        Ws = [None] + [lin.weight.detach() for lin in lins]       # Ws[k]: z_k → a_{k+1}
        bs = [None] + [None if lin.bias is None else lin.bias.detach() for lin in lins]
        Wts = [None] + [W.t() for W in Ws[1:]]
        bounds = tuple(plain_bounds(e.node(k).units, hidden[k - 1]) for k in range(1, L))
        mask = self.clamped.reshape(-1, 1) if 0 < self.n_clamped < self.batch else None
        top = ("layered", self.n_clamped == 0, self.target if self.n_clamped else None, mask, self.free_shift)
        dev, dt = self.x.device, self.x.dtype
        tt = torch.tensor(t, dtype=dt, device=dev)
        alpha = tt * torch.tensor([e.feedback(k) for k in range(1, L)], dtype=dt, device=dev)
        state = {"h": list(hidden), "a": list(pre[1:])}

        def sweep(check: bool):
            h, a, move = LIFTED_SWEEP(state["h"], state["a"], Ws, Wts, bs, tt, alpha, e.kind, bounds, top, True)
            state["h"], state["a"] = h, a
            return [move] if check else []

        return sweep, lambda: state["h"]

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
        return self.energy.kind == "penalty" and self.free_shift is None and self.n_clamped == self.batch

    def _first_prediction(self) -> torch.Tensor:
        """``f_1(a_1)``, which no value node changes (computed once per batch)."""
        if self._p1 is None:
            with torch.no_grad():
                self._p1 = self.energy.node(1).act(self.a1)
        return self._p1

    def _penalty_gradients(self, hidden: Sequence[torch.Tensor], errors: list | None = None) -> list[torch.Tensor]:
        """``∂E/∂z_k`` of the penalty energy for any maps (:func:`penalty_gradients`); ``errors`` (if given)
        receives ``‖ε_k‖`` of the hidden layers, as :meth:`gradient_step` documents."""
        if not hidden:
            return []
        e = self.energy
        grads, norms = penalty_gradients(e.graph.nodes, self.x, self._first_prediction(), self.target, list(hidden),
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
        if (hidden and len(hidden) == self.depth - 1 and LayeredProblem._vjp_form(self) and not e.graph.is_dense
                and PC_GRAPH_STEP.active(self.x.device)):
            # a graph's step (conv nets, residual networks) as one compiled call: see PC_GRAPH_STEP
            new, norms = PC_GRAPH_STEP(e.graph.prime().nodes, self.x, self._first_prediction(), self.target,
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
                lo, hi = e.node(k).units.clamp_bounds(z)
                if lo is not None or hi is not None:
                    z.clamp_(min=lo, max=hi)
        return hidden

    def _closed_form(self) -> bool:
        if getattr(self, "_affine", None) is None:
            chain = self.energy.graph
            self._affine = all(l.affine for l in chain.nodes) and all(
                l.units is not None for l in chain.nodes[:-1]) and chain.linear_output
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
        links = e.graph.nodes
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
        return [z - self.energy.node(k).act(pre[k]) for k, z in enumerate(hidden, start=1)]

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
                raise ValueError(f"Hidden layer {k} leaves its unit set {self.energy.node(k).units.name}")

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
                link = e.node(k)
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
                a, leaves = pre_float64(link, zs)
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
