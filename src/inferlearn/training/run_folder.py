"""The run folder shared by every trainer (``inferlearn train``, ``compare``, ``admm``).

Layout::

    config.json      what the run was started with (written atomically)
    metrics.jsonl    one JSON object per finished epoch, the same field names for every trainer
    checkpoint.pt    the trainer's state and the metric history up to it (written atomically)
    curves.png       learning curves

Invariants: a checkpoint is written before the metrics line of its epoch (metrics never run ahead
of the state they describe), and on resume ``metrics.jsonl`` is rebuilt from the checkpoint's own
history, so epochs that finished after the last checkpoint are re-run and never listed twice.

Metric fields every trainer writes: ``epoch`` (1-based), ``train_loss``, ``epoch_seconds``, and for
classification ``train_acc`` and ``test_acc``; trainers add their own (``batch_loss`` and ``active_fraction`` for
the rules, residuals and penalties for block-ADMM).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..atomic import append_jsonl, save_torch, write_json, write_text
from ..plots import plot_curves

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
COMMON_FIELDS = ("epoch", "train_loss", "epoch_seconds")


class RunFolder:
    """A run's output folder: config, metrics, atomic checkpoints, curves.

    Args:
        path: the folder (created if missing).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    def load_checkpoint(self, map_location=None) -> dict | None:
        """The last checkpoint (``{"state": …, "history": […], …}``) or ``None`` if there is none."""
        if not self.checkpoint_path.exists():
            return None
        return torch.load(self.checkpoint_path, map_location=map_location, weights_only=False)

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
            save_torch(checkpoint, self.checkpoint_path)
        append_jsonl(record, self.path / METRICS)

    def last_good(self) -> str:
        """The checkpoint to name in a divergence message (``none`` before the first one)."""
        return str(self.checkpoint_path) if self.checkpoint_path.exists() else "none"

    def plot(self, history: list[dict], label: str, title: str) -> None:
        """Write ``curves.png`` (nothing for an empty history)."""
        if history:
            plot_curves({label: history}, self.path / "curves.png", title=title)
