"""Reader of the idx format of MNIST and Fashion-MNIST (LeCun et al.).

Layout: a 4-byte magic ``0x00 0x00 <dtype> <ndim>``, ``ndim`` big-endian uint32 dimensions, then the
data in row-major order. Only the unsigned-byte type (``0x08``) is used by these data sets.
"""
from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np

from ..errors import DataError


def read_bytes(path: Path) -> bytes:
    """Content of ``path``, decompressed when it ends in ``.gz``; a damaged archive raises ``DataError``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"Corrupt or truncated file {path}: {exc}. Delete it and fetch it again "
                        "(inferlearn data fetch NAME).") from exc


def md5(data: bytes) -> str:
    """Hex MD5 digest of ``data``."""
    return hashlib.md5(data).hexdigest()


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Parse idx bytes into a ``uint8`` array; a wrong magic or a size mismatch raises ``DataError``."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{source} is not an idx file (bad magic number)")
    if data[2] != 0x08:
        raise DataError(f"{source}: unsupported idx element type 0x{data[2]:02x} (expected unsigned byte 0x08)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{source}: truncated idx header")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected = int(np.prod(dims)) if dims else 0
    if len(data) - header != expected:
        raise DataError(f"{source}: idx header announces {dims} ({expected} bytes) but the file holds "
                        f"{len(data) - header} bytes: truncated or corrupt")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def write_idx(array: np.ndarray, path: Path) -> None:
    """Write a ``uint8`` array in idx format (gzip-compressed when ``path`` ends in ``.gz``); for tests."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        Path(path).write_bytes(payload)
