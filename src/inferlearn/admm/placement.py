"""Where the blocks of a :class:`~inferlearn.admm.trainer.BlockADMM` run: an object the trainer holds and asks.

:class:`LocalBlocks` (the default) runs every block in this process. :class:`~inferlearn.admm.parallel.RankBlocks`
gives each rank of a process group a contiguous run of blocks and only their state, and exchanges the boundary
variables. The trainer's algorithm is the same for both; it asks its placement

* which blocks' terms this process updates (:meth:`terms`), and to sum per-block scalars over the processes
  (:meth:`sum`);
* to keep only this process's share of the state after it is built (:meth:`keep_own_state`);
* in a Jacobi ``Z`` update, for the gradient of the next process's first term at this process's last ``Z_t``
  (:meth:`boundary_gradient`) and, after the step, for this process's input replica (:meth:`boundary_values`);
* at test time, to pass activations along the pipeline (:meth:`chunk_input`, :meth:`chunk_output`, :meth:`output`);
* to assemble and distribute checkpoints in the one-process form (:meth:`state_dict`, :meth:`load_state_dict`),
  and to wait for the other processes (:meth:`barrier`).
"""
from __future__ import annotations

import torch


class LocalBlocks:
    """Every block in this process: the identity of each question above."""

    is_main = True

    def attach(self, trainer) -> None:
        """Called once by the trainer that holds the placement."""

    def terms(self, T: int) -> range:
        """The blocks ``t`` whose terms of 𝓛 this process updates."""
        return range(1, T + 1)

    def sum(self, values: list[float]) -> list[float]:
        """Per-block scalars summed over the processes."""
        return values

    def keep_own_state(self, trainer) -> None:
        """Drop the state this process does not hold (nothing, here)."""

    def boundary_gradient(self, trainer, sl) -> torch.Tensor | None:
        """The gradient of the next process's first term at this process's last ``Z_t`` (none: no next process)."""
        return None

    def boundary_values(self, trainer, sl) -> None:
        """Exchange the updated boundary ``Z`` of the samples ``sl`` (nothing to exchange)."""

    def chunk_input(self, z: torch.Tensor) -> torch.Tensor:
        """This process's input of a test-time chunk whose data are ``z``."""
        return z

    def chunk_output(self, z: torch.Tensor, T: int) -> torch.Tensor | None:
        """Pass a chunk's activations on; the output kept by this process."""
        return z

    def output(self, outs: list) -> torch.Tensor:
        """The test-time output of every chunk, on every process."""
        return torch.cat(outs)

    def state_dict(self, trainer, local: dict) -> dict:
        """The one-process checkpoint from this process's ``local`` state."""
        return local

    def load_state_dict(self, trainer, state: dict) -> None:
        """Load a one-process checkpoint."""
        trainer.load_local_state_dict(state)

    def barrier(self) -> None:
        """Wait for every process (one process: nothing to wait for)."""
