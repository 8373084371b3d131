"""The run folder shared by every trainer (``inferlearn train``, ``compare``, ``admm``).

Layout::

    config.json      what the run was started with (written atomically)
    metrics.jsonl    one JSON object per finished epoch, the same field names for every trainer
    checkpoint.pt    the trainer's state and the metric history up to it (written atomically)
    curves.png       learning curves

Lock: a process that writes the folder holds an advisory ``fcntl.flock`` on ``.lock`` (which names its
PID) for as long as it runs, so a second run or ``--resume`` into the same folder is refused in one line
instead of interleaving ``metrics.jsonl`` or deleting the other's half-written checkpoint. The lock
goes with the process (``kill -9`` included); the processes of a ``--nproc`` run work under their
launcher's lock.

Integrity: a checkpoint stores the SHA-256 of its contents (every tensor's bytes, dtype and shape, and
every other value; :func:`payload_digest`) under ``payload_sha256``, and loading recomputes it: a
checkpoint changed on disk after it was written (flipped bytes that still unpickle) is refused in one
line instead of resuming with altered weights. Checkpoints of older versions, without the key, still
load, with a note.

Invariants: a checkpoint is written before the metrics line of its epoch (metrics never run ahead
of the state they describe), and on resume ``metrics.jsonl`` is rebuilt from the checkpoint's own
history, so epochs that finished after the last checkpoint are re-run and never listed twice.

Metric fields every trainer writes: ``epoch`` (1-based), ``train_loss``, ``epoch_seconds``, and for
classification ``train_acc`` and ``test_acc``; trainers add their own (``batch_loss`` and ``active_fraction`` for
the rules, residuals and penalties for block-ADMM).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import pickle
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..atomic import append_jsonl, save_torch, write_json, write_text
from ..errors import RunFolderError
from ..plots import plot_curves

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
LOCK = ".lock"
CHECKSUM = "payload_sha256"
COMMON_FIELDS = ("epoch", "train_loss", "epoch_seconds")
_RECOVER = ("copy a previous checkpoint over it if you keep one and --resume again, or delete it to restart "
            "the run from scratch")

#: the run folders this process holds locked: real path -> [file descriptor, RunFolder objects using it]
_HELD: dict[str, list[int]] = {}


def payload_digest(obj) -> str:
    """SHA-256 (hex) of a checkpoint's contents: nested dicts, lists and tuples of tensors and plain values.

    Tensors contribute their dtype, shape and bytes (read on the CPU, so a checkpoint loaded onto another
    device has the same digest); dicts their items in order (``torch.load`` keeps it); other values a
    typed text or pickle. The same contents give the same digest in any process.
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(f"{{{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'[' if isinstance(obj, list) else '('}{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, (set, frozenset)):   # pickled sets need not keep their order
        h.update(f"<{len(obj)}".encode())
        for d in sorted(payload_digest(v) for v in obj):
            h.update(d.encode())
    elif isinstance(obj, str):
        h.update(f"s{len(obj)}:".encode() + obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, bytes):
        h.update(f"b{len(obj)}:".encode() + obj)
    elif obj is None or isinstance(obj, (bool, int)):
        h.update(f"v{obj!r};".encode())
    elif isinstance(obj, float):
        h.update(f"f{obj.hex()};".encode())
    elif isinstance(obj, (torch.dtype, torch.device)):
        h.update(f"t{obj};".encode())
    else:
        h.update(b"p" + pickle.dumps(obj, protocol=4))


def _holder_pid(fd: int) -> int | None:
    """The PID written in a lock file whose lock another process holds (it writes it just after locking)."""
    for _ in range(25):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
        if text.isdigit():
            pid = int(text)
            try:
                os.kill(pid, 0)
                return pid
            except PermissionError:
                return pid
            except OSError:
                pass   # a previous holder's PID, not yet overwritten
        time.sleep(0.02)
    return None


def lock_folder(path: Path) -> str | None:
    """Lock the run folder ``path`` for this process (re-entrant); the key for :func:`unlock_folder`.

    ``None``: nothing to unlock (the folder is held by this process's launcher, or the file system has
    no locks).

    Raises:
        RunFolderError: another process holds the folder (naming its PID).
        OSError: the lock file cannot be created.
    """
    from ..distributed.launch import LAUNCHER_PID

    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder_pid(fd)
        os.close(fd)
        if pid is not None and str(pid) == os.environ.get(LAUNCHER_PID) and pid == os.getppid():
            return None   # a process of a --nproc run: its launcher holds the folder for it
        who = f"PID {pid}" if pid is not None else "its PID unknown"
        raise RunFolderError(f"{path} is in use by another inferlearn run ({who}); wait for it to finish"
                             + (f" or stop it (kill {pid})" if pid is not None else "")
                             + ", or choose another folder") from None
    except OSError:   # a file system without flock (some network mounts): go on unlocked
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = [fd, 1]
    return key


def unlock_folder(key: str | None) -> None:
    """Release one use of a lock taken by :func:`lock_folder` (the last one unlocks the folder)."""
    if key is None or key not in _HELD:
        return
    _HELD[key][1] -= 1
    if _HELD[key][1] <= 0:
        os.close(_HELD.pop(key)[0])


class RunFolder:
    """A run's output folder: config, metrics, atomic checkpoints, curves.

    Args:
        path: the folder (created if missing).
        writer: this process writes the folder: it locks it (until :meth:`close`, or the process ends),
            checks that it can write it and removes leftover temporaries. The other processes of a
            parallel run only read it (``False``), so they never touch a file that the writer is writing.

    Raises:
        RunFolderError: an empty path, a file, a folder that cannot be written, or one that another
            process is using (naming its PID).
    """

    def __init__(self, path: str | Path, writer: bool = True):
        if isinstance(path, str) and not path.strip():
            raise RunFolderError(f"Invalid output folder {path!r}: give a folder name, e.g. --out runs/train")
        self.path = Path(path)
        self._lock: str | None = None
        self._created = False
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"Output folder {self.path} is a file; choose another --out")
        self.removed_temporaries: list[str] = []
        if not writer:   # another process of a parallel run writes the folder: only read it
            return
        try:
            self._created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = lock_folder(self.path)
            probe = self.path / f".write-test.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise RunFolderError(f"Cannot write to output folder {self.path} ({exc.strerror}); choose another --out") from None
        self.removed_temporaries = self._clean_temporaries()

    def close(self) -> None:
        """Release this object's hold on the folder's lock (idempotent). A folder this object created and
        nothing was written to (the run was refused or failed first) is removed: nothing is left behind."""
        key, self._lock = self._lock, None
        if key is not None and self._created and _HELD.get(key, [0, 0])[1] == 1:
            try:   # still locked: nobody else writes here; rmdir only succeeds on an empty folder
                if {p.name for p in self.path.iterdir()} <= {LOCK}:
                    (self.path / LOCK).unlink(missing_ok=True)
                    self.path.rmdir()
            except OSError:
                pass
        unlock_folder(key)

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _clean_temporaries(self) -> list[str]:
        """Delete the temporary files an interrupted atomic write left behind (``.NAME.*.tmp``)."""
        removed = []
        for tmp in self.path.glob(".*.tmp"):
            try:
                tmp.unlink()
                removed.append(tmp.name)
            except OSError:
                pass
        return removed

    def discard_unstarted(self) -> None:
        """Remove the config and empty metrics of a new run that failed before its first epoch was recorded
        (a rule that refuses the model at its first step): a refused run leaves nothing behind."""
        metrics = self.path / METRICS
        if self.checkpoint_path.exists() or (metrics.exists() and metrics.stat().st_size > 0):
            return
        for f in (CONFIG, METRICS):
            (self.path / f).unlink(missing_ok=True)

    def holds_run(self) -> bool:
        """True when the folder holds (part of) a run: a config, metrics or a checkpoint."""
        return any((self.path / f).exists() for f in (CONFIG, METRICS, CHECKPOINT))

    def refuse_overwrite(self, overwrite: bool) -> None:
        """Raise :class:`RunFolderError` if the folder holds a run and ``overwrite`` is not set."""
        if self.holds_run() and not overwrite:
            raise RunFolderError(f"{self.path} already holds a run; continue it with --resume {self.path}, "
                                 "replace it with --overwrite, or choose another --out")
        if overwrite:
            for f in (CONFIG, METRICS, CHECKPOINT, "curves.png"):
                (self.path / f).unlink(missing_ok=True)

    def read_config(self) -> dict:
        """The run's ``config.json`` (:class:`RunFolderError` naming the file when missing or damaged)."""
        path = self.path / CONFIG
        if not path.exists():
            raise RunFolderError(f"{path} does not exist: the run never started (or {self.path} is not a run "
                                 "folder); start it again without --resume")
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RunFolderError(f"{path} is damaged ({exc}); fix or delete it and start the run again") from None

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def load_checkpoint(self, map_location=None, note: Callable[[str], None] | None = None) -> dict | None:
        """The last checkpoint (``{"state": …, "history": […], …}``, its checksum verified and removed) or
        ``None`` if there is none.

        Args:
            note: called with one line when the checkpoint has no checksum (an older version wrote it).

        Raises:
            RunFolderError: the file exists but cannot be read (truncated, not a checkpoint), or its
                contents do not match its checksum.
        """
        if not self.checkpoint_path.exists():
            return None
        path = self.checkpoint_path
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as exc:   # truncated zip, unpickling errors, EOF: all mean a damaged file
            raise RunFolderError(f"Checkpoint {path} is damaged ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                                 f"{_RECOVER}") from None
        if not isinstance(ckpt, dict) or "history" not in ckpt:
            raise RunFolderError(f"{path} is not a checkpoint of this kind of run; "
                                 "delete it or choose another folder")
        stored = ckpt.pop(CHECKSUM, None)
        if stored is None:
            if note is not None:
                note(f"note: {path} has no checksum (written by an older inferlearn); it is loaded unverified")
        elif stored != payload_digest(ckpt):
            raise RunFolderError(f"Checkpoint {path} is corrupted: its contents do not match the checksum stored "
                                 f"with it (changed on disk after it was written); {_RECOVER}") from None
        return ckpt

    def start(self, config: dict, history: list[dict]) -> None:
        """Write ``config.json`` and rewrite ``metrics.jsonl`` from ``history`` (empty for a new run)."""
        write_json(config, self.path / CONFIG)
        write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history), self.path / METRICS)

    def record(self, record: dict, checkpoint: dict | None = None) -> None:
        """Finish an epoch: the checkpoint first (if given, written atomically), then its metrics line."""
        missing = [f for f in COMMON_FIELDS if f not in record]
        if missing:
            raise KeyError(f"metrics record lacks the common fields {missing}")
        if checkpoint is not None:
            save_torch({**checkpoint, CHECKSUM: payload_digest(checkpoint)}, self.checkpoint_path)
        append_jsonl(record, self.path / METRICS)

    def last_good(self) -> str:
        """The checkpoint to name in a divergence message (``none`` before the first one)."""
        return str(self.checkpoint_path) if self.checkpoint_path.exists() else "none"

    def plot(self, history: list[dict], label: str, title: str) -> None:
        """Write ``curves.png`` (nothing for an empty history)."""
        if history:
            plot_curves({label: history}, self.path / "curves.png", title=title)
