"""Crash-safe file writes: write to a temporary file in the same folder, fsync, then ``os.replace``.

A reader (or a resumed run) therefore sees either the old complete file or the new complete file,
never a partial one -- even after ``kill -9`` in the middle of a write.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import torch


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; on success it atomically replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_torch(obj, path: str | os.PathLike) -> None:
    """``torch.save`` atomically."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(obj, path: str | os.PathLike) -> None:
    """Write JSON (indented, sorted keys) atomically."""
    write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def append_jsonl(record: dict, path: str | os.PathLike) -> None:
    """Append one JSON line and fsync (a crash loses at most this line, never earlier ones)."""
    with open(path, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file, ignoring a truncated last line (from a crash mid-write)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out
