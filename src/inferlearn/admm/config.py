"""The hyper-parameters of block-ADMM (:class:`ADMMConfig`, frozen and validated on construction) and the
per-sample losses of its terms."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..losses import one_hot
from ..training.config import check_momentum

ADMM_MODES = ("batch", "online")
FORMULATIONS = ("default", "paper")
PRIMAL_SCHEDULES = ("linear", "proposition")
ADMM_LOSSES = ("cross-entropy", "quadratic", "mse")
ADMM_OPTIMIZERS = ("sgd", "adam")
Z_SCHEDULES = ("gauss-seidel", "jacobi")


def per_list(value, n: int, name: str) -> list[float]:
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
    formulation: str = "default"
    loss: str = "cross-entropy"
    # the Θ step: mini-batches and the blocks' optimiser
    batch_size: int = 128
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    weight_decay: float = 0.0
    fused_optimizer: bool = True
    primal_steps: int = 1
    primal_growth: float = 0.0
    primal_schedule: str = "linear"
    # the augmented Lagrangian's penalties and the Z step
    beta: float | list = 1.0
    zeta: float | list = 0.5
    z_steps: int = 1
    z_schedule: str = "gauss-seidel"
    # the adaptive penalty rule
    adaptive: bool = False
    eta0: float = 1.0
    eta_decay: float = 0.9
    penalty_growth: float = 2.0
    beta_max: float = 1e4
    # passes over the data, NMF blocks, the mini-batch order
    chunk_size: int = 4096
    nmf_sweeps: int = 10
    nmf_init_iters: int = 30
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ADMM_MODES:
            raise ValueError(f"Unknown mode {self.mode!r}; choose one of {list(ADMM_MODES)}")
        if self.optimizer not in ADMM_OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {self.optimizer!r}; choose one of {list(ADMM_OPTIMIZERS)}")
        if self.z_schedule not in Z_SCHEDULES:
            raise ValueError(f"Unknown z_schedule {self.z_schedule!r}; choose one of {list(Z_SCHEDULES)}")
        if not (isinstance(self.loss, str) and self.loss in ADMM_LOSSES) and not callable(self.loss):
            raise ValueError(f"Unknown loss {self.loss!r}; choose one of {list(ADMM_LOSSES)} or pass a callable")
        if self.formulation not in FORMULATIONS:
            raise ValueError(f"Unknown formulation {self.formulation!r}; choose one of {list(FORMULATIONS)}")
        if self.formulation == "paper" and self.mode != "batch":
            raise ValueError("formulation 'paper' (a Z_T per sample) needs mode 'batch'")
        if self.formulation == "paper" and callable(self.loss):
            raise ValueError(f"formulation 'paper' needs a built-in loss ({list(ADMM_LOSSES)}): the Z_T step solves "
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
            per_list(vals, len(vals) if isinstance(vals, (list, tuple)) else 1, name)


def loss_sum(loss, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of the per-sample loss (so gradients are per sample)."""
    if callable(loss):
        return loss(out, target) * out.shape[0]
    if loss == "cross-entropy":
        return F.cross_entropy(out, target.long(), reduction="sum")
    if loss == "quadratic":
        return 0.5 * (out - one_hot(target, out.shape[1], out.dtype)).pow(2).sum()
    return 0.5 * (out - target.to(out.dtype)).pow(2).sum()


def sqnorm_rows(r: torch.Tensor) -> torch.Tensor:
    return r.reshape(r.shape[0], -1).pow(2).sum(dim=1)


@torch.no_grad()
def loss_prox(loss, a: torch.Tensor, y: torch.Tensor, beta: float) -> torch.Tensor:
    """The paper's ``Z_T`` step: ``argmin_z J(z, y) + (β_T/2)‖z − a‖²`` per sample, ``a = f_T(Z_{T-1}) − U_T``
    (``loss`` one of :data:`ADMM_LOSSES`, ``beta`` the penalty ``β_T``).

    Squared losses have the closed form ``(target + β a)/(1 + β)``. For cross-entropy the problem is
    ``β``-strongly convex with a ``(β + ½)``-Lipschitz gradient (the softmax Hessian is bounded by
    ``½ I``, Böhning 1992), so gradient descent with step ``1/(β + ½)`` contracts the error by
    ``q = 1/(1 + 2β)`` per step; it runs until ``q^n ≤ 1e-12`` (at most 1000 steps), an exact solve
    to round-off.
    """
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
