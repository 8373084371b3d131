"""The per-sample state of batch block-ADMM: the decoupling variables ``Z_t`` and scaled duals ``U_t`` of every
training sample (in memory or memory-mapped on disk), with the inputs ``X`` (``Z_0``) and targets ``Y``, read and
written by chunks of samples on the compute device."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


class Storage:
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


class SampleState:
    """``X``, ``Y`` and the lists ``Z[t-1] = Z_t``, ``U[t-1] = U_t`` of a batch-mode run.

    Args:
        storage: where the per-sample tensors live (:class:`Storage`).
        chunk_size: samples per chunk of the passes over all samples.
        where: ``() -> (device, dtype)`` of the computation (the blocks' parameters), where reads go.
    """

    def __init__(self, storage: Storage, chunk_size: int, where: Callable[[], tuple[torch.device, torch.dtype]]):
        self.storage, self.chunk_size, self.where = storage, chunk_size, where
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None
        self.Z: list[torch.Tensor | None] = []
        self.U: list[torch.Tensor | None] = []

    def chunks(self, n: int):
        """``(start, stop)`` of the chunks of ``n`` samples."""
        cs = self.chunk_size
        for a in range(0, n, cs):
            yield a, min(a + cs, n)

    @staticmethod
    def take(src: torch.Tensor, sl) -> torch.Tensor:
        """The rows ``sl`` (a slice or an index tensor) of ``src``: index_select is several times faster than advanced
        indexing for row gathers on CPU."""
        return src[sl] if isinstance(sl, slice) else src.index_select(0, sl)

    def get(self, t: int, sl) -> torch.Tensor:
        """``Z_t`` of the samples ``sl`` on the compute device (``Z_0 = X``)."""
        src = self.X if t == 0 else self.Z[t - 1]
        return self.take(src, sl).to(*self.where())

    def u(self, t: int, sl) -> torch.Tensor:
        """``U_t`` of the samples ``sl`` on the compute device."""
        return self.take(self.U[t - 1], sl).to(*self.where())

    @staticmethod
    def put(store: torch.Tensor, sl, value: torch.Tensor) -> None:
        """Write ``value`` into the rows ``sl`` of ``store`` (in the store's device and dtype)."""
        store[sl] = value.detach().to(store.device, store.dtype)

    def memory_bytes(self) -> dict:
        """Bytes held by ``Z`` and ``U`` and whether they live on disk."""
        nbytes = sum(z.numel() * z.element_size() for z in self.Z + self.U if z is not None)
        return {"state_bytes": int(nbytes), "state_on_disk": self.storage.dir is not None}
