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
from .trainer import ADMMConfig, BlockADMM


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


class BlockParallelADMM(BlockADMM):
    """:class:`~inferlearn.admm.trainer.BlockADMM` (batch mode, Jacobi ``Z`` schedule) split over ranks.

    Every rank builds the same blocks from the same seed; each trains only its own. Metrics, residuals
    and penalties are the same on every rank.

    Raises:
        ValueError: online mode, ``z_steps ≠ 1``, NMF modules, a Gauss–Seidel schedule, more ranks
            than blocks, or memory-mapped state.
    """

    def __init__(self, blocks: Sequence[nn.Module], config: ADMMConfig, group: Group):
        check_block_parallel(config, blocks, group.world)
        super().__init__(blocks, config)
        self.group = group
        costs = [sum(p.numel() for p in b.parameters()) for b in self.blocks]
        self.owners = block_owners(self.T, group.world, costs)
        self.mine = [t for t in range(1, self.T + 1) if self.owners[t - 1] == group.rank]
        self.first, self.last = self.mine[0], self.mine[-1]

    @property
    def is_main(self) -> bool:
        return self.group.is_main

    # ---- the hooks of BlockADMM -------------------------------------------------------------------
    def _terms(self) -> range:
        return range(self.first, self.last + 1)

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        return self.group.all_sum(values)

    # ---- state ----------------------------------------------------------------------------------
    def _held(self) -> set[int]:
        """Indices ``t`` of the ``Z_t`` this rank keeps: its own and its input replica ``Z_{first-1}``."""
        return {t for t in range(max(1, self.first - 1), self.last + 1) if t < self.T}

    @torch.no_grad()
    def init_state(self, X: torch.Tensor, Y: torch.Tensor) -> None:
        """``Z`` from a forward pass (every rank holds the same initial weights), then only this rank's
        ``Z_t``, ``U_t`` and its input replica are kept."""
        super().init_state(X, Y)
        self._drop_foreign()

    def _drop_foreign(self) -> None:
        held, own = self._held(), set(self._constraints())
        self.Z = [z if t in held else None for t, z in enumerate(self.Z, start=1)]
        self.U = [u if t in own else None for t, u in enumerate(self.U, start=1)]

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

    def _jacobi_z_update(self) -> None:
        """Every rank updates its ``Z_t`` at once; boundary gradients go down, boundary ``Z`` up."""
        rank, T = self.group.rank, self.T
        below = rank - 1 if self.first > 1 else None   # holds Z_{first-1}, whose step needs our term's gradient
        above = rank + 1 if self.last < T else None    # holds block last+1, whose term contains our Z_last
        for a, b in self._chunks(self.X.shape[0]):
            sl = slice(a, b)
            g_down = None
            if below is not None:   # ∇_{Z_{first-1}} of our first block's term, at the previous values
                zin = self._get(self.first - 1, sl).requires_grad_(True)
                with torch.enable_grad():
                    (g_down,) = torch.autograd.grad(self._next_term_sum(self.first - 1, zin, sl), zin)
            g_up = self._exchange(g_down, below, self._get(self.last, sl) if above is not None else None, above)
            new = {}
            for t in self._constraints():
                with torch.no_grad():
                    target = self.blocks[t - 1](self._get(t - 1, sl)) - self._u(t, sl)
                new[t] = self._z_steps(t, sl, target, next_grad=g_up if t == self.last else None)
            for t, z in new.items():
                self._put(self.Z[t - 1], sl, z)
            # the new Z_last goes up as the next rank's input replica; ours comes from below
            fresh = self._exchange(self._get(self.last, sl) if above is not None else None, above,
                                   self._get(self.first - 1, sl) if below is not None else None, below)
            if fresh is not None:
                self._put(self.Z[self.first - 2], sl, fresh)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
        """The forward pass as a pipeline: each rank applies its blocks; every rank gets the output."""
        self.train_mode(False)
        outs = []
        group = self.group
        for a in range(0, x.shape[0], batch):
            z = x[a:a + batch].to(self.device, self.dtype)
            if self.first > 1:
                z = self._recv_object(group.rank - 1)
            for t in self.mine:
                z = self.blocks[t - 1](z)
            if self.last < self.T:
                self._send_object(z, group.rank + 1)
            outs.append(z if self.last == self.T else None)
        out = torch.cat(outs) if self.last == self.T else None
        box = [out]
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
    def state_dict(self) -> dict:
        """The one-process :meth:`BlockADMM.state_dict`, assembled on rank 0 (other ranks get ``{}``).

        A collective: every rank must call it.
        """
        opt = self.optimizer.state_dict()
        # the optimiser state of this rank's own blocks only: after a resume every rank also holds the
        # loaded (and since then stale) state of the other ranks' blocks, which must not win the merge
        own = {i for t in self.mine for i in opt["param_groups"][t - 1]["params"]}
        mine = {"blocks": {t: self.blocks[t - 1].state_dict() for t in self.mine},
                "Z": {t: self.Z[t - 1] for t in self._constraints()}, "U": {t: self.U[t - 1] for t in self._constraints()},
                "optimizer_state": {i: s for i, s in opt["state"].items() if i in own}}
        parts = [None] * self.group.world
        self._guard(lambda: dist.all_gather_object(parts, mine))
        if not self.is_main:
            return {}
        state = super().state_dict()   # this rank's view; the others' parts fill the rest
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

    def load_state_dict(self, state: dict) -> None:
        """Load a one-process checkpoint (every rank reads the whole of it, then keeps its share)."""
        held = self._held()
        self.Z = [z if z is not None else torch.zeros(0) for z in self.Z]
        self.U = [u if u is not None else torch.zeros(0) for u in self.U]
        full = dict(state, Z=[z if t in held else torch.zeros(0) for t, z in enumerate(state["Z"], start=1)],
                    U=[u if t in set(self._constraints()) else torch.zeros(0) for t, u in enumerate(state["U"], start=1)])
        super().load_state_dict(full)
        self._drop_foreign()

