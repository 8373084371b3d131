"""Reliability, round four (issue 34): a full disk loses nothing, no option is silently ignored, every file
read is validated, and every misuse of the Python API is refused in one line.

Every case is a real run or call. The command-line cases are one table (:data:`CLI_CASES`): the arguments and
the fragment the one-line message must hold; each must exit with code 2 and print no traceback.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import inferlearn.atomic as atomic
from inferlearn.cli import main

T = ["train", "--data", "digits", "--arch", "64-16-10", "--epochs", "3", "--quiet", "--limit-train", "200"]
A = ["admm", "--data", "digits", "--arch", "64-16-10", "--epochs", "3", "--quiet", "--limit-train", "200"]


def cli(args) -> tuple[int, str, str]:
    """Run the command line in this process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    except SystemExit as exc:   # argparse's own refusals
        rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def one_line_error(rc: int, err: str, *fragments: str) -> str:
    """Assert exit code 2 and one ``inferlearn: error:`` line holding every fragment; returns the line."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("inferlearn: error:"), err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def metrics(folder: Path) -> list[dict]:
    """``metrics.jsonl`` without the timings (which differ between runs)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]


# --------------------------------------------------------------------------------------------------------------
# 1. A full disk (or an I/O error) on every write


class _FullDisk:
    """A file object whose ``write`` puts half of the bytes on disk, then fails with ``ENOSPC``."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def write(self, data):
        self.fh.write(bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, key):
        return getattr(self.fh, key)


def fill_disk(monkeypatch, name: str, after: int = 0, code: int = errno.ENOSPC) -> None:
    """Make the writes of files whose name contains ``name`` (a temporary ``.NAME.*.tmp`` of an atomic write, or
    an appended file) fail, after the first ``after`` of them succeed."""
    real, seen = open, [0]

    def fake_open(path, mode="r", *args, **kwargs):
        fh = real(path, mode, *args, **kwargs)
        if name in Path(path).name and any(m in mode for m in "wa"):
            seen[0] += 1
            if seen[0] > after:
                if code == errno.ENOSPC:
                    return _FullDisk(fh)
                fh.close()
                raise OSError(code, os.strerror(code))
        return fh

    monkeypatch.setattr(atomic, "open", fake_open, raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 3-epoch train and admm runs, to compare resumed runs with."""
    root = tmp_path_factory.mktemp("reference")
    assert cli([*T, "--out", root / "train"])[0] == 0
    assert cli([*A, "--out", root / "admm"])[0] == 0
    return root


@pytest.mark.parametrize("command", ["train", "admm"])
@pytest.mark.parametrize("target, after", [("checkpoint.pt", 1), ("metrics.jsonl", 2), ("curves.png", 0)])
def test_full_disk_loses_nothing_and_resumes_exactly(reference, tmp_path, monkeypatch, command, target, after):
    """The write of epoch 2's checkpoint (or its metrics line, or the final plot) meets a full disk: one line
    naming the file, the space needed and how to continue; the previous files are intact (a cut metrics line is
    removed); ``--resume`` then gives the uninterrupted run's metrics."""
    base = T if command == "train" else A
    out = tmp_path / "run"
    fill_disk(monkeypatch, target, after=after)
    rc, _, err = cli([*base, "--out", out])
    line = one_line_error(rc, err, f"Cannot write {out / target}", "the disk is full", "free on",
                          f"inferlearn {command} --resume {out}")
    assert "needs about" in line
    assert not list(out.glob(".*.tmp")), "a temporary file was left behind"
    done = metrics(out)
    expect = metrics(reference / command)
    assert done == expect[:len(done)] and len(done) >= 1 and all(json.loads(x) for x in
                                                                    (out / "metrics.jsonl").read_text().splitlines())
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["epoch"] in (1, 2, 3)
    monkeypatch.undo()
    rc, _, err = cli([command, "--resume", out, "--quiet"])
    assert rc == 0, err
    assert metrics(out) == expect


def test_io_error_names_the_file(tmp_path, monkeypatch):
    """An I/O error other than a full disk names the file and the error (no free-space advice)."""
    fill_disk(monkeypatch, "config.json", code=errno.EIO)
    out = tmp_path / "run"
    rc, _, err = cli([*T, "--out", out])
    one_line_error(rc, err, f"Cannot write {out / 'config.json'}", "Input/output error")


@pytest.mark.parametrize("after", [0, 3], ids=["first-event", "mid-run"])
def test_tensorboard_on_a_full_disk(tmp_path, monkeypatch, after):
    """TensorBoard's background writer meets a full disk (at its first event, or after a few): one line naming
    the log folder, no thread traceback; the run folder is intact and resumes."""
    pytest.importorskip("tensorboard")
    from tensorboard.summary.writer import record_writer

    real, seen = record_writer.RecordWriter.write, [0]

    def full(self, data):
        seen[0] += 1
        if seen[0] > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    out, board = tmp_path / "run", tmp_path / "tb"
    rc, _, err = cli([*T, "--out", out, "--tensorboard", board])
    one_line_error(rc, err, f"Cannot write {board}", "the disk is full")
    assert "Exception in thread" not in err
    monkeypatch.undo()
    if (out / "checkpoint.pt").exists():
        assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] >= 1
    assert cli(["train", "--resume", out, "--quiet"])[0] == 0
