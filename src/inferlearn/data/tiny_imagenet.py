"""Reader of Tiny ImageNet (cs231n, ``tiny-imagenet-200.zip``), read from the zip itself or an extracted folder.

Layout (inside ``tiny-imagenet-200/``): ``wnids.txt``, the 200 WordNet ids, one a line — class ``k`` is
the ``k``-th line; ``train/<wnid>/images/<wnid>_<i>.JPEG``, 500 images a class; ``val/images/val_<i>.JPEG``
with ``val/val_annotations.txt`` (tab-separated: file name, wnid, bounding box), 50 images a class. The
unlabelled ``test/`` split is not read: the labelled validation split serves as the test split, as in
the papers that report Tiny ImageNet accuracy. Every image is 64×64 RGB (the few grayscale JPEGs are
converted to RGB, R = G = B); the training images are ordered by class, then by their number ``i``, the
validation images as ``val_annotations.txt`` lists them.

Decoding the 110 000 JPEGs (Pillow) takes tens of seconds; a process decodes them once
(:func:`inferlearn.data.load_dataset` caches the arrays).
"""
from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import DataError

ROOT = "tiny-imagenet-200"
SIZE = 64


class Members:
    """Files under ``tiny-imagenet-200/`` by their path relative to it, from the zip or an extracted folder."""

    def __init__(self, source: Path):
        self.source = Path(source)
        self._zip = None
        if self.source.is_file():
            try:
                self._zip = zipfile.ZipFile(self.source)
                names = self._zip.namelist()
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise DataError(f"Corrupt or truncated archive {self.source}: {exc}") from exc
            prefix = ROOT + "/"
            self.names = [n[len(prefix):] for n in names if n.startswith(prefix) and not n.endswith("/")]
        else:
            self.names = [str(p.relative_to(self.source)) for p in self.source.rglob("*") if p.is_file()]

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(f"{ROOT}/{name}")
            return (self.source / name).read_bytes()
        except (KeyError, FileNotFoundError):
            raise DataError(f"{self.source} has no {ROOT}/{name}: the Tiny ImageNet copy is incomplete") from None
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:   # zlib errors, CRC mismatches
            raise DataError(f"Corrupt member {ROOT}/{name} in {self.source}: {exc}") from exc

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def _decode(data: bytes, where: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as exc:   # Pillow raises many types for a damaged image
        raise DataError(f"Corrupt Tiny ImageNet image {where}: {type(exc).__name__} {exc}") from exc
    if arr.shape != (SIZE, SIZE, 3):
        raise DataError(f"Corrupt Tiny ImageNet image {where}: size {arr.shape[1]}×{arr.shape[0]}, expected 64×64")
    return arr.transpose(2, 0, 1)


def _number(name: str) -> int:
    m = re.search(r"_(\d+)\.JPEG$", name)
    return int(m.group(1)) if m else -1


def read(source: Path, progress: Callable[[int, int], None] | None = None) -> tuple:
    """``(train_x (N,3,64,64) uint8, train_y, test_x, test_y, 200, (3, 64, 64))`` from the zip or folder ``source``.

    Raises:
        DataError: a missing or malformed ``wnids.txt`` / ``val_annotations.txt``, a class without
            training images, an unknown wnid, or an image that does not decode to 64×64 (naming it).
    """
    members = Members(source)
    try:
        where = lambda n: f"{source}:{ROOT}/{n}"  # noqa: E731
        wnids = members.read("wnids.txt").decode("ascii", "replace").split()
        if len(wnids) != 200 or len(set(wnids)) != 200:
            raise DataError(f"Corrupt {where('wnids.txt')}: {len(set(wnids))} distinct WordNet ids, expected 200")
        index = {w: k for k, w in enumerate(wnids)}
        by_class: dict[str, list[str]] = {w: [] for w in wnids}
        for name in members.names:
            parts = name.split("/")
            if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and name.endswith(".JPEG"):
                if parts[1] not in index:
                    raise DataError(f"{where(name)}: class {parts[1]} is not in wnids.txt")
                by_class[parts[1]].append(name)
        empty = [w for w, files in by_class.items() if not files]
        if empty:
            raise DataError(f"{source} has no training images for {len(empty)} classes (e.g. {ROOT}/train/{empty[0]}/images/)")
        train = [(n, index[w]) for w in wnids for n in sorted(by_class[w], key=_number)]
        val = []
        for line in members.read("val/val_annotations.txt").decode("ascii", "replace").splitlines():
            fields = line.split("\t")
            if not line.strip():
                continue
            if len(fields) < 2 or fields[1] not in index:
                raise DataError(f"Corrupt {where('val/val_annotations.txt')}: line {line[:80]!r}")
            val.append((f"val/images/{fields[0]}", index[fields[1]]))
        if not val:
            raise DataError(f"Corrupt {where('val/val_annotations.txt')}: no images listed")
        arrays = []
        for split in (train, val):
            x = np.empty((len(split), 3, SIZE, SIZE), dtype=np.uint8)
            for i, (name, _) in enumerate(split):
                x[i] = _decode(members.read(name), where(name))
                if progress is not None:
                    progress(i + 1, len(split))
            arrays += [x, np.array([y for _, y in split], dtype=np.int64)]
    finally:
        members.close()
    return (*arrays, 200, (3, SIZE, SIZE))
