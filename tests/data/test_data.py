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


def _make_cifar100_archive(path, fine=None):
    """``cifar-100-python.tar.gz`` with ``train`` (6 images), ``test`` (3) and ``meta``, as published."""
    rng = np.random.RandomState(7)
    blobs = {}
    for name, n in (("train", 6), ("test", 3)):
        data = rng.randint(0, 256, (n, 3072)).astype(np.uint8)
        labels = (fine if fine is not None and name == "train" else rng.randint(0, 100, n)).tolist()
        blob = pickle.dumps({b"filenames": [b"f"] * n, b"batch_label": b"x", b"fine_labels": labels,
                             b"coarse_labels": [v // 5 for v in labels], b"data": data}, protocol=2)
        blobs[name] = (blob, data, labels)
    blobs["meta"] = (pickle.dumps({b"fine_label_names": [b"a"] * 100, b"coarse_label_names": [b"b"] * 20}), None, None)
    with tarfile.open(path, "w:gz") as tar:
        for name, (blob, _, _) in blobs.items():
            info = tarfile.TarInfo(f"cifar-100-python/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return blobs, {n: hashlib.md5(b[0]).hexdigest() for n, b in blobs.items()}, hashlib.md5(path.read_bytes()).hexdigest()


def _install(monkeypatch, name, **changes):
    """The registry's spec of ``name`` with the generated files' checksums (the reader is unchanged)."""
    import dataclasses

    monkeypatch.setitem(datasets.SPECS, name, dataclasses.replace(datasets.SPECS[name], **changes))
    datasets._load_cached.cache_clear()


def test_cifar100_reader_from_archive(tmp_path, monkeypatch):
    """CIFAR-100's python format: the archive is verified and extracted, ``fine_labels`` are the 100 classes."""
    (tmp_path / "cifar100").mkdir()
    archive = tmp_path / "cifar100" / "cifar-100-python.tar.gz"
    blobs, sums, archive_md5 = _make_cifar100_archive(archive, fine=np.array([0, 99, 42, 5, 17, 63]))
    _install(monkeypatch, "cifar100", checksums=sums, archive=(archive.name, archive_md5))
    d = load_dataset("cifar-100", data_dir=tmp_path)
    assert (d.name, d.n_classes, d.image_shape) == ("cifar100", 100, (3, 32, 32))
    np.testing.assert_allclose(d.train_x.numpy(), blobs["train"][1] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(d.test_x.numpy(), blobs["test"][1] / 255.0, rtol=1e-6)
    assert d.train_y.tolist() == [0, 99, 42, 5, 17, 63] and d.test_y.tolist() == blobs["test"][2]
    assert (tmp_path / "cifar100" / "cifar-100-python" / "train").is_file()
    assert "verified" in datasets.describe("cifar100", tmp_path)
    datasets._load_cached.cache_clear()   # now from the extracted folder, its members verified
    (tmp_path / "cifar100" / "cifar-100-python" / "test").write_bytes(blobs["test"][0][:-5])
    with pytest.raises(DataError, match="Checksum mismatch for .*cifar-100-python/test"):
        load_dataset("cifar100", data_dir=tmp_path)


@pytest.mark.parametrize("damage, msg", [("truncate", "Checksum mismatch"), ("labels", r"labels outside 0\.\.99"),
                                         ("cifar10", "Corrupt CIFAR-100 file .*fine_labels")])
def test_cifar100_damaged(tmp_path, monkeypatch, damage, msg):
    (tmp_path / "cifar100").mkdir()
    archive = tmp_path / "cifar100" / "cifar-100-python.tar.gz"
    if damage == "cifar10":   # a CIFAR-10 batch (b"labels", no b"fine_labels") in CIFAR-100's place
        blobs, sums, archive_md5 = _make_cifar100_archive(archive)
        folder = tmp_path / "cifar100" / "cifar-100-python"
        folder.mkdir()
        for name, (blob, _, _) in blobs.items():
            (folder / name).write_bytes(_cifar_batch(3, 0)[0] if name == "test" else blob)
        sums["test"] = hashlib.md5((folder / "test").read_bytes()).hexdigest()
    else:
        blobs, sums, archive_md5 = _make_cifar100_archive(archive, fine=np.array([0, 1, 2, 3, 4, 100]) if damage == "labels" else None)
        if damage == "truncate":
            archive.write_bytes(archive.read_bytes()[:200])
    _install(monkeypatch, "cifar100", checksums=sums, archive=(archive.name, archive_md5))
    with pytest.raises(DataError, match=msg):
        load_dataset("cifar100", data_dir=tmp_path)


def _jpeg(colour, size=64, mode="RGB"):
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (size, size), colour).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _make_tiny_imagenet(path, per_class=2, damage=None):
    """``tiny-imagenet-200.zip`` in the official layout (200 classes of constant-colour images, so the decoded
    pixels are known up to JPEG's rounding). Returns the expected arrays."""
    import zipfile

    rng = np.random.RandomState(3)
    wnids = [f"n{10000000 + 7 * k:08d}" for k in range(200)]
    colours = rng.randint(0, 256, (200, per_class + 1, 3))
    root = "tiny-imagenet-200/"
    files = {root + "wnids.txt": ("\n".join(wnids) + "\n").encode(), root + "words.txt": b"n0\tthing\n"}
    train_x, train_y, test_x, test_y, notes = [], [], [], [], []
    for k, w in enumerate(wnids):
        for i in reversed(range(per_class)):   # written out of order: the reader sorts by number
            files[f"{root}train/{w}/images/{w}_{i}.JPEG"] = _jpeg(tuple(int(c) for c in colours[k, i]))
        files[f"{root}train/{w}/{w}_boxes.txt"] = b""
        train_x += [np.broadcast_to(colours[k, i][:, None, None], (3, 64, 64)) for i in range(per_class)]
        train_y += [k] * per_class
    order = rng.permutation(200)   # validation images of shuffled classes
    for j, k in enumerate(order):
        files[f"{root}val/images/val_{j}.JPEG"] = _jpeg(tuple(int(c) for c in colours[k, per_class]))
        notes.append(f"val_{j}.JPEG\t{wnids[k]}\t0\t0\t63\t63")
        test_x.append(np.broadcast_to(colours[k, per_class][:, None, None], (3, 64, 64)))
        test_y.append(int(k))
    files[root + "val/val_annotations.txt"] = ("\n".join(notes) + "\n").encode()
    files[root + "test/images/test_0.JPEG"] = _jpeg((1, 2, 3))   # unlabelled: not read
    gray = f"{root}train/{wnids[1]}/images/{wnids[1]}_0.JPEG"    # a grayscale JPEG, as a few in the real set
    files[gray] = _jpeg(200, mode="L")
    train_x[per_class] = np.full((3, 64, 64), 200)
    if damage == "no-annotations":
        del files[root + "val/val_annotations.txt"]
    elif damage == "bad-jpeg":
        files[f"{root}val/images/val_3.JPEG"] = b"\xff\xd8 not a jpeg"
    elif damage == "small":
        files[f"{root}val/images/val_3.JPEG"] = _jpeg((9, 9, 9), size=32)
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
    return np.stack(train_x).reshape(len(train_x), -1), train_y, np.stack(test_x).reshape(200, -1), test_y


def test_tiny_imagenet_reader_from_zip(tmp_path, monkeypatch):
    """Tiny ImageNet read from its zip: classes in wnids.txt order, training images by class and number,
    the validation split (labelled by val_annotations.txt) as the test split, grayscale JPEGs as RGB."""
    (tmp_path / "tiny-imagenet").mkdir()
    archive = tmp_path / "tiny-imagenet" / "tiny-imagenet-200.zip"
    tr_x, tr_y, te_x, te_y = _make_tiny_imagenet(archive)
    _install(monkeypatch, "tiny-imagenet", archive=(archive.name, hashlib.md5(archive.read_bytes()).hexdigest()))
    d = load_dataset("tiny-imagenet", data_dir=tmp_path)
    assert (d.n_classes, d.image_shape, d.train_x.shape, d.test_x.shape) == (200, (3, 64, 64), (400, 12288), (200, 12288))
    assert d.train_y.tolist() == tr_y and d.test_y.tolist() == te_y
    np.testing.assert_allclose(d.train_x.numpy() * 255, tr_x, atol=3)   # JPEG rounding of a constant colour
    np.testing.assert_allclose(d.test_x.numpy() * 255, te_x, atol=3)
    assert not (tmp_path / "tiny-imagenet" / "tiny-imagenet-200").exists(), "the zip is read in place"
    assert "verified" in datasets.describe("tiny-imagenet", tmp_path)
    archive.write_bytes(archive.read_bytes()[:-100])
    datasets._load_cached.cache_clear()
    with pytest.raises(DataError, match="Checksum mismatch"):
        load_dataset("tiny-imagenet", data_dir=tmp_path)
    with pytest.raises(DataError, match="Corrupt or truncated archive"):   # even when opted in
        load_dataset("tiny-imagenet", data_dir=tmp_path, allow_unverified=True)


@pytest.mark.parametrize("damage, msg", [("no-annotations", "has no tiny-imagenet-200/val/val_annotations.txt"),
                                         ("bad-jpeg", "Corrupt Tiny ImageNet image .*val/images/val_3.JPEG"),
                                         ("small", "val_3.JPEG: size 32×32, expected 64×64")])
def test_tiny_imagenet_damaged(tmp_path, monkeypatch, damage, msg):
    (tmp_path / "tiny-imagenet").mkdir()
    archive = tmp_path / "tiny-imagenet" / "tiny-imagenet-200.zip"
    _make_tiny_imagenet(archive, per_class=1, damage=damage)
    _install(monkeypatch, "tiny-imagenet", archive=(archive.name, hashlib.md5(archive.read_bytes()).hexdigest()))
    with pytest.raises(DataError, match=msg):
        load_dataset("tiny-imagenet", data_dir=tmp_path)


def test_tiny_imagenet_extracted_folder_needs_the_opt_in(tmp_path):
    """Only the zip has a published checksum: an extracted folder is refused in one line, read with the opt-in."""
    import zipfile

    from inferlearn.errors import UnverifiedDataWarning

    archive = tmp_path / "tiny-imagenet-200.zip"
    tr_x, _, _, te_y = _make_tiny_imagenet(archive, per_class=1)
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "tiny-imagenet")
    archive.unlink()
    with pytest.raises(DataError, match="cannot be verified.*--allow-unverified") as err:
        load_dataset("tiny-imagenet", data_dir=tmp_path)
    assert "\n" not in str(err.value)
    assert datasets.describe("tiny-imagenet", tmp_path).startswith("UNVERIFIABLE")
    with pytest.warns(UnverifiedDataWarning):
        d = load_dataset("tiny-imagenet", data_dir=tmp_path, allow_unverified=True)
    assert d.test_y.tolist() == te_y and d.train_x.shape == (200, 12288)


def test_fetch_tiny_imagenet_verifies_the_zip_and_keeps_it(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _make_tiny_imagenet(mirror / "tiny-imagenet-200.zip", per_class=1)
    _install(monkeypatch, "tiny-imagenet", archive=("tiny-imagenet-200.zip", "0" * 32))
    with pytest.raises(DataError, match="(?s)Could not fetch.*Checksum mismatch"):
        datasets.fetch("tiny-imagenet", tmp_path / "bad", progress=False, mirrors=(mirror.as_uri() + "/",))
    assert not (tmp_path / "bad" / "tiny-imagenet" / "tiny-imagenet-200.zip").exists(), "a bad download was kept"
    md5_ = hashlib.md5((mirror / "tiny-imagenet-200.zip").read_bytes()).hexdigest()
    _install(monkeypatch, "tiny-imagenet", archive=("tiny-imagenet-200.zip", md5_))
    folder = datasets.fetch("tiny-imagenet", tmp_path / "dest", progress=False, mirrors=(mirror.as_uri() + "/",))
    assert folder == tmp_path / "dest" / "tiny-imagenet" and (folder / "tiny-imagenet-200.zip").is_file()
    assert load_dataset("tiny-imagenet", data_dir=tmp_path / "dest").n_classes == 200
