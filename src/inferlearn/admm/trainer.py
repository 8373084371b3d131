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
exactly (:meth:`BlockADMM._loss_prox`), and ``Θ_T`` sees only its penalty. With
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

**Algorithm 2 (online)** (docs/maths.md §C, reconstructed), per mini-batch ``(x, y)`` (e.g. augmented):
initialise ``z`` by a forward pass, take ``z_steps`` gradient steps (rate ζ_t, per sample) on
``J + Σ_t (λ_t h_t + (ρ_t/2) h_t²)`` with ``h_t = mean_i ‖z_{t,i} − f_t(z_{t-1,i})‖²``, then
``primal_steps`` Θ steps on the same objective, then ``λ_t ← λ_t + ρ_t h_t``. One scalar dual per
block, so no per-sample memory.

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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DivergenceError, RunFolderError
from ..training.config import check_momentum
from ..training.run_folder import RunFolder
from ..losses import one_hot
from .nmf import NMF, nnls_gram

MODES = ("batch", "online")
FORMULATIONS = ("default", "paper")
PRIMAL_SCHEDULES = ("linear", "proposition")
LOSSES = ("cross-entropy", "quadratic", "mse")
OPTIMIZERS = ("sgd", "adam")
Z_SCHEDULES = ("gauss-seidel", "jacobi")


def _per_list(value, n: int, name: str) -> list[float]:
    vals = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(vals) != n:
        raise ValueError(f"Expected {n} values for {name} (one per constraint), got {len(vals)}")
    out = []
    for v in vals:
        v = float(v)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"Invalid {name}: {v}")
        out.append(v)
    return out


@dataclass(frozen=True)
class ADMMConfig:
    """Hyper-parameters of :class:`BlockADMM` (validated on construction).

    Attributes:
        mode: ``"batch"`` (Algorithm 1) or ``"online"`` (Algorithm 2).
        batch_size: mini-batch size of the Θ updates.
        optimizer, lr, momentum, weight_decay: the ``torch.optim`` optimiser of the blocks' parameters
            (one optimiser, one parameter group per block: each block's loss touches only its own
            parameters and both optimisers keep per-parameter state, so this is the same update as one
            optimiser per block, bit for bit, with a third of the per-step overhead).
        fused_optimizer: use PyTorch's fused optimiser kernels where the device and dtype support them
            (same update up to float round-off; about 30% less time in the Θ pass of the MNIST MLP).
        beta: penalty ``β_t`` (batch) or ``ρ_t`` (online), scalar or one per constraint ``t < T``.
        zeta: step size ``ζ_t`` of the ``Z`` updates, scalar or one per constraint.
        z_steps: gradient steps per ``Z`` update.
        z_schedule: ``gauss-seidel`` (default: the reverse sweep ``t = T-1 … 1``, each ``Z_t`` update
            seeing the already updated ``Z_{t+1}``) or ``jacobi`` (every ``Z_t`` updated at once from
            the previous values: the schedule of the block-parallel trainer, where each block's rank
            updates its ``Z_t`` at the same time; :mod:`inferlearn.admm.parallel`).
        primal_steps: primal passes per outer iteration (batch) / Θ steps per mini-batch (online).
        primal_growth: extra primal passes per iteration (batch: ``p_k = primal_steps + ⌊g k⌋``).
        primal_schedule: ``"linear"`` (``primal_growth`` above) or ``"proposition"`` (batch): the primal
            accuracy schedule of Proposition 1, ``p_k = ⌈primal_steps · eta_decay^{−2k}⌉`` (see
            :meth:`BlockADMM.primal_steps_at`).
        formulation: ``"default"`` (the loss on ``f_T(Z_{T-1})``, no ``Z_T``) or ``"paper"`` (batch): the
            paper's literal Eq. (3.1), a decoupling variable ``Z_T`` on the output with ``J(Z_T, Y)`` and
            the constraint ``Z_T = f_T(Z_{T-1})`` (penalty ``β_T``, dual ``U_T``); ``beta`` and ``zeta`` then
            have ``T`` entries (``ζ_T`` is unused: the ``Z_T`` sub-problem is solved exactly).
        adaptive: use the adaptive penalty rule; ``eta0``, ``eta_decay``, ``penalty_growth`` (c),
            ``beta_max`` parametrise it.
        loss: ``cross-entropy``, ``quadratic`` (½‖out − onehot‖²) or ``mse`` (½‖out − y‖², regression).
        chunk_size: samples per chunk in the full-data ``Z`` and dual passes.
        nmf_sweeps: coordinate-descent sweeps per NNLS solve inside the iterations.
        nmf_init_iters: alternating-NNLS iterations that fit each NMF module before training.
        seed: seed of the mini-batch order (and online augmentation).
    """

    mode: str = "batch"
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    weight_decay: float = 0.0
    fused_optimizer: bool = True
    beta: float | list = 1.0
    zeta: float | list = 0.5
    z_steps: int = 1
    primal_steps: int = 1
    primal_growth: float = 0.0
    primal_schedule: str = "linear"
    formulation: str = "default"
    z_schedule: str = "gauss-seidel"
    adaptive: bool = False
    eta0: float = 1.0
    eta_decay: float = 0.9
    penalty_growth: float = 2.0
    beta_max: float = 1e4
    loss: str = "cross-entropy"
    chunk_size: int = 4096
    nmf_sweeps: int = 10
    nmf_init_iters: int = 30
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Unknown mode {self.mode!r}; choose one of {list(MODES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if self.z_schedule not in Z_SCHEDULES:
            raise ValueError(f"Unknown z_schedule {self.z_schedule!r}; choose one of {list(Z_SCHEDULES)}")
        if not (isinstance(self.loss, str) and self.loss in LOSSES) and not callable(self.loss):
            raise ValueError(f"Unknown loss {self.loss!r}; choose one of {list(LOSSES)} or pass a callable")
        if self.formulation not in FORMULATIONS:
            raise ValueError(f"Unknown formulation {self.formulation!r}; choose one of {list(FORMULATIONS)}")
        if self.formulation == "paper" and self.mode != "batch":
            raise ValueError("formulation 'paper' (a Z_T per sample) needs mode 'batch'")
        if self.formulation == "paper" and callable(self.loss):
            raise ValueError(f"formulation 'paper' needs a built-in loss ({list(LOSSES)}): the Z_T step solves "
                             "its sub-problem exactly")
        if self.primal_schedule not in PRIMAL_SCHEDULES:
            raise ValueError(f"Unknown primal schedule {self.primal_schedule!r}; choose one of {list(PRIMAL_SCHEDULES)}")
        if self.primal_schedule == "proposition" and self.mode != "batch":
            raise ValueError("primal schedule 'proposition' needs mode 'batch' (online primal steps are per mini-batch)")
        if self.primal_schedule == "proposition" and self.primal_growth:
            raise ValueError("primal schedule 'proposition' replaces primal_growth; set one of them")
        for name in ("batch_size", "z_steps", "primal_steps", "chunk_size", "nmf_sweeps"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"Invalid {name}: {v}")
        if not (isinstance(self.nmf_init_iters, int) and self.nmf_init_iters >= 0):
            raise ValueError(f"Invalid nmf_init_iters: {self.nmf_init_iters}")
        if not isinstance(self.fused_optimizer, bool):
            raise ValueError(f"Invalid fused_optimizer: {self.fused_optimizer}")
        for name in ("lr", "eta0", "beta_max"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"Invalid {name}: {v}")
        for name in ("momentum", "weight_decay", "primal_growth"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"Invalid {name}: {v}")
        check_momentum(self.optimizer, self.momentum)
        if not (0 < self.eta_decay <= 1):
            raise ValueError(f"Invalid eta_decay: {self.eta_decay}")
        if not (math.isfinite(self.penalty_growth) and self.penalty_growth > 1):
            raise ValueError(f"Invalid penalty_growth: {self.penalty_growth} (must be > 1)")
        # Scalars are checked here; per-constraint lists are checked against T in BlockADMM.
        for name in ("beta", "zeta"):
            vals = getattr(self, name)
            _per_list(vals, len(vals) if isinstance(vals, (list, tuple)) else 1, name)


def _loss_sum(loss, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of the per-sample loss (so gradients are per sample)."""
    if callable(loss):
        return loss(out, target) * out.shape[0]
    if loss == "cross-entropy":
        return F.cross_entropy(out, target.long(), reduction="sum")
    if loss == "quadratic":
        return 0.5 * (out - one_hot(target, out.shape[1], out.dtype)).pow(2).sum()
    return 0.5 * (out - target.to(out.dtype)).pow(2).sum()


def _sqnorm_rows(r: torch.Tensor) -> torch.Tensor:
    return r.reshape(r.shape[0], -1).pow(2).sum(dim=1)


class _Storage:
    """Allocates per-sample state in RAM or as memory-mapped files (``np.memmap``) on disk."""

    def __init__(self, memmap_dir: str | os.PathLike | None):
        self.dir = Path(memmap_dir) if memmap_dir is not None else None
        self._maps: list[np.memmap] = []

    def alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.dir is None:
            return torch.zeros(shape, dtype=dtype)
        self.dir.mkdir(parents=True, exist_ok=True)
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        mm = np.memmap(self.dir / f"{name}.f{np_dtype.itemsize * 8}", dtype=np_dtype, mode="w+", shape=shape)
        self._maps.append(mm)
        return torch.from_numpy(mm)

    def flush(self) -> None:
        for mm in self._maps:
            mm.flush()


class BlockADMM:
    """Stochastic block-ADMM trainer over blocks that are ordinary ``nn.Module``\\ s.

    Args:
        blocks: ``f_1 … f_T``; :class:`~inferlearn.nmf.NMF` modules may stand between ordinary blocks
            (batch mode only).
        config: :class:`ADMMConfig`.
        memmap_dir: if given, ``Z`` and ``U`` of the batch mode are memory-mapped files in this folder.

    Raises:
        ValueError: bad penalties or step sizes, an NMF module first, last or next to another, NMF
            modules in online mode.
    """

    def __init__(self, blocks: Sequence[nn.Module], config: ADMMConfig | None = None,
                 memmap_dir: str | os.PathLike | None = None):
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
        self.beta = _per_list(self.cfg.beta, self.n_z, "beta") if self.n_z else []
        self.zeta = _per_list(self.cfg.zeta, self.n_z, "zeta") if self.n_z else []
        self.lam = [0.0] * (T - 1)  # online scalar duals
        self.optimizer = self._make_optimizer([b for b, nmf in zip(self.blocks, self.is_nmf) if not nmf])
        self.generator = torch.Generator().manual_seed(self.cfg.seed)
        self.storage = _Storage(memmap_dir)
        self.Z: list[torch.Tensor] = []  # Z[t-1] = Z_t, t = 1 … n_z
        self.U: list[torch.Tensor] = []
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None
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

    def _chunks(self, n: int):
        cs = self.cfg.chunk_size
        for a in range(0, n, cs):
            yield a, min(a + cs, n)

    @staticmethod
    def _take(src: torch.Tensor, sl) -> torch.Tensor:
        # index_select is several times faster than advanced indexing for row gathers on CPU.
        return src[sl] if isinstance(sl, slice) else src.index_select(0, sl)

    def _get(self, t: int, sl) -> torch.Tensor:
        """``Z_t`` of the samples ``sl`` (a slice or an index tensor) on the compute device (``Z_0 = X``)."""
        src = self.X if t == 0 else self.Z[t - 1]
        return self._take(src, sl).to(self.device, self.dtype)

    def _u(self, t: int, sl) -> torch.Tensor:
        return self._take(self.U[t - 1], sl).to(self.device, self.dtype)

    def _put(self, store: torch.Tensor, sl, value: torch.Tensor) -> None:
        store[sl] = value.detach().to(store.device, store.dtype)

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
                Zt = self.storage.alloc(f"Z{t}", tuple(S.shape), self.dtype)
                Zt.copy_(S.to(Zt))
                Ut = self.storage.alloc(f"U{t}", tuple(prev.shape), self.dtype)
            else:
                first = blk(self._get(t - 1, slice(0, 1)))
                Zt = self.storage.alloc(f"Z{t}", (N, *first.shape[1:]), self.dtype)
                for a, b in self._chunks(N):
                    self._put(Zt, slice(a, b), blk(self._get(t - 1, slice(a, b))))
                Ut = self.storage.alloc(f"U{t}", tuple(Zt.shape), self.dtype)
            self.Z.append(Zt)
            self.U.append(Ut)
        self.storage.flush()

    def memory_bytes(self) -> dict:
        """Bytes held by the per-sample state ``Z`` and ``U`` and where it lives."""
        nbytes = sum(z.numel() * z.element_size() for z in self.Z + self.U if z is not None)
        return {"state_bytes": int(nbytes), "state_on_disk": self.storage.dir is not None}

    # ------------------------------------------------------------------ block terms
    def _constraint_residual(self, t: int, sl) -> torch.Tensor:
        """``r_t`` of the samples ``sl``: ``Z_t − f_t(Z_{t-1})``, or ``Z_{t-1} − S Mᵀ`` for an NMF block."""
        blk = self.blocks[t - 1]
        if self.is_nmf[t - 1]:
            prev = self._get(t - 1, sl)
            return prev - (self._get(t, sl) @ blk.M.T).reshape(prev.shape)
        return self._get(t, sl) - blk(self._get(t - 1, sl))

    def _terms(self) -> range:
        """The blocks whose terms of 𝓛 this trainer updates (all; a block-parallel rank: its own)."""
        return range(1, self.T + 1)

    def _constraints(self) -> list[int]:
        """The constraints ``t ≤ n_z`` whose ``Z_t``, ``U_t`` this trainer holds."""
        return [t for t in self._terms() if t <= self.n_z]

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """Sum per-block scalars over the ranks that hold the blocks (one process: themselves)."""
        return values

    def _theta_loss(self, idx: torch.Tensor) -> torch.Tensor:
        """Σ_t (block t's term of 𝓛 on the mini-batch ``idx``), batch mean; NMF blocks excluded."""
        total = 0.0
        terms = self._terms()
        inp = self._get(terms[0] - 1, idx)  # each Z_t is gathered once: input of block t+1 and target of block t
        for t in terms:
            nxt = self._get(t, idx) if t <= self.n_z else None
            if not self.is_nmf[t - 1]:
                out = self.blocks[t - 1](inp)
                if t > self.n_z:
                    total = total + _loss_sum(self.cfg.loss, out, self._take(self.Y, idx).to(out.device)) / len(idx)
                else:
                    # ‖z − f(z_prev) + u‖² = ‖f(z_prev) − (z + u)‖²: the target needs no graph, and
                    # one mse_loss node replaces sub/add/pow/sum/mean (fewer autograd ops per batch).
                    target = nxt + self._u(t, idx)
                    total = total + (0.5 * self.beta[t - 1] / len(idx)) * F.mse_loss(out, target, reduction="sum")
            inp = nxt
        return total

    def _next_term_sum(self, t: int, z: torch.Tensor, sl) -> torch.Tensor:
        """Σ over samples of the term of 𝓛 in which ``Z_t`` is the *input* (block ``t+1``'s term)."""
        nxt = self.blocks[t]
        out = nxt(z)
        if t + 1 > self.n_z:
            return _loss_sum(self.cfg.loss, out, self.Y[sl].to(out.device))
        r = self._get(t + 1, sl) - out + self._u(t + 1, sl)
        return 0.5 * self.beta[t] * _sqnorm_rows(r).sum()

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

    @torch.no_grad()
    def _nmf_basis_update(self) -> None:
        for t in range(1, self.T):
            if not self.is_nmf[t - 1]:
                continue
            blk = self.blocks[t - 1]
            n = blk.n_features
            G = torch.zeros(blk.rank, blk.rank, dtype=self.dtype, device=self.device)
            C = torch.zeros(n, blk.rank, dtype=self.dtype, device=self.device)
            for a, b in self._chunks(self.X.shape[0]):
                S = self._get(t, slice(a, b))
                target = (self._get(t - 1, slice(a, b)) + self._u(t, slice(a, b))).reshape(b - a, -1)
                G += S.T @ S
                C += target.T @ S
            M, _ = nnls_gram(G, C, blk.M, max_sweeps=self.cfg.nmf_sweeps, tol=blk.tol)
            blk.M.copy_(M)

    def _z_update(self, t: int) -> None:
        """Update ``Z_t`` for all samples on the two terms of 𝓛 that contain it."""
        N = self.X.shape[0]
        beta = self.beta[t - 1]
        blk = self.blocks[t - 1]
        for a, b in self._chunks(N):
            sl = slice(a, b)
            if t < self.T and self.is_nmf[t]:
                # Z_t feeds an NMF: both terms are quadratic, take the exact minimiser.
                gamma = self.beta[t]
                with torch.no_grad():
                    F_t = blk(self._get(t - 1, sl))
                    SM = (self._get(t + 1, sl) @ self.blocks[t].M.T).reshape(F_t.shape)
                    z = (beta * (F_t - self._u(t, sl)) + gamma * (SM - self._u(t + 1, sl))) / (beta + gamma)
                self._put(self.Z[t - 1], sl, z)
            elif self.is_nmf[t - 1]:
                self._put(self.Z[t - 1], sl, self._score_update(t, sl))
            else:  # (the paper's Z_T too: _z_steps solves its sub-problem exactly)
                with torch.no_grad():
                    target = blk(self._get(t - 1, sl)) - self._u(t, sl)
                self._put(self.Z[t - 1], sl, self._z_steps(t, sl, target))

    def _jacobi_z_update(self) -> None:
        """Update every ``Z_t`` at once from the previous values of its neighbours (``z_schedule='jacobi'``).

        Per chunk, all new ``Z_t`` are computed before any is stored, so each update sees the old
        ``Z_{t-1}``, ``Z_{t+1}`` — what the block-parallel trainer's ranks see when they update
        their own ``Z_t`` at the same time.
        """
        for a, b in self._chunks(self.X.shape[0]):
            sl = slice(a, b)
            new = []
            for t in range(1, self.n_z + 1):
                with torch.no_grad():
                    target = self.blocks[t - 1](self._get(t - 1, sl)) - self._u(t, sl)
                new.append(self._z_steps(t, sl, target))
            for t, z in enumerate(new, start=1):
                self._put(self.Z[t - 1], sl, z)
        self.storage.flush()

    def _z_steps(self, t: int, sl, target: torch.Tensor, next_grad: torch.Tensor | None = None) -> torch.Tensor:
        """``z_steps`` gradient steps on ``(β_t/2)‖z − target‖² + (block t+1's term)``, per sample.

        ``next_grad``, if given, is the gradient of block t+1's term at the stored ``Z_t`` (the first
        step then needs no forward of block t+1).
        """
        if t == self.T:
            return self._loss_prox(target, self._take(self.Y, sl).to(target.device))
        beta, zeta = self.beta[t - 1], self.zeta[t - 1]
        z = self._get(t, sl)
        for step in range(self.cfg.z_steps):
            if step == 0 and next_grad is not None:
                z = z - zeta * (beta * (z - target) + next_grad)
                continue
            z = z.detach().requires_grad_(True)
            obj = 0.5 * beta * (z - target).pow(2).sum() + self._next_term_sum(t, z, sl)
            (g,) = torch.autograd.grad(obj, z)
            z = z - zeta * g
        return z.detach()

    @torch.no_grad()
    def _loss_prox(self, a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The paper's ``Z_T`` step: ``argmin_z J(z, y) + (β_T/2)‖z − a‖²`` per sample, ``a = f_T(Z_{T-1}) − U_T``.

        Squared losses have the closed form ``(target + β a)/(1 + β)``. For cross-entropy the problem is
        ``β``-strongly convex with a ``(β + ½)``-Lipschitz gradient (the softmax Hessian is bounded by
        ``½ I``, Böhning 1992), so gradient descent with step ``1/(β + ½)`` contracts the error by
        ``q = 1/(1 + 2β)`` per step; it runs until ``q^n ≤ 1e-12`` (at most 1000 steps), an exact solve
        to round-off.
        """
        beta = self.beta[self.T - 1]
        loss = self.cfg.loss
        if loss in ("quadratic", "mse"):
            tgt = one_hot(y, a.shape[1], a.dtype) if loss == "quadratic" else y.to(a.dtype)
            return (tgt + beta * a) / (1 + beta)
        onehot = one_hot(y, a.shape[1], a.dtype)
        steps = min(1000, math.ceil(math.log(1e-12) / math.log(1 / (1 + 2 * beta))))
        lr = 1 / (beta + 0.5)
        z = a.clone()
        for _ in range(steps):
            z -= lr * (torch.softmax(z, dim=1) - onehot + beta * (z - a))
        return z

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
            sq[t - 1] += float(_sqnorm_rows(r).sum())
            zsq[t - 1] += float(_sqnorm_rows(z).sum())
            self._put(self.U[t - 1], sl, self._u(t, sl) + r)

        # Samples are independent and the weights fixed during the sweep, so each chunk can run the
        # whole reverse sweep t = T-1 … 1 (same result as sweeping t outermost). Within a chunk,
        # F_t = f_t(Z_{t-1}) is evaluated at the *old* Z_{t-1}, which is exactly where the first
        # z-step of Z_{t-1} (next in the sweep) needs block t's forward: keep its graph and
        # back-propagate the penalty's gradient through it instead of a second forward.
        for a, b in self._chunks(N):
            sl = slice(a, b)
            reuse = None  # (Z_t old with grad, f_{t+1}(Z_t old) with graph)
            for t in range(top, 0, -1):
                next_grad = None
                if reuse is not None:
                    zin, out = reuse
                    # d/d(out) of (β_{t+1}/2)‖Z_{t+1} − out + U_{t+1}‖² at the already updated Z_{t+1}
                    gout = -self.beta[t] * (self._get(t + 1, sl) - out.detach() + self._u(t + 1, sl))
                    (next_grad,) = torch.autograd.grad(out, zin, grad_outputs=gout)
                    reuse = None
                if t > 1:
                    zin = self._get(t - 1, sl).requires_grad_(True)
                    with torch.enable_grad():
                        out = self.blocks[t - 1](zin)
                    reuse, F_t = (zin, out), out.detach()
                else:
                    with torch.no_grad():
                        F_t = self.blocks[t - 1](self._get(t - 1, sl))
                z = self._z_steps(t, sl, F_t - self._u(t, sl), next_grad)
                self._put(self.Z[t - 1], sl, z)
                z = self._get(t, sl)  # as stored (dtype of the state)
                with torch.no_grad():
                    if t < top:
                        z_next = self._get(t + 1, sl)
                        dual(t + 1, sl, z_next - self.blocks[t](z), z_next)
                    if t == 1:
                        dual(1, sl, z - F_t, z)
        res = [math.sqrt(v / N) for v in sq]
        if not all(math.isfinite(r) for r in res):
            raise DivergenceError(f"non-finite constraint residuals {res}")
        self.storage.flush()
        return res, [math.sqrt(v / N) for v in zsq]

    def _score_update(self, t: int, sl) -> torch.Tensor:
        """NMF scores: prox-linear NNLS step ``S ← argmin_{S≥0} (γ/2)‖P + V − S Mᵀ‖² + ⟨g, S⟩ + ‖S − S⁰‖²/(2ζ)``.

        ``g`` is the gradient of the next block's term at ``S⁰`` (the term that makes the scores
        useful for the task); the problem is a strongly convex NNLS in Gram form.
        """
        blk = self.blocks[t - 1]
        gamma, zeta = self.beta[t - 1], self.zeta[t - 1]
        with torch.no_grad():
            target = (self._get(t - 1, sl) + self._u(t, sl)).reshape(sl.stop - sl.start, -1)
            MtM = blk.M.T @ blk.M
            G = gamma * MtM + torch.eye(blk.rank, dtype=MtM.dtype, device=MtM.device) / zeta
            base = gamma * target @ blk.M
        S = self._get(t, sl)
        for _ in range(self.cfg.z_steps):
            s = S.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self._next_term_sum(t, s, sl), s)
            with torch.no_grad():
                S, _ = nnls_gram(G, base + S / zeta - g, S, max_sweeps=self.cfg.nmf_sweeps)
        return S

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
            for a, b in self._chunks(N):
                sl = slice(a, b)
                r = self._constraint_residual(t, sl)
                sq[t - 1] += float(_sqnorm_rows(r).sum())
                zsq[t - 1] += float(_sqnorm_rows(self._get(t - 1 if self.is_nmf[t - 1] else t, sl)).sum())
                if update_now:
                    self._put(self.U[t - 1], sl, self._u(t, sl) + r)
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
                for a, b in self._chunks(N):
                    sl = slice(a, b)
                    self._put(self.U[t - 1], sl, self._u(t, sl) + self._constraint_residual(t, sl))
        self.storage.flush()
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
            self._nmf_basis_update()
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
    def _online_objective(self, zs: list[torch.Tensor], y: torch.Tensor, per_sample: bool):
        """``J + Σ_t (λ_t h_t + (ρ_t/2) h_t²)`` (batch mean), and the ``h_t``."""
        B = zs[0].shape[0]
        hs = []
        total = _loss_sum(self.cfg.loss, self.blocks[-1](zs[-1]), y) / B
        for t in range(1, self.T):
            h = _sqnorm_rows(zs[t] - self.blocks[t - 1](zs[t - 1])).mean()
            hs.append(h)
            total = total + self.lam[t - 1] * h + 0.5 * self.beta[t - 1] * h * h
        return (total * B if per_sample else total), hs

    def _online_z(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """``[x, z_1, …, z_{T-1}]``: a forward pass, then ``z_steps`` safeguarded gradient steps."""
        with torch.no_grad():
            zs = [x]
            for t in range(1, self.T):
                zs.append(self.blocks[t - 1](zs[-1]))
        for _ in range(self.cfg.z_steps if self.T > 1 else 0):
            vars_ = [z.detach().requires_grad_(True) for z in zs[1:]]
            obj, hs = self._online_objective([x, *vars_], y, per_sample=True)
            grads = torch.autograd.grad(obj, vars_)
            # Safeguarded step ζ/(1 + ζ c_t), c_t = 2(λ_t + ρ_t h_t) + 2(λ_{t+1} + ρ_{t+1} h_{t+1}) the
            # per-sample curvature of the two penalties containing z_t (taking f_{t+1} as 1-Lipschitz):
            # the duals only grow, and a plain step ζ diverges once ζ c_t > 2.
            curv = [2 * (lam + rho * float(h.detach())) for lam, rho, h in zip(self.lam, self.beta, hs)] + [0.0]
            steps = [zeta / (1 + zeta * (curv[i] + curv[i + 1])) for i, zeta in enumerate(self.zeta)]
            zs = [x] + [v.detach() - step * g for v, g, step in zip(vars_, grads, steps)]
        return zs

    def online_gradient(self, x: torch.Tensor, y: torch.Tensor, zs: list[torch.Tensor] | None = None):
        """Online mode: fill the blocks' ``.grad`` with the Θ gradient of ``J + Σ_t (λ_t h_t + (ρ_t/2) h_t²)``
        on the mini-batch ``(x, y)`` after the ``z`` steps (``zs`` from them, if already taken); no
        optimiser step. Returns the objective (a tensor) and the ``h_t``."""
        if zs is None:
            zs = self._online_z(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        obj, hs = self._online_objective(zs, y, per_sample=False)
        if not torch.isfinite(obj):
            raise DivergenceError(f"non-finite online objective {float(obj.detach())}")
        obj.backward()
        return obj, hs

    def _online_batch(self, x: torch.Tensor, y: torch.Tensor) -> float:
        zs = self._online_z(x, y)
        hs = []
        obj = torch.zeros(())
        for _ in range(self.cfg.primal_steps):
            obj, hs = self.online_gradient(x, y, zs)
            self.optimizer.step()
        h_vals = [float(h.detach()) for h in hs]
        k = self.iteration
        if self.cfg.adaptive and math.sqrt(sum(h_vals)) > self.cfg.eta0 * self.cfg.eta_decay ** k:
            self.beta = [min(b * self.cfg.penalty_growth, self.cfg.beta_max) for b in self.beta]
        else:
            self.lam = [lam + rho * h for lam, rho, h in zip(self.lam, self.beta, h_vals)]
        self._h_last = h_vals
        return float(obj.detach())

    def _online_epoch(self, X, Y, transform) -> dict:
        N = X.shape[0]
        perm = torch.randperm(N, generator=self.generator)
        bs = self.cfg.batch_size
        total, hsum, count = 0.0, [0.0] * (self.T - 1), 0
        for a in range(0, N, bs):
            idx = perm[a:a + bs]
            x = X[idx].to(self.device, self.dtype)
            if transform is not None:
                x = transform(x, self.generator)
            obj = self._online_batch(x, Y[idx].to(self.device))
            total += obj * len(idx)
            hsum = [s + h * len(idx) for s, h in zip(hsum, self._h_last)]
            count += len(idx)
        return {"admm_objective": total / count, **{f"h_{t + 1}": s / count for t, s in enumerate(hsum)},
                **{f"lambda_{t + 1}": lam for t, lam in enumerate(self.lam)},
                **{f"rho_{t + 1}": b for t, b in enumerate(self.beta)}}

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
            m = self._online_epoch(X, Y, transform)
        self.iteration += 1
        return m

    @torch.no_grad()
    def predict(self, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
        """Test time: a plain forward pass through the blocks (NMF modules project by NNLS)."""
        self.train_mode(False)
        outs = []
        for a in range(0, x.shape[0], batch):
            z = x[a:a + batch].to(self.device, self.dtype)
            for blk in self.blocks:
                z = blk(z)
            outs.append(z)
        return torch.cat(outs)

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: blocks, optimisers, Z, U, duals, penalties, RNG."""
        return {"iteration": self.iteration, "blocks": [b.state_dict() for b in self.blocks],
                "optimizer": self.optimizer.state_dict(),
                "Z": [z.clone() if z is not None else None for z in self.Z],
                "U": [u.clone() if u is not None else None for u in self.U], "beta": list(self.beta),
                "lam": list(self.lam), "zeta": list(self.zeta), "generator": self.generator.get_state(), "config": asdict(self.cfg)
                if not callable(self.cfg.loss) else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (batch mode: call :meth:`init_state` first for ``X, Y``)."""
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
        self.storage.flush()
        self.beta = [float(b) for b in state["beta"]]
        self.lam = [float(v) for v in state["lam"]]
        self.zeta = [float(v) for v in state.get("zeta", self.zeta)]
        self.generator.set_state(state["generator"])


def random_shift(max_shift: int, image_shape: Sequence[int]) -> Callable:
    """Augmentation for online block-ADMM: shift each image by up to ``max_shift`` pixels (zero fill).

    Returns ``transform(x, generator)``; ``x`` is ``(B, C, H, W)`` or flat ``(B, C·H·W)``.
    """
    C, H, W = image_shape

    def transform(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        flat = x.dim() == 2
        img = x.reshape(x.shape[0], C, H, W)
        shifts = torch.randint(-max_shift, max_shift + 1, (x.shape[0], 2), generator=generator)
        p = max_shift
        padded = F.pad(img, (p, p, p, p))
        # Gather each shifted window with one advanced-indexing call (no per-image Python loop).
        rows = p + shifts[:, :1] + torch.arange(H)  # (B, H)
        cols = p + shifts[:, 1:] + torch.arange(W)  # (B, W)
        b = torch.arange(x.shape[0])[:, None, None]
        out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        return out.reshape(x.shape) if flat else out

    return transform


# ---------------------------------------------------------------------- trainer with run folder
@dataclass
class RunData:
    """Training and test tensors for :func:`train_admm` (inputs already shaped for the first block)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    transform: Callable | None = None


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=1).cpu() == labels.cpu()).float().mean())


def evaluate(trainer: BlockADMM, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Loss (per-sample mean) and accuracy (classification losses) of the plain forward pass."""
    out = trainer.predict(x)
    with torch.no_grad():
        loss = float(_loss_sum(trainer.cfg.loss, out, y.to(out.device))) / x.shape[0]
    res = {"loss": loss}
    if trainer.cfg.loss != "mse" and not callable(trainer.cfg.loss):
        res["acc"] = _accuracy(out, y)
    return res


def train_admm(trainer: BlockADMM, data: RunData, epochs: int, out: str | os.PathLike | None = None,
               resume: bool = False, progress: bool = True, run_config: dict | None = None,
               eval_train_limit: int = 10000, log: Callable[[str], None] | None = None,
               tensorboard: str | None = None) -> list[dict]:
    """Train for ``epochs`` outer iterations into the run folder of ``inferlearn train``
    (:class:`~inferlearn.training.run_folder.RunFolder`).

    Writes ``config.json``, ``metrics.jsonl`` (the common fields, plus residuals and penalties) and an
    atomic checkpoint ``checkpoint.pt`` (blocks, optimisers, ``Z``, ``U``, duals, penalties, RNG and the
    metric history) after every epoch, and ``curves.png`` at the end. ``resume=True`` continues from the checkpoint exactly (same result as an
    uninterrupted run); metrics lines newer than the checkpoint are dropped.

    Args:
        log: called with one summary line per epoch (``None``: silent), as ``inferlearn train`` prints.
        tensorboard: a TensorBoard log folder (:mod:`inferlearn.training.tensorboard`), or ``None``.

    Raises:
        DivergenceError: non-finite losses or residuals, naming the epoch and the last good checkpoint.
    """
    if not (isinstance(epochs, int) and epochs >= 0):
        raise ValueError(f"Invalid epochs: {epochs}")
    main = getattr(trainer, "is_main", True)   # a block-parallel run: rank 0 writes, every rank computes
    # rank 0 locks the folder for the run's lifetime, probes it and removes leftover temporaries
    folder = RunFolder(out, writer=main) if out is not None else None
    try:
        if folder is not None and hasattr(trainer, "group"):
            trainer.group.barrier()   # rank 0 has probed the folder before the others read it
        return _train_admm(trainer, data, epochs, folder, main, resume, progress, run_config, eval_train_limit, log,
                           tensorboard)
    finally:
        if folder is not None:
            folder.close()


def _train_admm(trainer: BlockADMM, data: RunData, epochs: int, folder: RunFolder | None, main: bool, resume: bool,
                progress: bool, run_config: dict | None, eval_train_limit: int, log, tensorboard: str | None) -> list[dict]:
    if not main:
        log, progress, tensorboard = None, False, None
    if trainer.cfg.mode == "batch":
        trainer.init_state(data.train_x, data.train_y)
    history: list[dict] = []
    if folder is not None:
        if resume:
            ckpt = folder.load_checkpoint(note=log)
            if ckpt is None:
                raise FileNotFoundError(f"--resume: no checkpoint at {folder.checkpoint_path}")
            try:
                trainer.load_state_dict(ckpt["state"])
            except (RuntimeError, KeyError) as exc:   # blocks of another shape (ValueErrors already say what)
                detail = [line.strip() for line in str(exc).splitlines() if line.strip()]
                raise RunFolderError(f"{folder.checkpoint_path} does not fit this run's blocks "
                                     f"({(detail[1] if len(detail) > 1 else detail[0] if detail else type(exc).__name__)[:200]}); "
                                     "resume with the settings that wrote it, or start again with --overwrite") from None
            history = [m for m in ckpt["history"] if m["epoch"] <= trainer.iteration]
        if hasattr(trainer, "group"):
            trainer.group.barrier()   # every rank has read the checkpoint before rank 0 writes
    if folder is not None and main:
        folder.start({**(run_config or {}), "admm": asdict(trainer.cfg) if not callable(trainer.cfg.loss) else None,
                      "epochs": epochs, **trainer.memory_bytes()}, history)

    board = None
    if tensorboard:
        from ..training.tensorboard import TensorBoardLogger
        board = TensorBoardLogger(tensorboard, tuple(data.train_x.shape[1:]))

    def last_good(k):
        return f"{folder.checkpoint_path} (epoch {k - 1})" if folder is not None and folder.checkpoint_path.exists() else "none"

    try:
        from tqdm import tqdm
        bar = tqdm(total=epochs, initial=trainer.iteration, desc=f"block-ADMM ({trainer.cfg.mode})",
                   disable=not progress)
    except ImportError:  # tqdm is a dependency; this only guards minimal installs
        bar = None
    while trainer.iteration < epochs:
        k = trainer.iteration + 1
        t0 = time.perf_counter()
        try:
            if trainer.cfg.mode == "batch":
                m = trainer.epoch()
            else:
                m = trainer.epoch(data.train_x, data.train_y, data.transform)
        except DivergenceError as exc:
            raise DivergenceError(f"Block-ADMM diverged in epoch {k}: {exc}; last good checkpoint: {last_good(k)}") from exc
        dt = time.perf_counter() - t0
        n_tr = min(eval_train_limit, data.train_x.shape[0])
        tr = evaluate(trainer, data.train_x[:n_tr], data.train_y[:n_tr])
        te = evaluate(trainer, data.test_x, data.test_y)
        if not math.isfinite(tr["loss"]):
            raise DivergenceError(f"Block-ADMM diverged in epoch {k}: training loss {tr['loss']}; "
                                  f"last good checkpoint: {last_good(k)}")
        rec = {"epoch": k, "epoch_seconds": dt, **m, **{f"train_{a}": v for a, v in tr.items()},
               **{f"test_{a}": v for a, v in te.items()}, **trainer.memory_bytes()}
        history.append(rec)
        if folder is not None:
            state = trainer.state_dict()   # a collective in block-parallel runs
            if main:
                folder.record(rec, {"epoch": k, "state": state, "history": history})
        if board is not None:
            board.log_epoch(rec, [m for b in trainer.blocks for m in b.modules()])
        if log:
            line = (f"epoch {k:3d}  loss {tr['loss']:.4f}  train {tr.get('acc', float('nan')):.4f}  "
                    f"test {te.get('acc', float('nan')):.4f}  {dt:.1f}s")
            (bar.write if bar is not None and not bar.disable else log)(line)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{tr['loss']:.4f}", test_acc=f"{te.get('acc', float('nan')):.4f}")
    if bar is not None:
        bar.close()
    if board is not None:
        board.close()
    if folder is not None and main:
        folder.plot(history, f"block-ADMM ({trainer.cfg.mode})", title="block-ADMM")
    if hasattr(trainer, "group"):
        trainer.group.barrier()   # nobody tears the group down before rank 0 has written everything
    return history
