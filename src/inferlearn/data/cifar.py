"""Reader of CIFAR-10's and CIFAR-100's python format (pickled batches) with safe extraction of the archive.

CIFAR-10: each ``data_batch_i`` / ``test_batch`` (in ``cifar-10-batches-py/``) is a pickled dict with
``b"data"`` (N × 3072 uint8, planes R, G, B of 32×32 in row-major order) and ``b"labels"`` (0 … 9).
CIFAR-100: ``train`` and ``test`` (in ``cifar-100-python/``) hold the same ``b"data"`` with
``b"fine_labels"`` (the 100 classes, 0 … 99; ``b"coarse_labels"``, the 20 superclasses, are not read).
Grayscale uses ITU-R BT.601 luma
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
MEMBER_DIR_100 = "cifar-100-python"
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


def parse_batch(data: bytes, source: str, n_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Parse one pickled batch into ``(images uint8 (N,3,32,32), labels int64 (N,))``: CIFAR-10's
    ``b"labels"`` for ``n_classes=10``, CIFAR-100's ``b"fine_labels"`` for ``n_classes=100``."""
    import io

    name, key = ("CIFAR-10 batch", b"labels") if n_classes == 10 else ("CIFAR-100 file", b"fine_labels")
    try:
        batch = _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
        images = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[key], dtype=np.int64)
    except Exception as exc:  # any unpickling failure (or a missing key) means a damaged file
        raise DataError(f"Corrupt {name} {source}: {type(exc).__name__} {exc}") from exc
    if images.ndim != 2 or images.shape[1] != 3072 or labels.shape != (images.shape[0],):
        raise DataError(f"Corrupt {name} {source}: data {images.shape}, labels {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > n_classes - 1):
        raise DataError(f"Corrupt {name} {source}: labels outside 0..{n_classes - 1}")
    return images.reshape(-1, 3, 32, 32), labels


def to_grayscale(images: np.ndarray) -> np.ndarray:
    """``(N,3,H,W)`` uint8 → ``(N,1,H,W)`` float in [0,255] by BT.601 luma."""
    return np.tensordot(images.astype(np.float64), LUMA, axes=([1], [0]))[:, None]


def safe_extract(archive: Path, dest: Path, member_dir: str = MEMBER_DIR) -> Path:
    """Extract a CIFAR tar archive into ``dest``, refusing links and paths that leave ``dest``.

    Returns:
        the extracted ``member_dir`` folder (``cifar-10-batches-py``, ``cifar-100-python``).
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
    folder = dest / member_dir
    if not folder.is_dir():
        raise DataError(f"{archive} does not contain {member_dir}/")
    return folder
