"""Crash-safe file writes: write to a temporary file in the same folder, fsync, then ``os.replace``.

A reader (or a resumed run) therefore sees either the old complete file or the new complete file,
never a partial one -- even after ``kill -9`` in the middle of a write.

A write that fails (a full disk, a quota, an I/O error) raises :class:`~inferlearn.errors.WriteError` in one
line naming the file, the space it needs and the space left, and leaves the previous file as it was.
Checkpoints are serialised in memory first, so the size is known and ``torch.save`` never meets the disk
(on a full disk it fails with an opaque ``inline_container.cc`` error instead of ``OSError``).
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .errors import WriteError

#: the errors that mean the disk (or the user's quota) has no room left
NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KB`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def write_error(path: str | os.PathLike, exc: OSError, size: int | None = None) -> WriteError:
    """The one-line :class:`WriteError` for an ``OSError`` met while writing ``path`` (``size``: bytes it needs)."""
    path = Path(path)
    folder = next((p for p in (path.parent, *path.parents) if p.is_dir()), Path("."))
    try:
        free = human_bytes(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    keep = f"the previous {path.name} is intact" if path.exists() else "nothing was written"
    if exc.errno in NO_SPACE:
        need = f"about {human_bytes(size)}" if size is not None else "more room"
        why = f"the disk is full (it needs {need}, {free} free on {folder})"
        fix = "free some space there (or move the folder to another disk)"
    else:
        why = f"{exc.strerror or type(exc).__name__}" + (f" ({human_bytes(size)} to write, {free} free)"
                                                          if size is not None else "")
        fix = "check the disk and its permissions"
    return WriteError(f"Cannot write {path}: {why}; {keep}; {fix}", path=str(path))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, size: int | None = None):
    """Yield a temporary path next to ``path``; on success it atomically replaces ``path``.

    Raises:
        WriteError: the folder or the file cannot be written (``size``, the bytes to write, goes in the message);
            ``path`` keeps its previous contents.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise write_error(path, exc, size) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes(data: bytes | memoryview, path: str | os.PathLike) -> None:
    """Write bytes atomically (:class:`WriteError` naming ``path`` and ``len(data)`` when it fails)."""
    with atomic_path(path, size=len(data)) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)


def save_torch(obj, path: str | os.PathLike) -> None:
    """``torch.save`` atomically (serialised in memory first: a full disk gives a :class:`WriteError`)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes(buffer.getbuffer(), path)


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text file atomically."""
    write_bytes(text.encode(), path)


def format_json(obj, indent: int = 0, width: int = 110) -> str:
    """JSON with sorted keys, as a person reads it: any value whose compact form fits in ``width`` columns (a search
    point, a run's record, a list of epoch times) on one line, larger objects and lists indented by two spaces."""
    flat = json.dumps(obj, sort_keys=True)
    if len(flat) + indent <= width or not isinstance(obj, (dict, list, tuple)) or not obj:
        return flat
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f"{pad}  {json.dumps(str(k))}: {format_json(v, indent + 2, width)}"
                 for k, v in sorted(obj.items())]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if all(not isinstance(v, (dict, list, tuple)) for v in obj):   # a long list of numbers: wrapped, not one per line
        rows, row = [], []
        for v in obj:
            if row and len(json.dumps(row + [v])) + indent + 2 > width:
                rows.append(row)
                row = []
            row.append(v)
        rows.append(row)
        return "[\n" + ",\n".join(f"{pad}  " + json.dumps(r)[1:-1] for r in rows) + f"\n{pad}]"
    return "[\n" + ",\n".join(f"{pad}  {format_json(v, indent + 2, width)}" for v in obj) + f"\n{pad}]"


def write_json(obj, path: str | os.PathLike) -> None:
    """Write JSON (:func:`format_json`) atomically."""
    write_text(format_json(obj) + "\n", path)


def append_jsonl(record: dict, path: str | os.PathLike) -> None:
    """Append one JSON line and fsync (a crash loses at most this line, never earlier ones). A write that fails
    (:class:`WriteError`) cuts the file back to its earlier lines."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        with open(path, "ab", buffering=0) as fh:   # unbuffered: nothing is left to flush after a failure
            start = fh.tell()
            try:
                done = 0
                while done < len(line):
                    done += fh.write(line[done:])
                os.fsync(fh.fileno())
            except OSError:
                fh.truncate(start)
                raise
    except OSError as exc:
        raise write_error(path, exc, len(line)) from None


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
