"""Block-parallel block-ADMM: each rank holds a contiguous run of blocks and only their state.

Ranks ``0 … P-1`` own contiguous runs of blocks (:func:`block_owners`, balancing the blocks' parameter
counts; with ``P = T`` one block each). Rank ``r`` with blocks ``a … b`` keeps their parameters, their ``Z_t, U_t`` (``a ≤ t ≤ b``,
``t < T``) and a replica of its input ``Z_{a-1}`` (``X`` on rank 0, ``Y`` on the last rank). One
batch outer iteration (Algorithm 1 of Khorram et al.) then runs as

1. **Θ pass** — every rank steps its own blocks on the same mini-batches (the same seeded
   permutation on every rank): no communication.
2. **Z update, Jacobi** — every ``Z_t`` moves at once from the previous values of its neighbours
   (``z_schedule='jacobi'`` of :class:`~inferlearn.admm.trainer.BlockADMM`, which the one-process
   trainer also offers, so results compare like with like). The term of block ``a`` is the only
   one of rank ``r`` that contains the previous rank's ``Z_{a-1}``: rank ``r`` sends
   ``∇_{Z_{a-1}}`` of that term to rank ``r-1``, which takes its ``Z_{a-1}`` step with it, then
   sends the new ``Z_{a-1}`` back up as rank ``r``'s input replica.
3. **Dual update** — local (``U_t ← U_t + Z_t − f_t(Z_{t-1})``); the residual norms (and the
   adaptive penalty's decision) are summed over the ranks.

So ranks exchange only boundary variables: per chunk of samples one gradient and one ``Z`` of the
boundary width each way, never parameters. Test-time prediction is a pipeline (each rank applies its
blocks and passes the activations on). A checkpoint gathers everything on rank 0 in the one-process
format, so a run resumes with any number of processes, including one.

Limits (clear errors): batch mode, ``z_steps = 1`` (a further step would need a round trip per
step), no NMF modules, at most one rank per block.
"""
from __future__ import annotations

import datetime
import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import Group
from ..errors import DistributedError
from .nmf import NMF
from .config import ADMMConfig
from .placement import LocalBlocks
from .trainer import BlockADMM


def block_owners(T: int, world: int, costs: Sequence[float] | None = None) -> list[int]:
    """The rank of each block ``1 … T``: contiguous runs, one per rank.

    Without ``costs`` the runs' lengths differ by at most one; with them (e.g. each block's parameter
    count, which sets its share of the Θ pass and the Z update) the split minimises the largest run's
    total cost, so that no rank waits long for the busiest (ties keep earlier ranks lighter).
    """
    if not 1 <= world <= T:
        raise ValueError(f"--nproc {world} is more than the {T} blocks of this network; use at most {T} processes "
                         "(one block per process), or split the network into more blocks (--split)")
    if costs is None:
        base, extra = divmod(T, world)
        owners = []
        for r in range(world):
            owners += [r] * (base + (1 if r < extra else 0))
        return owners
    best = None
    for cuts in itertools.combinations(range(1, T), world - 1):
        bounds = [0, *cuts, T]
        load = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
        if best is None or load < best[0]:
            best = (load, bounds)
    bounds = best[1]
    return [r for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) for _ in range(a, b)]


def check_block_parallel(config: ADMMConfig, blocks: Sequence[nn.Module], world: int) -> None:
    """Raise ``ValueError`` (one line, with the fix) for a run the block-parallel trainer cannot do."""
    if config.mode != "batch":
        raise ValueError("Block-parallel ADMM runs the batch mode (Algorithm 1); for online block-ADMM use --nproc 1")
    if config.formulation != "default":
        raise ValueError("Block-parallel ADMM takes the default formulation (no Z_T); use --nproc 1 for "
                         "--formulation paper")
    if config.z_steps != 1:
        raise ValueError(f"Block-parallel ADMM takes one Z step per update (got --z-steps {config.z_steps}); "
                         "use --z-steps 1, or --nproc 1")
    if config.z_schedule != "jacobi":
        raise ValueError("Block-parallel ADMM updates every Z_t at once: use --z-schedule jacobi (the same "
                         "schedule in one process gives the same result)")
    if any(isinstance(b, NMF) for b in blocks):
        raise ValueError("Block-parallel ADMM does not take NMF modules; use --nproc 1")
    block_owners(len(blocks), world)


class RankBlocks(LocalBlocks):
    """The placement of contiguous runs of blocks over the ranks of ``group`` (module docstring): every rank builds
    the same blocks from the same seed and trains only its own; metrics, residuals and penalties are the same on
    every rank.

    Args:
        group: the process group.
        blocks: the blocks (their parameter counts balance the runs, :func:`block_owners`).
    """

    def __init__(self, group: Group, blocks: Sequence[nn.Module]):
        self.group = group
        costs = [sum(p.numel() for p in b.parameters()) for b in blocks]
        self.T = len(blocks)
        self.owners = block_owners(self.T, group.world, costs)
        self.mine = [t for t in range(1, self.T + 1) if self.owners[t - 1] == group.rank]
        self.first, self.last = self.mine[0], self.mine[-1]

    @property
    def is_main(self) -> bool:
        return self.group.is_main

    def attach(self, trainer) -> None:
        check_block_parallel(trainer.cfg, trainer.blocks, self.group.world)

    def terms(self, T: int) -> range:
        return range(self.first, self.last + 1)

    def sum(self, values: list[float]) -> list[float]:
        return self.group.all_sum(values)

    def barrier(self) -> None:
        self.group.barrier()

    # ---- state ----------------------------------------------------------------------------------
    def held(self) -> set[int]:
        """Indices ``t`` of the ``Z_t`` this rank keeps: its own and its input replica ``Z_{first-1}``."""
        return {t for t in range(max(1, self.first - 1), self.last + 1) if t < self.T}

    def own(self, trainer) -> set[int]:
        """The constraints whose ``Z_t``, ``U_t`` this rank updates."""
        return {t for t in self.terms(self.T) if t <= trainer.n_z}

    def keep_own_state(self, trainer) -> None:
        """Keep only this rank's ``Z_t``, ``U_t`` and its input replica (every rank built them all from the same
        forward pass)."""
        held, own = self.held(), self.own(trainer)
        trainer.Z = [z if t in held else None for t, z in enumerate(trainer.Z, start=1)]
        trainer.U = [u if t in own else None for t, u in enumerate(trainer.U, start=1)]

    # ---- communication --------------------------------------------------------------------------
    def _exchange(self, send: torch.Tensor | None, to: int | None, recv_like: torch.Tensor | None,
                  frm: int | None) -> torch.Tensor | None:
        """Send ``send`` to rank ``to`` and receive a tensor shaped like ``recv_like`` from ``frm``."""
        works, buf = [], None
        try:
            if frm is not None:
                buf = torch.empty_like(recv_like)
                works.append(dist.irecv(buf, src=frm))
            if to is not None:
                works.append(dist.isend(send.contiguous(), dst=to))
            for w in works:
                w.wait(datetime.timedelta(seconds=self.group.timeout_s))
        except RuntimeError as exc:
            raise DistributedError(f"rank {self.group.rank}: a neighbouring block's process died, or did not answer "
                                   f"within {self.group.timeout_s:g} s ({str(exc).splitlines()[0][:200]})") from None
        return buf

    def _below(self) -> int | None:
        """The rank holding ``Z_{first-1}``, whose step needs our first term's gradient."""
        return self.group.rank - 1 if self.first > 1 else None

    def _above(self) -> int | None:
        """The rank holding block ``last + 1``, whose term contains our ``Z_last``."""
        return self.group.rank + 1 if self.last < self.T else None

    def boundary_gradient(self, trainer, sl) -> torch.Tensor | None:
        """Send ``∇_{Z_{first-1}}`` of our first block's term (at the previous values) down, receive the one of the
        next rank's first term at our ``Z_last`` from above."""
        below, above = self._below(), self._above()
        g_down = None
        if below is not None:
            zin = trainer.state.get(self.first - 1, sl).requires_grad_(True)
            with torch.enable_grad():
                (g_down,) = torch.autograd.grad(trainer.next_term_sum(self.first - 1, zin, sl), zin)
        return self._exchange(g_down, below, trainer.state.get(self.last, sl) if above is not None else None, above)

    def boundary_values(self, trainer, sl) -> None:
        """The new ``Z_last`` goes up as the next rank's input replica; ours comes from below."""
        below, above = self._below(), self._above()
        fresh = self._exchange(trainer.state.get(self.last, sl) if above is not None else None, above,
                               trainer.state.get(self.first - 1, sl) if below is not None else None, below)
        if fresh is not None:
            trainer.state.put(trainer.Z[self.first - 2], sl, fresh)

    def chunk_input(self, z: torch.Tensor) -> torch.Tensor:
        return self._recv_object(self.group.rank - 1) if self.first > 1 else z

    def chunk_output(self, z: torch.Tensor, T: int) -> torch.Tensor | None:
        if self.last < T:
            self._send_object(z, self.group.rank + 1)
            return None
        return z

    def output(self, outs: list) -> torch.Tensor:
        box = [torch.cat(outs) if self.last == self.T else None]
        self._broadcast_object(box, src=self.owners[-1])
        return box[0]

    def _send_object(self, obj, dst: int) -> None:
        self._guard(lambda: dist.send_object_list([obj], dst=dst))

    def _recv_object(self, src: int):
        box = [None]
        self._guard(lambda: dist.recv_object_list(box, src=src))
        return box[0]

    def _broadcast_object(self, box: list, src: int) -> None:
        self._guard(lambda: dist.broadcast_object_list(box, src=src))

    def _guard(self, fn) -> None:
        try:
            fn()
        except RuntimeError as exc:
            raise DistributedError(f"rank {self.group.rank}: another process died, or did not answer within "
                                   f"{self.group.timeout_s:g} s ({str(exc).splitlines()[0][:200]})") from None

    # ---- checkpoints: everything gathered on rank 0, in the one-process format -------------------
    def state_dict(self, trainer, local: dict) -> dict:
        """The one-process state, assembled on rank 0 from every rank's share (other ranks get ``{}``)."""
        opt = trainer.optimizer.state_dict()
        # the optimiser state of this rank's own blocks only: after a resume every rank also holds the
        # loaded (and since then stale) state of the other ranks' blocks, which must not win the merge
        own = {i for t in self.mine for i in opt["param_groups"][t - 1]["params"]}
        cons = sorted(self.own(trainer))
        mine = {"blocks": {t: trainer.blocks[t - 1].state_dict() for t in self.mine},
                "Z": {t: trainer.Z[t - 1] for t in cons}, "U": {t: trainer.U[t - 1] for t in cons},
                "optimizer_state": {i: s for i, s in opt["state"].items() if i in own}}
        parts = [None] * self.group.world
        self._guard(lambda: dist.all_gather_object(parts, mine))
        if not self.is_main:
            return {}
        state = local   # this rank's view; the others' parts fill the rest
        for part in parts:
            for t, s in part["blocks"].items():
                state["blocks"][t - 1] = s
        # merged by ownership: parameter i's state comes from the rank that owns its block (group t - 1)
        merged = {}
        for t, rank in enumerate(self.owners, start=1):
            for i in state["optimizer"]["param_groups"][t - 1]["params"]:
                if i in parts[rank]["optimizer_state"]:
                    merged[i] = parts[rank]["optimizer_state"][i]
        state["optimizer"]["state"] = merged
        state["Z"] = [next(p["Z"][t] for p in parts if t in p["Z"]).clone() for t in range(1, self.T)]
        state["U"] = [next(p["U"][t] for p in parts if t in p["U"]).clone() for t in range(1, self.T)]
        return state

    def load_state_dict(self, trainer, state: dict) -> None:
        """Load a one-process checkpoint: every rank reads the whole of it, then keeps its share."""
        held, own = self.held(), self.own(trainer)
        trainer.Z = [z if z is not None else torch.zeros(0) for z in trainer.Z]
        trainer.U = [u if u is not None else torch.zeros(0) for u in trainer.U]
        full = dict(state, Z=[z if t in held else torch.zeros(0) for t, z in enumerate(state["Z"], start=1)],
                    U=[u if t in own else torch.zeros(0) for t, u in enumerate(state["U"], start=1)])
        trainer.load_local_state_dict(full)
        self.keep_own_state(trainer)


class BlockParallelADMM(BlockADMM):
    """:class:`~inferlearn.admm.trainer.BlockADMM` (batch mode, Jacobi ``Z`` schedule) over the ranks of ``group``: the
    trainer with the :class:`RankBlocks` placement (a constructor; the algorithm is the trainer's).

    Raises:
        ValueError: online mode, ``z_steps ≠ 1``, NMF modules, a Gauss–Seidel schedule, more ranks
            than blocks, or memory-mapped state.
    """

    def __init__(self, blocks: Sequence[nn.Module], config: ADMMConfig, group: Group):
        check_block_parallel(config, blocks, group.world)
        super().__init__(blocks, config, placement=RankBlocks(group, blocks))
