"""Datasets: where to find them, how to verify them, how to load them.

Files are resolved in this order, first match wins:

1. an explicit ``data_dir`` (``--data-dir``),
2. ``$INFERLEARN_DATA``,
3. the user cache, ``$XDG_CACHE_HOME/inferlearn`` (default ``~/.cache/inferlearn``),
4. system locations, ``/usr/share/datasets/<name>`` (where Debian's ``dataset-*`` packages install),
5. a download from the public mirrors, only when ``download=True`` (``inferlearn data fetch NAME``).

In each root the files of a data set live in a sub-folder named after it (``mnist/``,
``fashion-mnist/``, ``cifar10/``, ``cifar100/``, ``tiny-imagenet/``); a root that directly holds the files
works too. Every file is verified by the MD5 of its *uncompressed* content against the published value: a
corrupt or truncated file raises :class:`~inferlearn.errors.DataError` and is never used.

Formats: idx (MNIST, Fashion-MNIST); the python pickles of CIFAR-10 and CIFAR-100, from the
``.tar.gz`` archive or its extracted folder (whose members have published MD5s too); Tiny ImageNet's
``tiny-imagenet-200.zip``, read in place (only the zip has a published MD5: an extracted
``tiny-imagenet-200/`` folder cannot be verified and is read only with ``allow_unverified``).
"""
from __future__ import annotations

import functools
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError, UnverifiedDataWarning
from . import cifar, tiny_imagenet
from .download import download
from .idx import md5, parse_idx, read_bytes

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class Spec:
    """Where a data set's files come from and what their uncompressed content must hash to."""

    folder: str
    checksums: dict  # file name -> MD5 of uncompressed content
    mirrors: tuple = ()
    archive: tuple | None = None  # (archive name, MD5) for data sets shipped as one archive
    how_to_get: str = ""
    gray: bool = False
    member_dir: str = cifar.MEMBER_DIR   # the folder the archive holds
    reader: str | None = None            # "idx", "cifar10", "cifar100", "tiny-imagenet"; None: by ``archive``
    n_classes: int = 10

    @property
    def kind(self) -> str:
        """The reader: ``reader``, else ``cifar10`` for an archive and ``idx`` for loose files."""
        return self.reader or ("cifar10" if self.archive else "idx")


MNIST = Spec(
    folder="mnist",
    checksums=dict(zip(IDX_FILES, ("6bbc9ace898e44ae57da46a324031adb", "a25bea736e30d166cdddb491f175f624",
                                   "2646ac647ad5339dbf082846283269ea", "27ae3e4e09519cfbb04c329615203637"))),
    mirrors=("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/"),
    how_to_get="run `inferlearn data fetch mnist`, or put the four idx files (optionally .gz) in $INFERLEARN_DATA/mnist/",
)
FASHION_MNIST = Spec(
    folder="fashion-mnist",
    checksums=dict(zip(IDX_FILES, ("f4a8712d7a061bf5bd6d2ca38dc4d50a", "9018921c3c673c538a1fc5bad174d6f9",
                                   "8181f5470baa50b63fa0f6fddb340f0a", "15d484375f8d13e6eb1aabb0c3f46965"))),
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    how_to_get="install Debian's package (apt-get install dataset-fashion-mnist), run `inferlearn data fetch "
               "fashion-mnist`, or put the idx files in $INFERLEARN_DATA/fashion-mnist/",
)
_CIFAR_MEMBERS = {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                  "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
                  "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e",
                  "batches.meta": "5ff9c542aee3614f3951f8cda6e48888"}
_CIFAR_HOW = ("run `inferlearn data fetch cifar10` (needs network), or put cifar-10-python.tar.gz or the extracted "
              "cifar-10-batches-py/ in $INFERLEARN_DATA/cifar10/")
CIFAR10 = Spec(folder="cifar10", checksums=_CIFAR_MEMBERS, mirrors=("https://www.cs.toronto.edu/~kriz/",),
               archive=("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"), how_to_get=_CIFAR_HOW)
CIFAR10_GRAY = Spec(folder="cifar10", checksums=_CIFAR_MEMBERS, mirrors=CIFAR10.mirrors, archive=CIFAR10.archive,
                    how_to_get=_CIFAR_HOW, gray=True)

CIFAR100 = Spec(folder="cifar100", checksums={"train": "16019d7e3df5f24257cddd939b257f8d",
                                              "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
                                              "meta": "7973b15100ade9c7d40fb424638fde48"},
                mirrors=("https://www.cs.toronto.edu/~kriz/",),
                archive=("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),
                member_dir=cifar.MEMBER_DIR_100, reader="cifar100", n_classes=100,
                how_to_get="run `inferlearn data fetch cifar100` (needs network), or put cifar-100-python.tar.gz or the "
                           "extracted cifar-100-python/ in $INFERLEARN_DATA/cifar100/")
TINY_IMAGENET = Spec(folder="tiny-imagenet", checksums={}, mirrors=("http://cs231n.stanford.edu/",),
                     archive=("tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"),
                     member_dir=tiny_imagenet.ROOT, reader="tiny-imagenet", n_classes=200,
                     how_to_get="run `inferlearn data fetch tiny-imagenet` (needs network), or put "
                                "tiny-imagenet-200.zip in $INFERLEARN_DATA/tiny-imagenet/")

SPECS = {"mnist": MNIST, "fashion-mnist": FASHION_MNIST, "cifar10": CIFAR10, "cifar10-gray": CIFAR10_GRAY,
         "cifar100": CIFAR100, "tiny-imagenet": TINY_IMAGENET}
DATASETS = ("digits", *SPECS)

@dataclass
class Dataset:
    """A classification data set as flat float32 tensors in [0, 1].

    Attributes:
        name: registry name.
        train_x, test_x: inputs, shape (N, D), D = prod(image_shape).
        train_y, test_y: int64 labels.
        n_classes: number of classes.
        image_shape: (C, H, W) of one input.
        source: where the files were found.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    n_classes: int
    image_shape: tuple
    source: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return self.train_x.shape[1]


def check_name(name: str) -> str:
    """Normalise and validate a data set name."""
    key = str(name).lower().replace("_", "-")
    aliases = {"fashion": "fashion-mnist", "fmnist": "fashion-mnist", "cifar-10": "cifar10", "cifar10-grey": "cifar10-gray",
               "cifar-100": "cifar100", "tinyimagenet": "tiny-imagenet", "tiny-imagenet-200": "tiny-imagenet"}
    key = aliases.get(key, key)
    if key not in DATASETS:
        raise DataError(f"Unknown dataset {name!r}; choose one of {list(DATASETS)}")
    return key


def cache_dir() -> Path:
    """The user cache root, ``$XDG_CACHE_HOME/inferlearn`` or ``~/.cache/inferlearn``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "inferlearn"


def search_roots(data_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """Roots to search, in resolution order, each with a label saying where it came from."""
    roots = []
    if data_dir:
        roots.append(("--data-dir", Path(data_dir)))
    if os.environ.get("INFERLEARN_DATA"):
        roots.append(("$INFERLEARN_DATA", Path(os.environ["INFERLEARN_DATA"])))
    roots.append(("user cache", cache_dir()))
    roots.append(("system", Path("/usr/share/datasets")))
    return roots


def _candidates(spec: Spec, root: Path) -> list[Path]:
    return [root / spec.folder, root]


def _find_file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _locate(spec: Spec, folder: Path) -> dict | None:
    """Files of ``spec`` in ``folder`` (``{name: path}``), or ``None`` when any is missing.

    Tiny ImageNet: ``{"archive": zip}`` (preferred: it can be verified) or ``{"folder": extracted folder}``."""
    if spec.kind == "tiny-imagenet":
        archive, extracted = folder / spec.archive[0], folder / spec.member_dir
        if archive.is_file():
            return {"archive": archive}
        return {"folder": extracted} if (extracted / "wnids.txt").is_file() else None
    if spec.archive:
        extracted = folder / spec.member_dir
        if extracted.is_dir() and all((extracted / n).is_file() for n in spec.checksums):
            return {n: extracted / n for n in spec.checksums}
        archive = folder / spec.archive[0]
        return {"archive": archive} if archive.is_file() else None
    found = {n: _find_file(folder, n) for n in spec.checksums}
    return found if all(found.values()) else None


def locate(name: str, data_dir=None) -> tuple[dict | None, list[str]]:
    """Find a data set's files. Returns ``(files or None, places looked at)``."""
    spec = SPECS[check_name(name)]
    looked = []
    for label, root in search_roots(data_dir):
        for folder in _candidates(spec, root):
            looked.append(f"{folder} ({label})")
            files = _locate(spec, folder)
            if files:
                return files, looked
    return None, looked


def _verified(path: Path, expected: str | None, allow_unverified: bool = False,
              unverified: list | None = None) -> bytes:
    """The file's uncompressed content, checked against the published MD5.

    With ``allow_unverified`` a mismatch is appended to ``unverified`` instead of raising (the explicit
    opt-in for a copy known to differ, e.g. the lossy grayscale CIFAR-10 development copy;
    :func:`load_dataset` warns for each such file). A file that cannot be parsed is refused either way.
    """
    data = read_bytes(path)
    if expected is not None and md5(data) != expected:
        if allow_unverified:
            if unverified is not None:
                unverified.append(str(path))
            return data
        raise DataError(f"Checksum mismatch for {path}: MD5 of the uncompressed content is {md5(data)}, the published "
                        f"value is {expected}. The file is corrupt or truncated; delete it and fetch it again "
                        "(or, for a copy you know differs, opt in with --allow-unverified).")
    return data


def _check_archive(spec: Spec, archive: Path, allow_unverified: bool = False, unverified: list | None = None) -> None:
    """Compare an archive's MD5 with the published one (:class:`DataError`, or noted in ``unverified``)."""
    digest = md5(archive.read_bytes())
    if digest != spec.archive[1]:
        if allow_unverified:
            if unverified is not None:
                unverified.append(str(archive))
            return
        raise DataError(f"Checksum mismatch for {archive}: MD5 {digest}, published {spec.archive[1]}. "
                        "The archive is corrupt or truncated; delete it and fetch it again (or, for a copy you know "
                        "differs, opt in with --allow-unverified).")


def _extract_archive(spec: Spec, archive: Path, allow_unverified: bool = False) -> dict:
    """Verify and extract a CIFAR archive next to itself (or into the user cache if read-only)."""
    _check_archive(spec, archive, allow_unverified)
    target = archive.parent if os.access(archive.parent, os.W_OK) else cache_dir() / spec.folder
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        folder = cifar.safe_extract(archive, Path(tmp), spec.member_dir)
        final = target / spec.member_dir
        if not final.exists():
            os.replace(folder, final)
    return {n: final / n for n in spec.checksums}


def _load_idx(name: str, spec: Spec, files: dict, allow_unverified: bool = False, unverified: list | None = None) -> tuple:
    arrays = {n: parse_idx(_verified(p, spec.checksums[n], allow_unverified, unverified), str(p)) for n, p in files.items()}
    tr_x, tr_y = arrays["train-images-idx3-ubyte"], arrays["train-labels-idx1-ubyte"]
    te_x, te_y = arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"]
    for x, y, split in ((tr_x, tr_y, "train"), (te_x, te_y, "test")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DataError(f"{name} {split} images {x.shape} and labels {y.shape} do not match")
    shape = (1, tr_x.shape[1], tr_x.shape[2])
    return tr_x.reshape(len(tr_x), -1), tr_y, te_x.reshape(len(te_x), -1), te_y, 10, shape


def _load_cifar(spec: Spec, files: dict, allow_unverified: bool = False, unverified: list | None = None) -> tuple:
    """CIFAR-10 (``data_batch_1..5``, ``test_batch``) or CIFAR-100 (``train``, ``test``), each verified as it is read."""
    if "archive" in files:
        files = _extract_archive(spec, files["archive"], allow_unverified)

    def batch(n):
        data = _verified(files[n], spec.checksums[n], allow_unverified, unverified)
        return cifar.parse_batch(data, str(files[n]), spec.n_classes)

    train_names, test_name = (("train",), "test") if spec.kind == "cifar100" else (cifar.TRAIN_BATCHES, cifar.TEST_BATCH)
    parts = [batch(n) for n in train_names]
    tr_x = np.concatenate([p[0] for p in parts])
    tr_y = np.concatenate([p[1] for p in parts])
    te_x, te_y = batch(test_name)
    if spec.gray:
        tr_x, te_x = cifar.to_grayscale(tr_x), cifar.to_grayscale(te_x)
    shape = tuple(tr_x.shape[1:])
    return tr_x.reshape(len(tr_x), -1), tr_y, te_x.reshape(len(te_x), -1), te_y, spec.n_classes, shape


def _load_tiny(spec: Spec, files: dict, allow_unverified: bool = False, unverified: list | None = None) -> tuple:
    """Tiny ImageNet from its verified zip, or (``allow_unverified`` only) from an extracted folder."""
    if "archive" in files:
        _check_archive(spec, files["archive"], allow_unverified, unverified)
        source = files["archive"]
    else:
        source = files["folder"]
        if not allow_unverified:
            raise DataError(_unverifiable(source, spec))
        if unverified is not None:
            unverified.append(str(source))
    tr_x, tr_y, te_x, te_y, n_classes, shape = tiny_imagenet.read(source)
    return tr_x.reshape(len(tr_x), -1), tr_y, te_x.reshape(len(te_x), -1), te_y, n_classes, shape


def _unverifiable(folder: Path, spec: Spec) -> str:
    return (f"{folder} is an extracted copy that cannot be verified (only {spec.archive[0]} has a published "
            f"checksum, MD5 {spec.archive[1]}); put {spec.archive[0]} in {folder.parent} instead, or read the folder "
            "with --allow-unverified")


LOADERS = {"idx": None, "cifar10": _load_cifar, "cifar100": _load_cifar, "tiny-imagenet": _load_tiny}


def _load_digits() -> tuple:
    """scikit-learn's 8×8 digits (1797 images, values 0..16), a fixed 80/20 split (seed 0)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    perm = np.random.RandomState(0).permutation(len(bunch.target))
    x, y = bunch.data[perm] * (255.0 / 16.0), bunch.target[perm]
    n_test = 360
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test], 10, (1, 8, 8)


def fetch(name: str, data_dir=None, progress: bool = True, mirrors: tuple | None = None) -> Path:
    """Download a data set's files (verifying checksums) unless already present; returns its folder.

    The destination is ``data_dir``, else ``$INFERLEARN_DATA``, else the user cache.
    """
    key = check_name(name)
    if key == "digits":
        return Path("<scikit-learn>")
    spec = SPECS[key]
    files, _ = locate(key, data_dir)
    if files:
        verify(key, files)   # present is not enough: the content must match the published checksums
        return next(iter(files.values())).parent
    root = Path(data_dir) if data_dir else Path(os.environ["INFERLEARN_DATA"]) if os.environ.get("INFERLEARN_DATA") else cache_dir()
    folder = root / spec.folder
    folder.mkdir(parents=True, exist_ok=True)
    names = [spec.archive[0]] if spec.archive else [f"{n}.gz" for n in spec.checksums]
    errors = []
    for fname in names:
        for mirror in mirrors or spec.mirrors:
            try:
                path = download(mirror + fname, folder / fname, progress=progress)
                if spec.archive:
                    _check_archive(spec, path)   # a bad copy from one mirror: try the next
                else:
                    _verified(path, spec.checksums[fname[:-3]])
                break
            except DataError as exc:
                (folder / fname).unlink(missing_ok=True)
                errors.append(str(exc))
        else:
            raise DataError(f"Could not fetch {fname} for {key} from any mirror:\n  " + "\n  ".join(errors))
    if spec.archive and spec.kind != "tiny-imagenet":   # Tiny ImageNet is read from its zip
        _extract_archive(spec, folder / spec.archive[0])
    return folder


def verify(name: str, files: dict) -> None:
    """Check located files against the published checksums (:class:`DataError` naming a bad file)."""
    spec = SPECS[check_name(name)]
    if "folder" in files:
        raise DataError(_unverifiable(files["folder"], spec))
    if "archive" in files:
        _check_archive(spec, files["archive"])
        return
    for n, p in files.items():
        _verified(p, spec.checksums[n])


@functools.lru_cache(maxsize=4)
def _load_cached(key: str, data_dir: str | None, download_missing: bool, allow_unverified: bool = False) -> Dataset:
    if key == "digits":
        arrays, source = _load_digits(), "scikit-learn (sklearn.datasets.load_digits)"
    else:
        spec = SPECS[key]
        files, looked = locate(key, data_dir)
        if files is None and download_missing:
            fetch(key, data_dir)
            files, looked = locate(key, data_dir)
        if files is None:
            raise DataError(f"Dataset {key!r} not found. Looked in:\n  " + "\n  ".join(looked) + f"\nTo get it: {spec.how_to_get}.")
        source = str(next(iter(files.values())).parent)
        unverified: list[str] = []
        load = LOADERS[spec.kind] or functools.partial(_load_idx, key)
        arrays = load(spec, files, allow_unverified, unverified)
    tr_x, tr_y, te_x, te_y, n_classes, shape = arrays
    to_x = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32) / 255.0)  # noqa: E731
    to_y = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64))  # noqa: E731
    meta = {"unverified_files": unverified} if key != "digits" and unverified else {}
    return Dataset(key, to_x(tr_x), to_y(tr_y), to_x(te_x), to_y(te_y), n_classes, tuple(int(s) for s in shape), source,
                   meta)


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = False,
                 allow_unverified: bool = False) -> Dataset:
    """Load a data set by name (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar10-gray``,
    ``cifar100``, ``tiny-imagenet``; Tiny ImageNet's validation split is its test split).

    Args:
        data_dir: a folder searched first (see the module docstring for the order).
        download: fetch missing files from the public mirrors.
        allow_unverified: read files whose checksums differ from the published ones, with an
            :class:`~inferlearn.errors.UnverifiedDataWarning` (once per file) and their paths in
            ``Dataset.meta["unverified_files"]``; a file that cannot be parsed is still refused.

    Raises:
        DataError: unknown name; files missing (the message lists where it looked and how to get them);
            corrupt or truncated files.
    """
    key, folder = check_name(name), str(data_dir) if data_dir else None
    data = _load_cached(key, folder, bool(download), bool(allow_unverified))
    for path in data.meta.get("unverified_files", []):   # on every call, also when the data set is cached
        warnings.warn(f"Reading {path}: its checksum differs from the published one (--allow-unverified); "
                      "results on it are not results on the published data set", UnverifiedDataWarning, stacklevel=2)
    return data


def describe(name: str, data_dir=None) -> str:
    """One line: where a data set was found, or why not (for ``inferlearn data list``)."""
    key = check_name(name)
    if key == "digits":
        return "bundled with scikit-learn"
    files, looked = locate(key, data_dir)
    if files:
        if "folder" in files:
            return f"UNVERIFIABLE: {_unverifiable(files['folder'], SPECS[key])}"
        try:
            verify(key, files)
        except DataError as exc:
            return f"CORRUPT: {exc}"
        return f"found and verified in {next(iter(files.values())).parent}"
    return "not found (looked in " + ", ".join(looked) + ")"
