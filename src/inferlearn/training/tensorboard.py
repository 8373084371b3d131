"""Experiment tracking with TensorBoard (``--tensorboard DIR``): scalars, weight histograms, filters.

Per epoch: every numeric metric of the run folder's record as a scalar (``train_loss``, ``test_acc``, …),
a histogram of every parameter, and the first layer's filters as an image (an ``nn.Linear`` on images:
each row as an image; an ``nn.Conv2d``: each output channel's kernel, averaged over input channels).
Uses ``torch.utils.tensorboard`` (the ``tensorboard`` package); view with ``tensorboard --logdir DIR``.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from ..atomic import NO_SPACE, write_error
from ..errors import RunFolderError
from ..plots import tile


def _tile(filters: torch.Tensor) -> torch.Tensor:
    """``(n, h, w)`` filters, each scaled to [0, 1] by its own range, tiled into one ``(1, H, W)`` image."""
    n, h, w = filters.shape
    f = filters.detach().float().cpu()
    lo, hi = f.flatten(1).amin(1).view(n, 1, 1), f.flatten(1).amax(1).view(n, 1, 1)
    return tile((f - lo) / (hi - lo).clamp_min(1e-12)).unsqueeze(0)


def first_layer_filters(modules: Iterable[nn.Module], image_shape: Sequence[int], n: int = 64) -> torch.Tensor | None:
    """The first ``Linear`` or ``Conv2d`` layer's filters as one image ``(1, H, W)``, or ``None``."""
    c, h, w = (tuple(image_shape) + (1, 1, 1))[:3] if len(image_shape) == 3 else (1, *image_shape)
    for m in modules:
        if isinstance(m, nn.Conv2d):
            return _tile(m.weight[:n].mean(dim=1))
        if isinstance(m, nn.Linear):
            if m.in_features != c * h * w:
                return None
            return _tile(m.weight[:n].reshape(-1, c, h, w).mean(dim=1))
    return None


class TensorBoardLogger:
    """Writes one run's epochs to a TensorBoard log folder.

    Args:
        log_dir: the folder (``--tensorboard DIR``).
        image_shape: ``(C, H, W)`` of one input, to draw first-layer filters.

    Raises:
        RunFolderError: the ``tensorboard`` package is not installed (the message says how to get it).
        WriteError: (from :meth:`log_epoch` and :meth:`close`) the log cannot be written (a full disk, ...), in
            one line naming the folder; the writer's background thread stays silent (no thread traceback).
    """

    def __init__(self, log_dir: str, image_shape: Sequence[int]):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise RunFolderError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
        _silence_writer_threads()
        try:
            self.writer = SummaryWriter(log_dir=str(log_dir))
        except OSError as exc:   # a full disk; a file, /proc/..., a read-only place
            if exc.errno in NO_SPACE:
                raise write_error(log_dir, exc) from None
            raise RunFolderError(f"Cannot write TensorBoard logs to {log_dir} ({exc.strerror}); choose another "
                                 "--tensorboard") from None
        self.log_dir = str(log_dir)
        self.image_shape = tuple(image_shape)

    def log_epoch(self, record: dict, modules: Iterable[nn.Module]) -> None:
        """Scalars of ``record``, histograms of the parameters and the first layer's filters at ``record["epoch"]``."""
        try:
            self._log_epoch(record, modules)
        except OSError as exc:
            raise write_error(self.log_dir, exc) from None

    def _log_epoch(self, record: dict, modules: Iterable[nn.Module]) -> None:
        step = int(record["epoch"])
        for key, value in record.items():
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        modules = list(modules)
        for i, m in enumerate(modules):
            for name, p in m.named_parameters(recurse=False):
                if p.numel():
                    self.writer.add_histogram(f"params/{i}.{type(m).__name__}.{name}", p.detach().float().cpu(), step)
        image = first_layer_filters(modules, self.image_shape)
        if image is not None:
            self.writer.add_image("first_layer_filters", image, step)
        self.writer.flush()

    def close(self) -> None:
        try:
            self.writer.close()
        except OSError as exc:
            raise write_error(self.log_dir, exc) from None


def _silence_writer_threads() -> None:
    """Keep ``threading.excepthook`` from printing a traceback when TensorBoard's background writer fails on an
    ``OSError``: the writer re-raises it in the training thread, which reports it in one line."""
    hook = threading.excepthook
    if getattr(hook, "inferlearn", False):
        return

    def quiet(args):
        if not (issubclass(args.exc_type, OSError) and type(args.thread).__name__ == "_AsyncWriterThread"):
            hook(args)

    quiet.inferlearn = True
    threading.excepthook = quiet
