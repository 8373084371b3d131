"""The run of block-ADMM: the training loop over epochs with run folders, checkpoints and resume
(:func:`train_admm`), its data (:class:`RunData`), evaluation and the online mode's augmentation."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..errors import DivergenceError, RunFolderError
from ..training.run_folder import RunFolder
from .config import loss_sum
from .trainer import BlockADMM


def random_shift(max_shift: int, image_shape: Sequence[int]) -> Callable:
    """Augmentation for online block-ADMM: shift each image by up to ``max_shift`` pixels (zero fill).

    Returns ``transform(x, generator)``; ``x`` is ``(B, C, H, W)`` or flat ``(B, C·H·W)``.
    """
    C, H, W = image_shape

    def transform(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        flat = x.dim() == 2
        img = x.reshape(x.shape[0], C, H, W)
        shifts = torch.randint(-max_shift, max_shift + 1, (x.shape[0], 2), generator=generator)
        p = max_shift
        padded = F.pad(img, (p, p, p, p))
        # Gather each shifted window with one advanced-indexing call (no per-image Python loop).
        rows = p + shifts[:, :1] + torch.arange(H)  # (B, H)
        cols = p + shifts[:, 1:] + torch.arange(W)  # (B, W)
        b = torch.arange(x.shape[0])[:, None, None]
        out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        return out.reshape(x.shape) if flat else out

    return transform


# ---------------------------------------------------------------------- trainer with run folder
@dataclass
class RunData:
    """Training and test tensors for :func:`train_admm` (inputs already shaped for the first block)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    transform: Callable | None = None


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=1).cpu() == labels.cpu()).float().mean())


def evaluate(trainer: BlockADMM, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Loss (per-sample mean) and accuracy (classification losses) of the plain forward pass."""
    out = trainer.predict(x)
    with torch.no_grad():
        loss = float(loss_sum(trainer.cfg.loss, out, y.to(out.device))) / x.shape[0]
    res = {"loss": loss}
    if trainer.cfg.loss != "mse" and not callable(trainer.cfg.loss):
        res["acc"] = _accuracy(out, y)
    return res


def train_admm(trainer: BlockADMM, data: RunData, epochs: int, out: str | os.PathLike | None = None,
               resume: bool = False, progress: bool = True, run_config: dict | None = None,
               eval_train_limit: int = 10000, log: Callable[[str], None] | None = None,
               tensorboard: str | None = None) -> list[dict]:
    """Train for ``epochs`` outer iterations into the run folder of ``inferlearn train``
    (:class:`~inferlearn.training.run_folder.RunFolder`).

    Writes ``config.json``, ``metrics.jsonl`` (the common fields, plus residuals and penalties) and an
    atomic checkpoint ``checkpoint.pt`` (blocks, optimisers, ``Z``, ``U``, duals, penalties, RNG and the
    metric history) after every epoch, and ``curves.png`` at the end. ``resume=True`` continues from the checkpoint exactly (same result as an
    uninterrupted run); metrics lines newer than the checkpoint are dropped.

    Args:
        log: called with one summary line per epoch (``None``: silent), as ``inferlearn train`` prints.
        tensorboard: a TensorBoard log folder (:mod:`inferlearn.training.tensorboard`), or ``None``.

    Raises:
        DivergenceError: non-finite losses or residuals, naming the epoch and the last good checkpoint.
    """
    if not (isinstance(epochs, int) and epochs >= 0):
        raise ValueError(f"Invalid epochs: {epochs}")
    main = trainer.is_main   # over ranks: rank 0 writes, every rank computes
    # rank 0 locks the folder for the run's lifetime, probes it and removes leftover temporaries
    folder = RunFolder(out, writer=main) if out is not None else None
    try:
        if folder is not None:
            trainer.placement.barrier()   # rank 0 has probed the folder before the others read it
        return _train_admm(trainer, data, epochs, folder, main, resume, progress, run_config, eval_train_limit, log,
                           tensorboard)
    finally:
        if folder is not None:
            folder.close()


def _train_admm(trainer: BlockADMM, data: RunData, epochs: int, folder: RunFolder | None, main: bool, resume: bool,
                progress: bool, run_config: dict | None, eval_train_limit: int, log, tensorboard: str | None) -> list[dict]:
    if not main:
        log, progress, tensorboard = None, False, None
    if trainer.cfg.mode == "batch":
        trainer.init_state(data.train_x, data.train_y)
    history: list[dict] = []
    if folder is not None:
        if resume:
            ckpt = folder.load_checkpoint(note=log)
            if ckpt is None:
                raise FileNotFoundError(f"--resume: no checkpoint at {folder.checkpoint_path}")
            try:
                trainer.load_state_dict(ckpt["state"])
            except (RuntimeError, KeyError) as exc:   # blocks of another shape (ValueErrors already say what)
                detail = [line.strip() for line in str(exc).splitlines() if line.strip()]
                raise RunFolderError(f"{folder.checkpoint_path} does not fit this run's blocks "
                                     f"({(detail[1] if len(detail) > 1 else detail[0] if detail else type(exc).__name__)[:200]}); "
                                     "resume with the settings that wrote it, or start again with --overwrite") from None
            history = [m for m in ckpt["history"] if m["epoch"] <= trainer.iteration]
        trainer.placement.barrier()   # every rank has read the checkpoint before rank 0 writes
    if folder is not None and main:
        folder.start({**(run_config or {}), "admm": asdict(trainer.cfg) if not callable(trainer.cfg.loss) else None,
                      "epochs": epochs, **trainer.memory_bytes()}, history)

    board = None
    if tensorboard:
        from ..training.tensorboard import TensorBoardLogger
        board = TensorBoardLogger(tensorboard, tuple(data.train_x.shape[1:]))

    def last_good(k):
        return f"{folder.checkpoint_path} (epoch {k - 1})" if folder is not None and folder.checkpoint_path.exists() else "none"

    try:
        from tqdm import tqdm
        bar = tqdm(total=epochs, initial=trainer.iteration, desc=f"block-ADMM ({trainer.cfg.mode})",
                   disable=not progress)
    except ImportError:  # tqdm is a dependency; this only guards minimal installs
        bar = None
    while trainer.iteration < epochs:
        k = trainer.iteration + 1
        t0 = time.perf_counter()
        try:
            if trainer.cfg.mode == "batch":
                m = trainer.epoch()
            else:
                m = trainer.epoch(data.train_x, data.train_y, data.transform)
        except DivergenceError as exc:
            raise DivergenceError(f"Block-ADMM diverged in epoch {k}: {exc}; last good checkpoint: {last_good(k)}") from exc
        dt = time.perf_counter() - t0
        n_tr = min(eval_train_limit, data.train_x.shape[0])
        tr = evaluate(trainer, data.train_x[:n_tr], data.train_y[:n_tr])
        te = evaluate(trainer, data.test_x, data.test_y)
        if not math.isfinite(tr["loss"]):
            raise DivergenceError(f"Block-ADMM diverged in epoch {k}: training loss {tr['loss']}; "
                                  f"last good checkpoint: {last_good(k)}")
        rec = {"epoch": k, "epoch_seconds": dt, **m, **{f"train_{a}": v for a, v in tr.items()},
               **{f"test_{a}": v for a, v in te.items()}, **trainer.memory_bytes()}
        history.append(rec)
        if folder is not None:
            state = trainer.state_dict()   # a collective in block-parallel runs
            if main:
                folder.record(rec, {"epoch": k, "state": state, "history": history})
        if board is not None:
            board.log_epoch(rec, [m for b in trainer.blocks for m in b.modules()])
        if log:
            line = (f"epoch {k:3d}  loss {tr['loss']:.4f}  train {tr.get('acc', float('nan')):.4f}  "
                    f"test {te.get('acc', float('nan')):.4f}  {dt:.1f}s")
            (bar.write if bar is not None and not bar.disable else log)(line)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{tr['loss']:.4f}", test_acc=f"{te.get('acc', float('nan')):.4f}")
    if bar is not None:
        bar.close()
    if board is not None:
        board.close()
    if folder is not None and main:
        folder.plot(history, f"block-ADMM ({trainer.cfg.mode})", title="block-ADMM")
    trainer.placement.barrier()   # nobody tears the group down before rank 0 has written everything
    return history
