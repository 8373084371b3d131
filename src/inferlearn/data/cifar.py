"""Reader of CIFAR-10's python format (pickled batches) with safe extraction of the archive.

Each ``data_batch_i`` / ``test_batch`` is a pickled dict with ``b"data"`` (N × 3072 uint8, planes R,
G, B of 32×32 in row-major order) and ``b"labels"``. Grayscale uses ITU-R BT.601 luma
``0.299 R + 0.587 G + 0.114 B``, as the lifted-network paper's grayscale CIFAR-10 (Table 4).
"""
from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np

from ..errors import DataError

MEMBER_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
LUMA = np.array([0.299, 0.587, 0.114])


class _RestrictedUnpickler(pickle.Unpickler):
    """CIFAR batches hold only dicts, lists, bytes and numpy arrays: refuse anything else."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def parse_batch(data: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Parse one pickled batch into ``(images uint8 (N,3,32,32), labels int64 (N,))``."""
    import io

    try:
        batch = _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
        images = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as exc:  # any unpickling failure means a damaged file
        raise DataError(f"Corrupt CIFAR-10 batch {source}: {exc}") from exc
    if images.ndim != 2 or images.shape[1] != 3072 or labels.shape != (images.shape[0],):
        raise DataError(f"Corrupt CIFAR-10 batch {source}: data {images.shape}, labels {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"Corrupt CIFAR-10 batch {source}: labels outside 0..9")
    return images.reshape(-1, 3, 32, 32), labels


def to_grayscale(images: np.ndarray) -> np.ndarray:
    """``(N,3,H,W)`` uint8 → ``(N,1,H,W)`` float in [0,255] by BT.601 luma."""
    return np.tensordot(images.astype(np.float64), LUMA, axes=([1], [0]))[:, None]


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a CIFAR tar archive into ``dest``, refusing links and paths that leave ``dest``.

    Returns:
        the extracted ``cifar-10-batches-py`` folder.
    """
    dest = dest.resolve()
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                target = (dest / m.name).resolve()
                if not (m.isfile() or m.isdir()):
                    raise DataError(f"Unsafe member {m.name!r} in {archive}: links and devices are refused")
                if dest != target and dest not in target.parents:
                    raise DataError(f"Unsafe member {m.name!r} in {archive}: it would be written outside {dest}")
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"Corrupt or truncated archive {archive}: {exc}") from exc
    folder = dest / MEMBER_DIR
    if not folder.is_dir():
        raise DataError(f"{archive} does not contain {MEMBER_DIR}/")
    return folder
