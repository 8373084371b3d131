"""Stochastic block-ADMM: train a network split into blocks, with per-sample decoupling variables.

Problem (docs/maths.md §C). Blocks ``f_1 … f_T`` (any ``nn.Module``; see :mod:`inferlearn.blocks`),
decoupling variables ``Z_t`` (``t = 1 … T-1``) for every training sample, ``Z_0 = X``::

    min J(f_T(Z_{T-1}), Y)   s.t.   Z_t = f_t(Z_{t-1}),   t = 1 … T-1
    𝓛 = (1/N) Σ_i [ J(f_T(z_{T-1,i}), y_i) + Σ_{t<T} (β_t/2) ‖z_{t,i} − f_t(z_{t-1,i}) + u_{t,i}‖² ]

**The last block has no ``Z_T``**: the loss is applied to ``f_T(Z_{T-1})`` directly. A ``Z_T`` with
the constraint ``Z_T = f_T(Z_{T-1})`` would add ``N × n_out`` state and a loss on ``Z_T`` whose
gradient reaches ``Θ_T`` only through a penalty, i.e. one more level of lag, for no gain; with our
form ``T = 1`` is exactly plain training of the single block (tested).

**The paper's literal form** (``formulation="paper"``, batch mode): ``Z_t`` for ``t = 1 … T``, the loss
on the decoupling variable of the output and the last block coupled by a penalty like the others::

    𝓛 = (1/N) Σ_i [ J(z_{T,i}, y_i) + Σ_{t≤T} (β_t/2) ‖z_{t,i} − f_t(z_{t-1,i}) + u_{t,i}‖² ]

The reverse ``Z`` sweep then starts at ``Z_T``, whose sub-problem ``J(z, y) + (β_T/2)‖z − a‖²`` is solved
exactly (:func:`~inferlearn.admm.config.loss_prox`), and ``Θ_T`` sees only its penalty. With
``primal_schedule="proposition"`` and ``adaptive=True`` this is Algorithm 1 under the conditions of
Proposition 1 (growing primal accuracy, Shi et al.'s penalty rule).

A DeepFacto :class:`~inferlearn.nmf.NMF` module may sit between two ordinary blocks as block ``t``;
its decoupling variable ``Z_t`` is the score matrix ``S`` (input of block ``t+1``), its constraint is
``Z_{t-1} = S Mᵀ`` with penalty ``β_t`` (the paper's ``γ``) and scaled multipliers ``U_t`` (``V``).
Choose γ large relative to the next block's term (we use β = γ = 20): otherwise the training scores
drift in the near-null space of ``M`` and no longer match the test-time projection.

**Algorithm 1 (batch)**, one outer iteration (= one epoch) ``k``::

    repeat p_k times (primal steps; p_k = primal_steps + ⌊primal_growth · k⌋):
        (1) one pass of mini-batches: each block's Θ_t takes an optimiser step on its own term of 𝓛
            (back-propagation only inside the block); NMF bases M by NNLS on all samples
        (2) for t = T-1 … 1, for all samples: Z_t ← Z_t − ζ_t ∇_{z_t} ℓ_i  (z_steps times), where ℓ_i
            is the per-sample summand of 𝓛 (so ζ_t does not depend on N); Z_t feeding an NMF has the
            closed-form minimiser, NMF scores S take a prox-linear NNLS step
    (3) U_t ← U_t + Z_t − f_t(Z_{t-1})        (NMF: U_t ← U_t + Z_{t-1} − S Mᵀ)

**Algorithm 2 (online)**: :mod:`inferlearn.admm.online` (one scalar dual per block, no per-sample memory).

**Adaptive penalty** (after Shi et al. 2017): after the primal steps of iteration ``k`` let
``h_k = sqrt(Σ_t mean_i ‖r_{t,i}‖²)`` be the constraint error. If ``h_k ≤ η_k = η_0 · η_decay^k``
the duals are updated and β kept; otherwise the duals are kept and ``β ← min(c β, β_max)``. Since
``U = λ/β`` is the *scaled* dual, keeping ``λ`` means ``U ← U / c``; ζ is divided by the same factor
so that the ``Z`` step stays stable (ζβ < 2 for the quadratic term). In online mode the rule is applied
per mini-batch with ``η_k`` indexed by the epoch. With ``primal_growth > 0`` the
primal sub-problem is solved more accurately as ``k`` grows, as the convergence result requires.

References:
    Khorram et al., "Stochastic Block-ADMM for Training Deep Networks" (seed 003): Eq. (3.1)-(3.2),
    Algorithms 1 and 2, §3.3 (adaptive ρ after Shi et al. 2017), §3.4 (DeepFacto).

Note:
    All blocks' Θ-terms of one mini-batch are summed and back-propagated with one ``backward()``;
    since the terms share no parameters and ``Z`` is detached, each block's gradient is exactly that
    of its own term (one autograd call instead of ``T``, the same update); likewise one optimiser with
    one parameter group per block replaces ``T`` optimisers (per-parameter state: the same update, tested
    bit for bit), by default with PyTorch's fused kernels. In the online variant
    the ``z`` steps move all ``z_t`` jointly (one forward/backward per step) with the safeguarded
    step ``ζ_t / (1 + 2ζ_t(λ_t + ρ_t h_t + λ_{t+1} + ρ_{t+1} h_{t+1}))`` (the scalar duals only grow,
    and a fixed step diverges once they are large), and the dual update uses ``h_t`` measured before the Θ step (it comes
    free with that step's forward pass). Since ``h_t`` is a *squared* error, its gradient vanishes
    at ``z = f(z)``: starting from the forward pass, the first ``z`` step moves only ``z_{T-1}``
    and the signal reaches ``z_1`` after ``T-1`` steps, so use ``z_steps ≥ T-1``.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DivergenceError
from .config import ADMMConfig, loss_prox, loss_sum, per_list, sqnorm_rows
from . import deepfacto, online
from .nmf import NMF
from .placement import LocalBlocks
from .state import SampleState, Storage
class BlockADMM:
    """Stochastic block-ADMM trainer over blocks that are ordinary ``nn.Module``\\ s.

    Args:
        blocks: ``f_1 … f_T``; :class:`~inferlearn.nmf.NMF` modules may stand between ordinary blocks
            (batch mode only).
        config: :class:`ADMMConfig`.
        memmap_dir: if given, ``Z`` and ``U`` of the batch mode are memory-mapped files in this folder.
        placement: where the blocks run (:mod:`~inferlearn.admm.placement`): :class:`~inferlearn.admm.placement.
            LocalBlocks` (default: every block in this process) or :class:`~inferlearn.admm.parallel.RankBlocks`
            (contiguous runs of blocks over the ranks of a process group).

    Raises:
        ValueError: bad penalties or step sizes, an NMF module first, last or next to another, NMF
            modules in online mode.

    Example:
        >>> import torch
        >>> from inferlearn.admm import ADMMConfig, BlockADMM, mlp, split_sequential
        >>> blocks = split_sequential(mlp("4-8-3"))              # [Flatten, Linear], [ReLU, Linear]
        >>> trainer = BlockADMM(blocks, ADMMConfig(batch_size=8, lr=1e-2))
        >>> trainer.init_state(torch.randn(32, 4), torch.randint(0, 3, (32,)))   # Z_1 from a forward pass, U_1 = 0
        >>> trainer.Z[0].shape
        torch.Size([32, 8])
        >>> metrics = trainer.epoch()                            # one outer iteration: Θ pass, Z update, duals
        >>> trainer.predict(torch.randn(2, 4)).shape
        torch.Size([2, 3])
    """

    def __init__(self, blocks: Sequence[nn.Module], config: ADMMConfig | None = None,
                 memmap_dir: str | os.PathLike | None = None, placement: LocalBlocks | None = None):
        self.blocks = list(blocks)
        self.cfg = config or ADMMConfig()
        T = len(self.blocks)
        if T == 0:
            raise ValueError("Need at least one block")
        self.T = T
        self.is_nmf = [isinstance(b, NMF) for b in self.blocks]
        for t, nmf in enumerate(self.is_nmf):
            if nmf and (t == 0 or t == T - 1):
                raise ValueError(f"An NMF module cannot be the first or last block (it is block {t + 1} of {T}); "
                                 f"place it between two ordinary blocks")
            if nmf and self.is_nmf[t - 1]:
                raise ValueError(f"Blocks {t} and {t + 1} are both NMF modules; put an ordinary block between them")
        if any(self.is_nmf) and self.cfg.mode != "batch":
            raise ValueError("NMF modules need mode='batch' (their basis update uses all samples)")
        if any(self.is_nmf) and self.cfg.z_schedule != "gauss-seidel":
            raise ValueError("NMF modules need z_schedule='gauss-seidel'")
        if self.cfg.formulation == "paper" and self.cfg.z_schedule != "gauss-seidel":
            raise ValueError("The paper formulation sweeps Z in reverse (z_schedule='gauss-seidel'); "
                             "the Jacobi schedule takes the default formulation")
        self.paper = self.cfg.formulation == "paper"
        self.n_z = T if self.paper else T - 1  # decoupling variables Z_1 … Z_{n_z}
        self.beta = per_list(self.cfg.beta, self.n_z, "beta") if self.n_z else []
        self.zeta = per_list(self.cfg.zeta, self.n_z, "zeta") if self.n_z else []
        self.lam = [0.0] * (T - 1)  # online scalar duals
        self.optimizer = self._make_optimizer([b for b, nmf in zip(self.blocks, self.is_nmf) if not nmf])
        self.generator = torch.Generator().manual_seed(self.cfg.seed)
        self.state = SampleState(Storage(memmap_dir), self.cfg.chunk_size, lambda: (self.device, self.dtype))
        self.placement = LocalBlocks() if placement is None else placement
        self.placement.attach(self)
        self.iteration = 0  # completed outer iterations (epochs)
        self.fused = True  # fuse the last Z sweep with the dual update (same result, less work)
        self.history: list[dict] = []

    # ------------------------------------------------------------------ set-up
    def _make_optimizer(self, blocks: list[nn.Module]) -> torch.optim.Optimizer:
        """One optimiser, one parameter group per (non-NMF) block.

        Each block's term of 𝓛 touches only that block's parameters and SGD/Adam keep per-parameter
        state, so one optimiser over all blocks makes exactly the per-block updates of Algorithm 1
        (tested bit for bit against one optimiser per block) with one ``step()`` instead of ``T``.
        """
        groups = []
        for block in blocks:
            params = [p for p in block.parameters() if p.requires_grad]
            if not params:
                raise ValueError(f"Block {type(block).__name__} has no trainable parameters")
            groups.append({"params": params})
        c = self.cfg
        kw = {"lr": c.lr, "weight_decay": c.weight_decay}
        if c.optimizer == "sgd":
            kw["momentum"] = c.momentum
        cls = torch.optim.SGD if c.optimizer == "sgd" else torch.optim.Adam
        if c.fused_optimizer:
            try:
                return cls(groups, fused=True, **kw)
            except RuntimeError:  # device or dtype without fused kernels: the plain implementation
                pass
        return cls(groups, **kw)

    @property
    def device(self) -> torch.device:
        for b in self.blocks:
            for p in b.parameters():
                return p.device
            for buf in b.buffers():
                return buf.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        for b in self.blocks:
            for p in b.parameters():
                return p.dtype
        return torch.get_default_dtype()

    # the per-sample state, held by :attr:`state` (:class:`~inferlearn.admm.state.SampleState`)
    X = property(lambda self: self.state.X, lambda self, v: setattr(self.state, "X", v))
    Y = property(lambda self: self.state.Y, lambda self, v: setattr(self.state, "Y", v))
    Z = property(lambda self: self.state.Z, lambda self, v: setattr(self.state, "Z", v))
    U = property(lambda self: self.state.U, lambda self, v: setattr(self.state, "U", v))

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files (every process of a local run; rank 0 of a group)."""
        return self.placement.is_main

    @torch.no_grad()
    def init_state(self, X: torch.Tensor, Y: torch.Tensor) -> None:
        """Batch mode: ``Z`` from a forward pass of all samples, ``U = 0``; NMF bases fitted to ``Z``.

        The NMF warm start (alternating NNLS on the frozen previous block's output) follows the
        paper's "pre-train the NMF module with the backbone frozen".
        """
        if X.shape[0] != Y.shape[0]:
            raise ValueError(f"Got {X.shape[0]} inputs and {Y.shape[0]} targets")
        self.X, self.Y = X, Y
        N = X.shape[0]
        self.Z, self.U = [], []
        for t in range(1, self.n_z + 1):
            blk = self.blocks[t - 1]
            if self.is_nmf[t - 1]:
                prev = self.Z[t - 2]
                flat = prev.reshape(N, -1).to(self.device, self.dtype)
                S = blk.fit(flat, iters=self.cfg.nmf_init_iters, sweeps=self.cfg.nmf_sweeps)
                Zt = self.state.storage.alloc(f"Z{t}", tuple(S.shape), self.dtype)
                Zt.copy_(S.to(Zt))
                Ut = self.state.storage.alloc(f"U{t}", tuple(prev.shape), self.dtype)
            else:
                first = blk(self.state.get(t - 1, slice(0, 1)))
                Zt = self.state.storage.alloc(f"Z{t}", (N, *first.shape[1:]), self.dtype)
                for a, b in self.state.chunks(N):
                    self.state.put(Zt, slice(a, b), blk(self.state.get(t - 1, slice(a, b))))
                Ut = self.state.storage.alloc(f"U{t}", tuple(Zt.shape), self.dtype)
            self.Z.append(Zt)
            self.U.append(Ut)
        self.state.storage.flush()
        self.placement.keep_own_state(self)

    def memory_bytes(self) -> dict:
        """Bytes held by the per-sample state ``Z`` and ``U`` and where it lives."""
        return self.state.memory_bytes()

    # ------------------------------------------------------------------ block terms
    def _constraint_residual(self, t: int, sl) -> torch.Tensor:
        """``r_t`` of the samples ``sl``: ``Z_t − f_t(Z_{t-1})``, or ``Z_{t-1} − S Mᵀ`` for an NMF block."""
        blk = self.blocks[t - 1]
        if self.is_nmf[t - 1]:
            prev = self.state.get(t - 1, sl)
            return prev - (self.state.get(t, sl) @ blk.M.T).reshape(prev.shape)
        return self.state.get(t, sl) - blk(self.state.get(t - 1, sl))

    def _terms(self) -> range:
        """The blocks whose terms of 𝓛 this process updates (:meth:`~inferlearn.admm.placement.LocalBlocks.terms`)."""
        return self.placement.terms(self.T)

    def _constraints(self) -> list[int]:
        """The constraints ``t ≤ n_z`` whose ``Z_t``, ``U_t`` this process holds."""
        return [t for t in self._terms() if t <= self.n_z]

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """Sum per-block scalars over the processes that hold the blocks (one process: themselves)."""
        return self.placement.sum(values)

    def _theta_loss(self, idx: torch.Tensor) -> torch.Tensor:
        """Σ_t (block t's term of 𝓛 on the mini-batch ``idx``), batch mean; NMF blocks excluded."""
        total = 0.0
        terms = self._terms()
        inp = self.state.get(terms[0] - 1, idx)  # each Z_t is gathered once: input of block t+1 and target of block t
        for t in terms:
            nxt = self.state.get(t, idx) if t <= self.n_z else None
            if not self.is_nmf[t - 1]:
                out = self.blocks[t - 1](inp)
                if t > self.n_z:
                    total = total + loss_sum(self.cfg.loss, out, self.state.take(self.Y, idx).to(out.device)) / len(idx)
                else:
                    # ‖z − f(z_prev) + u‖² = ‖f(z_prev) − (z + u)‖²: the target needs no graph, and
                    # one mse_loss node replaces sub/add/pow/sum/mean (fewer autograd ops per batch).
                    target = nxt + self.state.u(t, idx)
                    total = total + (0.5 * self.beta[t - 1] / len(idx)) * F.mse_loss(out, target, reduction="sum")
            inp = nxt
        return total

    def next_term_sum(self, t: int, z: torch.Tensor, sl) -> torch.Tensor:
        """Σ over samples of the term of 𝓛 in which ``Z_t`` is the *input* (block ``t+1``'s term)."""
        nxt = self.blocks[t]
        out = nxt(z)
        if t + 1 > self.n_z:
            return loss_sum(self.cfg.loss, out, self.Y[sl].to(out.device))
        r = self.state.get(t + 1, sl) - out + self.state.u(t + 1, sl)
        return 0.5 * self.beta[t] * sqnorm_rows(r).sum()

    # ------------------------------------------------------------------ batch updates
    def _theta_pass(self) -> float:
        N = self.X.shape[0]
        perm = torch.randperm(N, generator=self.generator)
        bs = self.cfg.batch_size
        total, count = 0.0, 0
        for a in range(0, N, bs):
            idx = perm[a:a + bs]
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._theta_loss(idx)
            if not torch.isfinite(loss):
                raise DivergenceError(f"non-finite block loss {float(loss.detach())} in mini-batch {a // bs}")
            if loss.requires_grad:
                loss.backward()
                self.optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        return total / max(count, 1)

    def _z_update(self, t: int) -> None:
        """Update ``Z_t`` for all samples on the two terms of 𝓛 that contain it."""
        N = self.X.shape[0]
        beta = self.beta[t - 1]
        blk = self.blocks[t - 1]
        for a, b in self.state.chunks(N):
            sl = slice(a, b)
            if t < self.T and self.is_nmf[t]:
                # Z_t feeds an NMF: both terms are quadratic, take the exact minimiser.
                gamma = self.beta[t]
                with torch.no_grad():
                    F_t = blk(self.state.get(t - 1, sl))
                    SM = (self.state.get(t + 1, sl) @ self.blocks[t].M.T).reshape(F_t.shape)
                    z = (beta * (F_t - self.state.u(t, sl)) + gamma * (SM - self.state.u(t + 1, sl))) / (beta + gamma)
                self.state.put(self.Z[t - 1], sl, z)
            elif self.is_nmf[t - 1]:
                self.state.put(self.Z[t - 1], sl, deepfacto.score_update(self, t, sl))
            else:  # (the paper's Z_T too: _z_steps solves its sub-problem exactly)
                with torch.no_grad():
                    target = blk(self.state.get(t - 1, sl)) - self.state.u(t, sl)
                self.state.put(self.Z[t - 1], sl, self._z_steps(t, sl, target))

    def _jacobi_z_update(self) -> None:
        """Update every ``Z_t`` at once from the previous values of its neighbours (``z_schedule='jacobi'``).

        Per chunk, all new ``Z_t`` are computed before any is stored, so each update sees the old
        ``Z_{t-1}``, ``Z_{t+1}`` — what the ranks of a :class:`~inferlearn.admm.parallel.RankBlocks` placement see
        when they update their own ``Z_t`` at the same time: there the placement brings the gradient of the next
        rank's first term to this rank's last ``Z_t`` and, after the step, this rank's input replica from below.
        """
        p, last = self.placement, self._terms()[-1]
        for a, b in self.state.chunks(self.X.shape[0]):
            sl = slice(a, b)
            g_up = p.boundary_gradient(self, sl)
            new = {}
            for t in self._constraints():
                with torch.no_grad():
                    target = self.blocks[t - 1](self.state.get(t - 1, sl)) - self.state.u(t, sl)
                new[t] = self._z_steps(t, sl, target, next_grad=g_up if t == last else None)
            for t, z in new.items():
                self.state.put(self.Z[t - 1], sl, z)
            p.boundary_values(self, sl)
        self.state.storage.flush()

    def _z_steps(self, t: int, sl, target: torch.Tensor, next_grad: torch.Tensor | None = None) -> torch.Tensor:
        """``z_steps`` gradient steps on ``(β_t/2)‖z − target‖² + (block t+1's term)``, per sample.

        ``next_grad``, if given, is the gradient of block t+1's term at the stored ``Z_t`` (the first
        step then needs no forward of block t+1).
        """
        if t == self.T:
            return loss_prox(self.cfg.loss, target, self.state.take(self.Y, sl).to(target.device), self.beta[self.T - 1])
        beta, zeta = self.beta[t - 1], self.zeta[t - 1]
        z = self.state.get(t, sl)
        for step in range(self.cfg.z_steps):
            if step == 0 and next_grad is not None:
                z = z - zeta * (beta * (z - target) + next_grad)
                continue
            z = z.detach().requires_grad_(True)
            obj = 0.5 * beta * (z - target).pow(2).sum() + self.next_term_sum(t, z, sl)
            (g,) = torch.autograd.grad(obj, z)
            z = z - zeta * g
        return z.detach()

    def _fused_z_dual_sweep(self) -> tuple[list[float], list[float]]:
        """The reverse ``Z`` sweep and the dual update in one pass over the data (no NMF, fixed β).

        Same result as ``_z_update(T-1) … _z_update(1)`` followed by ``_dual_update`` (tested):
        once ``Z_t`` is final, ``Z_{t+1}`` is final too, so ``r_{t+1} = Z_{t+1} − f_{t+1}(Z_t)`` and
        ``U_{t+1}`` can be updated at once, and ``r_1`` reuses the ``f_1(X)`` that the ``Z_1`` update
        computed anyway (block 1 is usually the widest: this saves its second full forward pass).
        """
        N, top = self.X.shape[0], self.n_z
        sq, zsq = [0.0] * top, [0.0] * top

        def dual(t, sl, r, z):
            sq[t - 1] += float(sqnorm_rows(r).sum())
            zsq[t - 1] += float(sqnorm_rows(z).sum())
            self.state.put(self.U[t - 1], sl, self.state.u(t, sl) + r)

        # Samples are independent and the weights fixed during the sweep, so each chunk can run the
        # whole reverse sweep t = T-1 … 1 (same result as sweeping t outermost). Within a chunk,
        # F_t = f_t(Z_{t-1}) is evaluated at the *old* Z_{t-1}, which is exactly where the first
        # z-step of Z_{t-1} (next in the sweep) needs block t's forward: keep its graph and
        # back-propagate the penalty's gradient through it instead of a second forward.
        for a, b in self.state.chunks(N):
            sl = slice(a, b)
            reuse = None  # (Z_t old with grad, f_{t+1}(Z_t old) with graph)
            for t in range(top, 0, -1):
                next_grad = None
                if reuse is not None:
                    zin, out = reuse
                    # d/d(out) of (β_{t+1}/2)‖Z_{t+1} − out + U_{t+1}‖² at the already updated Z_{t+1}
                    gout = -self.beta[t] * (self.state.get(t + 1, sl) - out.detach() + self.state.u(t + 1, sl))
                    (next_grad,) = torch.autograd.grad(out, zin, grad_outputs=gout)
                    reuse = None
                if t > 1:
                    zin = self.state.get(t - 1, sl).requires_grad_(True)
                    with torch.enable_grad():
                        out = self.blocks[t - 1](zin)
                    reuse, F_t = (zin, out), out.detach()
                else:
                    with torch.no_grad():
                        F_t = self.blocks[t - 1](self.state.get(t - 1, sl))
                z = self._z_steps(t, sl, F_t - self.state.u(t, sl), next_grad)
                self.state.put(self.Z[t - 1], sl, z)
                z = self.state.get(t, sl)  # as stored (dtype of the state)
                with torch.no_grad():
                    if t < top:
                        z_next = self.state.get(t + 1, sl)
                        dual(t + 1, sl, z_next - self.blocks[t](z), z_next)
                    if t == 1:
                        dual(1, sl, z - F_t, z)
        res = [math.sqrt(v / N) for v in sq]
        if not all(math.isfinite(r) for r in res):
            raise DivergenceError(f"non-finite constraint residuals {res}")
        self.state.storage.flush()
        return res, [math.sqrt(v / N) for v in zsq]

    @torch.no_grad()
    def _dual_update(self) -> tuple[list[float], list[float]]:
        """``U_t ← U_t + r_t`` (or, adaptively, ``β`` growth); returns RMS residuals before the update
        and RMS sizes of ``Z_t`` (for relative residuals)."""
        N = self.X.shape[0]
        sq = [0.0] * self.n_z
        zsq = [0.0] * self.n_z
        # Without the adaptive rule the dual update needs no global decision: one pass computes the
        # residuals, their norms and the update (one forward of each block instead of two).
        update_now = not self.cfg.adaptive
        for t in self._constraints():
            for a, b in self.state.chunks(N):
                sl = slice(a, b)
                r = self._constraint_residual(t, sl)
                sq[t - 1] += float(sqnorm_rows(r).sum())
                zsq[t - 1] += float(sqnorm_rows(self.state.get(t - 1 if self.is_nmf[t - 1] else t, sl)).sum())
                if update_now:
                    self.state.put(self.U[t - 1], sl, self.state.u(t, sl) + r)
        both = self._sum_over_ranks(sq + zsq)
        sq, zsq = both[:self.n_z], both[self.n_z:]
        res = [math.sqrt(s / N) for s in sq]
        if not all(math.isfinite(r) for r in res):
            raise DivergenceError(f"non-finite constraint residuals {res}")
        k = self.iteration
        grow = self.cfg.adaptive and math.sqrt(sum(s / N for s in sq)) > self.cfg.eta0 * self.cfg.eta_decay ** k
        for t in range(1, self.n_z + 1 if self.cfg.adaptive else 1):
            mine = t in self._constraints()
            if grow:
                new = min(self.beta[t - 1] * self.cfg.penalty_growth, self.cfg.beta_max)
                if mine:
                    self.U[t - 1].mul_(self.beta[t - 1] / new)  # keep λ = β U
                self.zeta[t - 1] *= self.beta[t - 1] / new  # keep ζ_t β_t (< 2 for a stable Z step)
                self.beta[t - 1] = new
            elif mine:
                for a, b in self.state.chunks(N):
                    sl = slice(a, b)
                    self.state.put(self.U[t - 1], sl, self.state.u(t, sl) + self._constraint_residual(t, sl))
        self.state.storage.flush()
        return res, [math.sqrt(s / N) for s in zsq]

    def primal_steps_at(self, k: int) -> int:
        """Number of primal passes in outer iteration ``k = 0, 1, …`` (the primal accuracy schedule).

        ``linear``: ``p_k = p_0 + ⌊g k⌋``. ``proposition``: Proposition 1 converges to a KKT point when
        the primal sub-problem is solved to ``E‖G(X^k)‖² ≤ ε_k`` with ``ε_k → 0``, by more primal
        iterations as ``k`` grows (§3.3, stochastic block gradient after Xu and Yin 2015). We let
        ``ε_k = ε_0 d^k`` shrink at the rate ``d`` (``eta_decay``) of the penalty rule's error bound
        ``η_k = η_0 d^k``; since stochastic (block) gradient reaches ``E‖G‖² ≤ ε`` in ``O(ε^{-2})``
        iterations on a non-convex problem, ``p_k = ⌈p_0 d^{−2k}⌉``.
        """
        if self.cfg.primal_schedule == "proposition":
            return int(math.ceil(self.cfg.primal_steps * self.cfg.eta_decay ** (-2 * k) - 1e-9))
        return self.cfg.primal_steps + int(math.floor(self.cfg.primal_growth * k))

    def _batch_epoch(self) -> dict:
        if self.X is None:
            raise RuntimeError("Call init_state(X, Y) before training in batch mode")
        p = self.primal_steps_at(self.iteration)
        theta_loss = 0.0
        jacobi = self.cfg.z_schedule == "jacobi"
        fuse = self.fused and not jacobi and not self.cfg.adaptive and not any(self.is_nmf) and self.n_z > 0
        res, zn = [], []
        t_theta = t_z = 0.0  # seconds in the Θ passes and in the Z/NMF/dual passes (for profiling)
        for step in range(p):
            t0 = time.perf_counter()
            theta_loss = self._theta_pass()
            t1 = time.perf_counter()
            t_theta += t1 - t0
            deepfacto.nmf_basis_update(self)
            if fuse and step == p - 1:
                res, zn = self._fused_z_dual_sweep()
                t_z += time.perf_counter() - t1
                break
            if jacobi:
                self._jacobi_z_update()
            else:
                for t in range(self.n_z, 0, -1):
                    self._z_update(t)
            t_z += time.perf_counter() - t1
        else:
            t1 = time.perf_counter()
            res, zn = self._dual_update() if self.n_z > 0 else ([], [])
            t_z += time.perf_counter() - t1
        theta_loss = self._sum_over_ranks([theta_loss])[0]
        return {"admm_objective": theta_loss, "primal_steps": p, "theta_seconds": t_theta, "z_dual_seconds": t_z,
                **{f"residual_{t + 1}": r for t, r in enumerate(res)},
                **{f"rel_residual_{t + 1}": r / (z + 1e-12) for t, (r, z) in enumerate(zip(res, zn))},
                **{f"beta_{t + 1}": b for t, b in enumerate(self.beta)}}

    # ------------------------------------------------------------------ online
    def online_gradient(self, x: torch.Tensor, y: torch.Tensor, zs: list[torch.Tensor] | None = None):
        """Online mode: fill the blocks' ``.grad`` with the Θ gradient on the mini-batch ``(x, y)``
        (:func:`~inferlearn.admm.online.online_gradient`). Returns the objective and the ``h_t``."""
        return online.online_gradient(self, x, y, zs)

    # ------------------------------------------------------------------ public
    def train_mode(self, on: bool = True) -> None:
        for b in self.blocks:
            b.train(on)

    def epoch(self, X: torch.Tensor | None = None, Y: torch.Tensor | None = None,
              transform: Callable | None = None) -> dict:
        """One outer iteration (batch) or one pass of mini-batches (online); returns its metrics.

        Batch mode trains on the samples given to :meth:`init_state` (``X``, ``Y`` must be ``None``);
        online mode takes ``X, Y`` each epoch and an optional ``transform(x, generator)`` per batch.
        """
        self.train_mode(True)
        if self.cfg.mode == "batch":
            if X is not None or transform is not None:
                raise ValueError("Batch mode trains on the samples given to init_state; use mode='online' for "
                                 "data that change each epoch")
            m = self._batch_epoch()
        else:
            if X is None or Y is None:
                raise ValueError("Online mode needs X and Y for each epoch")
            m = online.online_epoch(self, X, Y, transform)
        self.iteration += 1
        return m

    @torch.no_grad()
    def predict(self, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
        """Test time: a plain forward pass through the blocks (NMF modules project by NNLS); over ranks a pipeline
        (each rank applies its blocks and passes the activations on), whose output every rank gets."""
        self.train_mode(False)
        p, outs = self.placement, []
        for a in range(0, x.shape[0], batch):
            z = p.chunk_input(x[a:a + batch].to(self.device, self.dtype))
            for t in self._terms():
                z = self.blocks[t - 1](z)
            outs.append(p.chunk_output(z, self.T))
        return p.output(outs)

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: blocks, optimisers, Z, U, duals, penalties, RNG (over ranks: the
        one-process form assembled on rank 0, ``{}`` on the others; a collective, every rank calls it)."""
        return self.placement.state_dict(self, self.local_state_dict())

    def local_state_dict(self) -> dict:
        """:meth:`state_dict` of what this process holds."""
        return {"iteration": self.iteration, "blocks": [b.state_dict() for b in self.blocks],
                "optimizer": self.optimizer.state_dict(),
                "Z": [z.clone() if z is not None else None for z in self.Z],
                "U": [u.clone() if u is not None else None for u in self.U], "beta": list(self.beta),
                "lam": list(self.lam), "zeta": list(self.zeta), "generator": self.generator.get_state(), "config": asdict(self.cfg)
                if not callable(self.cfg.loss) else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (batch mode: call :meth:`init_state` first for ``X, Y``; over ranks every
        rank reads the whole of it, then keeps its share)."""
        self.placement.load_state_dict(self, state)

    def load_local_state_dict(self, state: dict) -> None:
        """:meth:`load_state_dict` into what this process holds."""
        self.iteration = int(state["iteration"])
        for b, s in zip(self.blocks, state["blocks"]):
            b.load_state_dict(s)
        if "optimizer" not in state:
            raise ValueError("Checkpoint has one optimiser state per block (an older inferlearn); this version "
                             "keeps one optimiser for all blocks: restart the run")
        self.optimizer.load_state_dict(state["optimizer"])
        if len(state["Z"]) != len(self.Z) and self.cfg.mode == "batch":
            raise ValueError(f"Checkpoint has {len(state['Z'])} decoupling variables, this trainer {len(self.Z)}")
        for dst, src in zip(self.Z + self.U, state["Z"] + state["U"]):
            if dst.shape != src.shape:
                raise ValueError(f"Checkpoint state has shape {tuple(src.shape)}, expected {tuple(dst.shape)} "
                                 f"(different data or training subset?)")
            dst.copy_(src)
        self.state.storage.flush()
        self.beta = [float(b) for b in state["beta"]]
        self.lam = [float(v) for v in state["lam"]]
        self.zeta = [float(v) for v in state.get("zeta", self.zeta)]
        self.generator.set_state(state["generator"])
