"""The process group of a data-parallel run: who am I, which rows are mine, and gradient averaging.

Every rule fills ``.grad`` with the gradient of a **batch-mean** objective (the rule contract,
:mod:`inferlearn.rules.base`). With the global batch ``B`` split into shards ``B_r`` (rank ``r``
holds ``n_r`` rows), the global batch-mean gradient is the shard-size-weighted sum

    g = Σ_r (n_r / B) · g_r,

so each rank scales its shard gradient by ``n_r / B`` and one all-reduce (sum) gives every rank
``g`` — the gradient one process would have computed on the whole batch, to floating-point
rounding (and, for iterative rules, to their solver tolerance: each shard's inference stops when
*its* residual is below ``tol``). The batch loss travels in the same buffer.

Gradients are flattened into buckets of at most ``bucket_bytes`` and each bucket's all-reduce is
started asynchronously as soon as it is packed, so packing bucket ``k + 1`` overlaps the
communication of bucket ``k``. Overlap with the *rule's* compute does not pay here: an inference
rule knows its gradients only after its inference has converged, all at once.

The group is ``gloo`` on CPU and ``nccl`` on CUDA, created from the environment that
``torchrun`` / ``torch.distributed.run`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), with a timeout: a rank that dies or hangs makes the others fail within it
(:class:`~inferlearn.errors.DistributedError`) instead of waiting forever.
"""
from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DistributedError

DEFAULT_TIMEOUT_S = 120.0
BUCKET_BYTES = 4 * 2 ** 20


@dataclass
class Group:
    """This process's place in a data-parallel run (``world == 1``: a plain single-process run).

    Attributes:
        rank: this process's index, 0 … world − 1; rank 0 writes the run folder.
        world: number of processes.
        timeout_s: how long a collective waits for the other ranks before failing.
    """

    rank: int = 0
    world: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    bucket_bytes: int = BUCKET_BYTES

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    # ---- sharding -------------------------------------------------------------------------------
    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of ``rows`` (sizes differ by at most one; may be empty)."""
        if self.world == 1:
            return rows
        return torch.tensor_split(rows, self.world)[self.rank]

    def shard_range(self, n: int) -> tuple[int, int]:
        """``[start, stop)`` of this rank's contiguous share of ``n`` rows (evaluation)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    # ---- collectives ----------------------------------------------------------------------------
    def average_gradients(self, params: Sequence[torch.nn.Parameter], n_local: int, n_global: int,
                          loss: float) -> float:
        """Replace each ``p.grad`` (a shard's batch-mean gradient) by the global batch-mean gradient.

        Returns the global batch-mean loss (reduced in the gradients' dtype, with the last bucket). A
        rank with an empty shard contributes zeros. All ranks must pass the same parameters in the same
        order (they do: the same model).
        """
        if self.world == 1:
            return loss
        weight = n_local / n_global
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        dtype = grads[0].dtype
        buckets = _buckets(grads, self.bucket_bytes)
        pending = []
        for i, bucket in enumerate(buckets):
            parts = [g.reshape(-1).to(dtype) for g in bucket]
            if i == len(buckets) - 1:   # the loss rides in the last bucket: one collective per small model
                parts.append(torch.tensor([loss], dtype=dtype, device=grads[0].device))
            flat = torch.cat(parts)
            if n_local:
                flat.mul_(weight)
            else:
                flat.zero_()
            pending.append((bucket, flat, self._all_reduce(flat, async_op=True)))
        for bucket, flat, work in pending:
            self._wait(work)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        return float(pending[-1][1][-1])

    def share_sample_state(self, rule, rows: torch.Tensor) -> None:
        """After a step on the global batch ``rows``, give every rank every shard's per-sample rule state.

        Each rank packs its shard's rows (:meth:`~inferlearn.rules.base.PerSampleRule.sample_state`), pads them to
        the largest shard, and one all-gather hands them to all; each rank stores the others' rows.
        """
        shards = torch.tensor_split(rows, self.world)
        mine = rule.sample_state(shards[self.rank]) if len(shards[self.rank]) else None
        width = torch.tensor([0 if mine is None else mine.shape[1]], dtype=torch.float64)
        self._wait(self._all_reduce(width, async_op=True, op=dist.ReduceOp.MAX))   # 0 until a rank holds state
        width = int(width)
        if width == 0:
            return
        size = max(len(s) for s in shards)
        buf = torch.zeros(size, width, dtype=torch.float64)
        if mine is not None:
            buf[:mine.shape[0]] = mine.to(torch.float64)
        parts = [torch.empty_like(buf) for _ in range(self.world)]
        try:
            work = dist.all_gather(parts, buf, async_op=True)
        except RuntimeError as exc:
            raise self._failure(exc) from None
        self._wait(work)
        for r, (shard, part) in enumerate(zip(shards, parts)):
            if r != self.rank and len(shard):
                rule.set_sample_state(shard, part[:len(shard)])

    def all_sum(self, values: Iterable[float]) -> list[float]:
        """Sum a few scalars over the ranks (float64)."""
        values = list(values)
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        self._wait(self._all_reduce(t, async_op=True))
        return t.tolist()

    def barrier(self) -> None:
        if self.world > 1:
            self.all_sum([0.0])

    def close(self) -> None:
        """Wait until every rank is here (the group itself is left to the process's exit).

        ``destroy_process_group`` races with a peer that has already exited: gloo's connection
        threads then see the closed socket and abort the process. Launched processes therefore end
        with ``os._exit`` after a final barrier (see :func:`inferlearn.cli.main`).
        """
        self.barrier()

    def _device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def _all_reduce(self, t: torch.Tensor, async_op: bool, op=dist.ReduceOp.SUM):
        try:
            return dist.all_reduce(t, op=op, async_op=async_op)
        except RuntimeError as exc:
            raise self._failure(exc) from None

    def _wait(self, work) -> None:
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: Exception) -> DistributedError:
        return DistributedError(
            f"rank {self.rank} of {self.world}: another process died, or did not answer within {self.timeout_s:g} s "
            f"({str(exc).splitlines()[0][:200]})")


def _buckets(tensors: list[torch.Tensor], cap: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of tensors of at most ``cap`` bytes each (a larger tensor is a bucket alone)."""
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > cap:
            out.append([])
            size = 0
        out[-1].append(t)
        size += nbytes
    return out


def world_from_env() -> int:
    """``WORLD_SIZE`` as set by ``torchrun`` (1 outside a launched run)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"Invalid WORLD_SIZE={os.environ['WORLD_SIZE']!r} in the environment") from None


def join(device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> Group:
    """Join the process group that ``torchrun`` describes in the environment (or a 1-process group).

    ``gloo`` on CPU, ``nccl`` on CUDA (each rank on GPU ``LOCAL_RANK``).
    """
    world = world_from_env()
    if world <= 1:
        return Group(timeout_s=timeout_s)
    if not dist.is_available():
        raise DistributedError("this PyTorch build has no torch.distributed; run with --nproc 1")
    if not timeout_s > 0:
        raise ValueError(f"Invalid distributed timeout {timeout_s}: must be > 0 seconds")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(f"could not join the process group ({str(exc).splitlines()[0][:200]})") from None
    return Group(rank=dist.get_rank(), world=dist.get_world_size(), timeout_s=timeout_s)
