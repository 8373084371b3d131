"""Dataset readers on generated files in the official formats, resolution order, and failure modes."""
import hashlib
import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from inferlearn.data import datasets, load_dataset, locate
from inferlearn.data.cifar import safe_extract, to_grayscale
from inferlearn.data.idx import parse_idx, write_idx
from inferlearn.errors import DataError

IDX = datasets.IDX_FILES


def _make_idx(folder, n_train=20, n_test=10, seed=0, gz=True):
    rng = np.random.RandomState(seed)
    arrays = {IDX[0]: rng.randint(0, 256, (n_train, 28, 28)), IDX[1]: rng.randint(0, 10, n_train),
              IDX[2]: rng.randint(0, 256, (n_test, 28, 28)), IDX[3]: rng.randint(0, 10, n_test)}
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for name, arr in arrays.items():
        write_idx(arr, folder / (name + (".gz" if gz else "")))
        raw = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.astype(np.uint8).tobytes()
        sums[name] = hashlib.md5(raw).hexdigest()
    return arrays, sums


@pytest.fixture
def fake_mnist_spec(monkeypatch):
    """Replace MNIST's published checksums by those of the generated files (the reader is unchanged)."""
    def install(sums):
        monkeypatch.setitem(datasets.SPECS, "mnist", datasets.Spec(folder="mnist", checksums=sums, mirrors=()))
        datasets._load_cached.cache_clear()
    return install


@pytest.mark.parametrize("gz", [True, False])
def test_idx_reader_roundtrip(tmp_path, fake_mnist_spec, gz):
    """Guards against a wrong header offset, byte order, or pixel scaling in the idx reader."""
    arrays, sums = _make_idx(tmp_path / "mnist", gz=gz)
    fake_mnist_spec(sums)
    d = load_dataset("mnist", data_dir=tmp_path)
    assert d.train_x.shape == (20, 784) and d.test_x.shape == (10, 784) and d.image_shape == (1, 28, 28)
    np.testing.assert_allclose(d.train_x.numpy(), arrays[IDX[0]].reshape(20, -1) / 255.0, rtol=1e-6)
    assert torch.equal(d.test_y, torch.from_numpy(arrays[IDX[3]].astype(np.int64)))


def test_checksum_mismatch_is_reported(tmp_path, fake_mnist_spec):
    """A file whose content does not match the published checksum is never used."""
    _, sums = _make_idx(tmp_path / "mnist")
    sums[IDX[1]] = "0" * 32
    fake_mnist_spec(sums)
    with pytest.raises(DataError, match="Checksum mismatch.*train-labels"):
        load_dataset("mnist", data_dir=tmp_path)


def test_truncated_gzip_is_reported(tmp_path, fake_mnist_spec):
    _, sums = _make_idx(tmp_path / "mnist")
    path = tmp_path / "mnist" / (IDX[0] + ".gz")
    path.write_bytes(path.read_bytes()[:200])
    fake_mnist_spec(sums)
    with pytest.raises(DataError, match="Corrupt or truncated"):
        load_dataset("mnist", data_dir=tmp_path)


def test_idx_header_errors():
    with pytest.raises(DataError, match="bad magic"):
        parse_idx(b"\x01\x02\x08\x01", "f")
    with pytest.raises(DataError, match="truncated or corrupt"):
        parse_idx(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 5, "f")


def test_resolution_order(tmp_path, monkeypatch, fake_mnist_spec):
    """--data-dir wins over $INFERLEARN_DATA, which wins over the user cache."""
    _, sums = _make_idx(tmp_path / "a" / "mnist", seed=1)
    _make_idx(tmp_path / "b" / "mnist", seed=1)
    _make_idx(tmp_path / "cache" / "inferlearn" / "mnist", seed=1)
    monkeypatch.setenv("INFERLEARN_DATA", str(tmp_path / "b"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake_mnist_spec(sums)
    assert locate("mnist", tmp_path / "a")[0][IDX[0]].parent == tmp_path / "a" / "mnist"
    assert locate("mnist")[0][IDX[0]].parent == tmp_path / "b" / "mnist"
    monkeypatch.delenv("INFERLEARN_DATA")
    assert locate("mnist")[0][IDX[0]].parent == tmp_path / "cache" / "inferlearn" / "mnist"


def test_missing_dataset_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLEARN_DATA", str(tmp_path))
    monkeypatch.setattr(datasets, "search_roots", lambda data_dir=None: [("$INFERLEARN_DATA", tmp_path)])
    with pytest.raises(DataError) as err:
        load_dataset("cifar10")
    msg = str(err.value)
    assert str(tmp_path) in msg and "inferlearn data fetch cifar10" in msg


def test_unknown_dataset_name():
    with pytest.raises(DataError, match="Unknown dataset 'imagenet'"):
        load_dataset("imagenet")


def test_fetch_downloads_and_verifies(tmp_path, fake_mnist_spec):
    """``fetch`` downloads from a mirror (here a file:// URL), verifies, and a bad mirror is reported."""
    _, sums = _make_idx(tmp_path / "mirror")
    fake_mnist_spec(sums)
    folder = datasets.fetch("mnist", tmp_path / "dest", progress=False, mirrors=((tmp_path / "mirror").as_uri() + "/",))
    assert folder == tmp_path / "dest" / "mnist"
    assert load_dataset("mnist", data_dir=tmp_path / "dest").train_x.shape == (20, 784)
    with pytest.raises(DataError, match="Could not fetch"):
        datasets.fetch("mnist", tmp_path / "other", progress=False, mirrors=((tmp_path / "nowhere").as_uri() + "/",))
    assert not list((tmp_path / "other" / "mnist").glob("*.gz")), "a failed download left a partial file"


def _cifar_batch(n, seed):
    rng = np.random.RandomState(seed)
    data = rng.randint(0, 256, (n, 3072)).astype(np.uint8)
    labels = rng.randint(0, 10, n).tolist()
    return pickle.dumps({b"batch_label": b"x", b"labels": labels, b"data": data, b"filenames": [b"f"] * n}, protocol=2), data, labels


def _make_cifar_archive(path, members=None):
    blobs = {}
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        blobs[name] = _cifar_batch(4, i)
    blobs["batches.meta"] = (pickle.dumps({b"label_names": [b"a"] * 10}), None, None)
    with tarfile.open(path, "w:gz") as tar:
        for name, (blob, _, _) in blobs.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
        for extra in members or []:
            tar.addfile(extra)
    sums = {n: hashlib.md5(b[0]).hexdigest() for n, b in blobs.items()}
    return blobs, sums, hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("gray", [False, True])
def test_cifar_reader_from_archive(tmp_path, monkeypatch, gray):
    """The CIFAR-10 python-format reader on a generated archive: layout, labels, grayscale luma."""
    (tmp_path / "cifar10").mkdir()
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    blobs, sums, archive_md5 = _make_cifar_archive(archive)
    name = "cifar10-gray" if gray else "cifar10"
    monkeypatch.setitem(datasets.SPECS, name, datasets.Spec(folder="cifar10", checksums=sums,
                                                            archive=(archive.name, archive_md5), gray=gray))
    d = load_dataset(name, data_dir=tmp_path)
    assert d.train_x.shape == (20, 1024 if gray else 3072) and d.test_x.shape == (4, 1024 if gray else 3072)
    raw = blobs["data_batch_1"][1].reshape(4, 3, 32, 32)
    expected = to_grayscale(raw).reshape(4, -1) if gray else raw.reshape(4, -1)
    np.testing.assert_allclose(d.train_x[:4].numpy(), expected / 255.0, rtol=1e-5)
    assert d.test_y.tolist() == blobs["test_batch"][2]
    if gray:
        r, g, b = raw[0, :, 0, 0]
        assert d.train_x[0, 0].item() == pytest.approx((0.299 * r + 0.587 * g + 0.114 * b) / 255, rel=1e-5)


def test_cifar_corrupt_archive(tmp_path, monkeypatch):
    (tmp_path / "cifar10").mkdir()
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    _, sums, md5 = _make_cifar_archive(archive)
    monkeypatch.setitem(datasets.SPECS, "cifar10", datasets.Spec(folder="cifar10", checksums=sums, archive=(archive.name, md5)))
    archive.write_bytes(archive.read_bytes()[:100])
    with pytest.raises(DataError, match="Checksum mismatch"):
        load_dataset("cifar10", data_dir=tmp_path)


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink"])
def test_safe_extract_refuses_escaping_members(tmp_path, kind):
    """A crafted archive must not write outside the destination (path traversal, links)."""
    evil = tarfile.TarInfo({"parent": "../evil", "absolute": "/tmp/evil-inferlearn", "symlink": "cifar-10-batches-py/link"}[kind])
    if kind == "symlink":
        evil.type, evil.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = tmp_path / "a.tar.gz"
    _make_cifar_archive(archive, members=[evil])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DataError, match="Unsafe member"):
        safe_extract(archive, dest)
    assert not (tmp_path / "evil").exists() and not os.path.exists("/tmp/evil-inferlearn")


def test_digits_offline():
    d = load_dataset("digits")
    assert d.train_x.shape == (1437, 64) and d.test_x.shape == (360, 64)
    assert 0 <= float(d.train_x.min()) and float(d.train_x.max()) == 1.0


def test_real_mnist_checksums(mnist_dir):
    """The offline MNIST copy passes the published checksums and has the published sizes."""
    d = load_dataset("mnist", data_dir=mnist_dir)
    assert d.train_x.shape == (60000, 784) and d.test_x.shape == (10000, 784)
    assert d.train_y[:5].tolist() == [5, 0, 4, 1, 9]


def test_allow_unverified_is_an_explicit_visible_opt_in(tmp_path, monkeypatch):
    """A copy whose checksums differ from the published ones (like the lossy grayscale CIFAR-10
    development copy) is refused by default, read with a warning when opted in, and a malicious
    pickle is refused even then."""
    from inferlearn.errors import UnverifiedDataWarning

    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    blobs = {name: _cifar_batch(4, i)[0] for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"])}
    blobs["batches.meta"] = pickle.dumps({b"label_names": [b"a"] * 10})
    for name, blob in blobs.items():
        (folder / name).write_bytes(blob)
    published = {n: "0" * 32 for n in blobs}   # the published sums do not apply to this copy
    monkeypatch.setitem(datasets.SPECS, "cifar10-gray", datasets.Spec(folder="cifar10", checksums=published,
                                                                      archive=("x.tar.gz", "0" * 32), gray=True))
    datasets._load_cached.cache_clear()
    with pytest.raises(DataError, match="--allow-unverified"):
        load_dataset("cifar10-gray", data_dir=tmp_path)
    with pytest.warns(UnverifiedDataWarning, match="differs from the published"):
        d = load_dataset("cifar10-gray", data_dir=tmp_path, allow_unverified=True)
    assert d.train_x.shape == (20, 1024) and len(d.meta["unverified_files"]) == 6

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}))
    datasets._load_cached.cache_clear()
    with pytest.raises(DataError, match="refusing to load"):
        load_dataset("cifar10-gray", data_dir=tmp_path, allow_unverified=True)
    datasets._load_cached.cache_clear()


def test_fetch_and_list_verify_content_not_presence(tmp_path, monkeypatch):
    """`data fetch` must not report 'verified' for a folder holding a corrupt file, and `data list`
    says which file is corrupt."""
    (tmp_path / "cifar10").mkdir()
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    _, sums, md5 = _make_cifar_archive(archive)
    monkeypatch.setitem(datasets.SPECS, "cifar10", datasets.Spec(folder="cifar10", checksums=sums, archive=(archive.name, md5)))
    assert datasets.fetch("cifar10", tmp_path, progress=False) == tmp_path / "cifar10"
    assert "verified" in datasets.describe("cifar10", tmp_path)
    archive.write_bytes(archive.read_bytes()[:-10])
    with pytest.raises(DataError, match="Checksum mismatch"):
        datasets.fetch("cifar10", tmp_path, progress=False)
    assert datasets.describe("cifar10", tmp_path).startswith("CORRUPT")
