"""One training loop for every rule: seeded, checkpointed, resumable, with progress bars.

Read it top to bottom: build data (standardised per channel when asked, :mod:`inferlearn.data.transforms`),
model, rule and optimiser from a :class:`TrainConfig`; for each epoch shuffle (seeded by ``(seed, epoch)``
so a resumed run sees the same batches), crop and flip each mini-batch when asked (from a seeded generator
whose state the checkpoint keeps), let the rule fill ``.grad``, step the optimiser, stop at once on a
non-finite loss or weight, evaluate, append the metrics, write an atomic checkpoint and the learning-curve PNG.

Data-parallel (``--nproc N`` or ``torchrun``): every rank builds the same model and draws the same
global batches; each computes its rule's gradient on its contiguous shard of the batch, the
gradients are averaged with the shard-size weights (:mod:`inferlearn.distributed.group`), and every
rank steps the same optimiser on the same gradient, so the weights stay identical. Evaluation is
sharded the same way; rank 0 alone writes the run folder.

Output folder::

    config.json      the TrainConfig (resume with ``inferlearn train --resume DIR``)
    metrics.jsonl    one JSON object per epoch
    checkpoint.pt    model, optimiser, epoch, metric history, the rule's per-sample state and the augmentation's
                     generator state (written atomically)
    curves.png       learning curves
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
import time
import contextlib
import warnings
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import TrainConfig
from ..data import Dataset, load_dataset
from ..data.transforms import CropFlip, channel_stats, standardize
from ..diagnostics import active_counts, correct_count, equilibrium_gap
from ..distributed import Group, join
from ..engine.compiled import (CompileWarning, compile_decisions, compile_failed, compile_seconds, compiled_calls,
                               compiling, measured_choices, planned_batches, replay_choices)
from ..errors import ConvergenceWarning, DivergenceError, InferlearnError, NonFiniteError, RunFolderError
from ..losses import check_labels, one_hot, quadratic_loss
from ..models import build_model
from ..tensors import all_finite
from .fused_step import FusedTrainStep
from ..rules import PerSampleRule, Rule, make_rule
from .run_folder import RunFolder
from .schedules import is_per_step, make_schedule
from .tensorboard import TensorBoardLogger

@dataclass
class Setup:
    """The objects a run trains: data (on the device), model, rule and optimiser."""

    data: Dataset
    model: torch.nn.Module
    rule: Rule
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    first_loss: float | None = None  # the run's first mini-batch loss, reference of the explosion test
    group: Group = dataclasses.field(default_factory=Group)   # data-parallel ranks (one by default)
    val_x: torch.Tensor | None = None  # the held-out validation split (``TrainConfig.val_size``), or None
    val_y: torch.Tensor | None = None
    augment: CropFlip | None = None   # ``TrainConfig.augment="crop-flip"``: the per-mini-batch crop and flip
    input_stats: tuple | None = None  # ``(mean, std)`` per channel of the standardisation, or None
    gap_warned: bool = False   # ``--check-equilibrium`` warned (once per run)


#: the augmentation generator's seed is ``seed · 100003 + AUGMENT_STREAM``, apart from every epoch's batch order
AUGMENT_STREAM = 100_002


def split_train(n_train: int, val_size: int, limit_train: int | None, data_name: str = "the data set") -> tuple[slice, slice]:
    """``(fit, val)`` slices of a training split of ``n_train`` images: the last ``val_size`` are held out
    (deterministic, independent of the seed), then ``limit_train`` keeps the first images of the rest.

    Raises:
        ValueError: ``val_size`` leaves no image to train on.
    """
    if val_size >= n_train:
        raise ValueError(f"--val {val_size} leaves no training images: {data_name} has {n_train} "
                         f"training images; hold out fewer")
    n_fit = n_train - val_size
    n = min(limit_train, n_fit) if limit_train else n_fit
    return slice(0, n), slice(n_fit, n_train)


def build(config: TrainConfig, group: Group | None = None) -> Setup:
    """Load data and build model, rule and optimiser; checks that the architecture fits the data.

    ``config.lr = None`` takes the rule's recommended rate and ``standardize="auto"`` its value for the data
    (:meth:`TrainConfig.resolved`). Standardisation uses the statistics of the split the run fits.
    """
    config = config.resolved()
    data = load_dataset(config.data, config.data_dir, allow_unverified=config.allow_unverified)
    rule = make_rule(config.rule, config.rule_options)
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    try:
        model = build_model(config.arch, config.act, data.n_features, data.n_classes, data.image_shape,
                            seed=config.seed, init_scale=config.init_scale, data_name=data.name)
    except (InferlearnError, ValueError):
        raise
    except Exception as exc:   # a user's builder (package.module:function) that raises
        raise ValueError(f"Building the model {config.arch!r} failed: {_first_line(exc)}") from None
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise ValueError(f"The model {config.arch!r} has tensors on the meta device (shapes without values); build it "
                         "with real tensors (e.g. not under torch.device('meta'))")
    model = model.to(device, dtype)
    fit, val = split_train(data.train_x.shape[0], config.val_size, config.limit_train, data.name)
    prepare, stats, fill = (lambda x: x.to(device, dtype)), None, None   # the inputs as the model takes them
    if config.standardize == "on":
        stats = channel_stats(data.train_x[fit], data.image_shape)
        fill = -stats[0] / stats[1]   # a black (raw 0) pixel, standardised: the augmentation's padding
        prepare = lambda x: standardize(x.to(device, dtype), *stats, data.image_shape)  # noqa: E731
    augment = (CropFlip(data.image_shape, config.seed * 100_003 + AUGMENT_STREAM, fill)
               if config.augment.startswith("crop-flip") else None)
    check_forward(model, prepare(data.train_x[:2]), data.n_classes, config.arch, data.name)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"The model {config.arch!r} has no trainable parameters (none, or all with "
                         "requires_grad=False): there is nothing to train")
    opt = make_optimizer(config, params)
    train_x, train_y = prepare(data.train_x[fit]), data.train_y[fit].to(device)
    check_training_data(train_x, train_y, data.n_classes, data.name)
    val_x = prepare(data.train_x[val]) if config.val_size else None
    val_y = data.train_y[val].to(device) if config.val_size else None
    schedule = make_schedule(config.lr_schedule, opt, config.epochs, math.ceil(train_x.shape[0] / config.batch_size))
    return Setup(data, model, rule, opt, schedule,
                 train_x, train_y, prepare(data.test_x), data.test_y.to(device), val_x=val_x, val_y=val_y,
                 group=group or Group(), augment=augment, input_stats=stats)


def check_training_data(x: torch.Tensor, y: torch.Tensor, n_classes: int, data_name: str) -> None:
    """Check the training split once, as the model takes it (so that :func:`run_epoch` can skip the rules'
    per-batch checks): finite inputs and integer labels in ``[0, n_classes)``.

    Raises:
        ValueError: non-finite inputs or labels out of range, naming the data set.
    """
    if not all_finite([x]):
        raise ValueError(f"{data_name}: the training inputs hold NaN or inf (after standardisation, if on); check the "
                         "data files")
    try:
        check_labels(y, n_classes, batch=x.shape[0])
    except ValueError as exc:
        raise ValueError(f"{data_name}: {exc}; check the data files") from None


def make_optimizer(config: TrainConfig, params: list) -> torch.optim.Optimizer:
    """``sgd`` (with ``momentum``), ``adam`` or ``adamw``, each with ``config.weight_decay`` (coupled L2 for
    the first two, decoupled for ``adamw``; see :class:`TrainConfig`)."""
    wd = config.weight_decay
    if config.optimizer == "sgd":
        cls, options = torch.optim.SGD, {"lr": config.lr, "momentum": config.momentum, "weight_decay": wd}
    else:
        cls, options = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam, {"lr": config.lr, "weight_decay": wd}
    # torch's fused kernels (one pass over every parameter; CPU and CUDA): Adam's step 3x faster on the
    # MNIST MLPs, the same update up to rounding (about 1e-8); where a parameter's device or dtype has no
    # fused kernel, the default implementation
    try:
        return cls(params, fused=True, **options)
    except (RuntimeError, ValueError):
        return cls(params, **options)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


@torch.no_grad()
def check_forward(model: torch.nn.Module, x: torch.Tensor, n_classes: int, arch: str, data_name: str) -> None:
    """Run the model once (in eval mode) on two inputs: a model that fails on the data, or gives outputs
    of the wrong shape, is refused in one line that says it is the model (not the rule) that failed."""
    was = model.training
    model.eval()
    try:
        out = model(x)
    except Exception as exc:
        raise ValueError(f"The model {arch!r} fails on {data_name} inputs of shape {tuple(x.shape)} "
                         f"({_first_line(exc)}); check that it fits the data") from None
    finally:
        model.train(was)
    if not torch.is_tensor(out) or out.dim() != 2 or out.shape[1] != n_classes:
        got = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
        raise ValueError(f"The model {arch!r} maps {data_name} inputs of shape {tuple(x.shape)} to {got}; expected "
                         f"(batch, {n_classes}): one output per class")


def batch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of the training set in ``epoch``: a function of ``(seed, epoch)`` only."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))




def run_epoch(s: Setup, config: TrainConfig, epoch: int, progress: bool = True, last_good: str = "none") -> float:
    """Train one epoch (``epoch`` is 1-based). Returns the mean mini-batch loss.

    Raises:
        DivergenceError: on a non-finite loss or weight, or a loss above ``divergence_factor`` times the
            run's first mini-batch loss (``s.first_loss``), naming the epoch and step.
    """
    s.model.train()
    s.rule.begin_epoch(epoch, s.train_x.shape[0])
    indexed = isinstance(s.rule, PerSampleRule)   # per-sample rule state (MAC): pass the batch's positions
    order = batch_order(s.train_x.shape[0], config.seed, epoch).to(s.train_x.device)
    steps = math.ceil(len(order) / config.batch_size)
    total = 0.0
    group = s.group
    params = [p for p in s.model.parameters() if p.requires_grad]
    # back-propagation on a dense chain, compiled: the backward and the optimiser's step as one call
    fused = FusedTrainStep.make(s.rule, s.model, s.optimizer, group.distributed) if not indexed else None
    per_step = is_per_step(config.lr_schedule)
    bar = tqdm(range(steps), desc=f"epoch {epoch}/{config.epochs} [{config.rule}]", leave=False,
               disable=not (progress and group.is_main))
    for step in bar:
        idx = order[step * config.batch_size:(step + 1) * config.batch_size]
        mine = group.shard(idx)
        # index_select, not train_x[mine]: advanced indexing costs several times more (about 80 against 13 µs for
        # 50 MNIST rows), a visible share of a small network's step; it keeps a channels-last layout, though
        x = s.train_x.index_select(0, mine) if s.train_x.is_contiguous() else s.train_x[mine]
        y = s.train_y.index_select(0, mine)
        if s.augment is not None:   # drawn for the global batch, so every rank draws the same numbers
            dy, dx, flip = s.augment.draw(len(idx))
            rows = group.shard(torch.arange(len(idx)))
            x = s.augment.apply(x, dy[rows], dx[rows], flip[rows])
        for p in params:   # optimizer.zero_grad(set_to_none=True), without its per-call bookkeeping
            p.grad = None
        if fused is not None and len(mine) == config.batch_size and fused.active(x.device):
            loss = fused(x, y)   # the update is applied: a diverged loss stops the run below
            _check_loss(s, config, loss, epoch, step, last_good)
        else:
            loss = _rule_step(s, config, x, y, mine, idx, params, epoch, step, steps, last_good)
        total += loss
        if per_step:
            s.scheduler.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss:.4f}")
    # non-finite weights after a step give a non-finite loss at the next one (checked above): only the epoch's
    # last step needs its own check, before the weights are evaluated and checkpointed
    if not all_finite(params):
        raise DivergenceError(f"Training diverged: non-finite weights after epoch {epoch} (rule {config.rule}, lr "
                              f"{config.lr}); last good checkpoint: {last_good}. Try a smaller learning rate.")
    if not per_step:
        s.scheduler.step()
    return total / steps


def _rule_step(s: Setup, config: TrainConfig, x: torch.Tensor, y: torch.Tensor, mine: torch.Tensor, idx: torch.Tensor,
               params: list, epoch: int, step: int, steps: int, last_good: str) -> float:
    """One step of the rule and the optimiser (the separate calls), with the divergence checks; returns the loss."""
    indexed, group = isinstance(s.rule, PerSampleRule), s.group
    loss = 0.0
    if len(mine):
        # the last, partial batch runs eagerly rather than compiling a new shape; the batch comes from the
        # training split that build() checked once
        with compiling("off") if len(idx) < config.batch_size and steps > 1 else contextlib.nullcontext():
            try:
                loss = s.rule.backward(s.model, x, y, index=mine if indexed else None,
                                       validated=True).loss
            except NonFiniteError as exc:   # the weights (or, through them, the activations) blew up
                raise DivergenceError(f"Training diverged at epoch {epoch}, step {step + 1} ({exc}; rule "
                                      f"{config.rule}, lr {config.lr}); last good checkpoint: {last_good}. Try "
                                      "a smaller learning rate.") from None
    loss = group.average_gradients(params, len(mine), len(idx), loss)
    if indexed and group.distributed:   # every rank keeps every sample's state: share this step's rows
        group.share_sample_state(s.rule, idx)
    _check_loss(s, config, loss, epoch, step, last_good)
    try:
        s.optimizer.step()
    except RuntimeError as exc:   # e.g. a learning rate that overflows the parameters' dtype
        raise DivergenceError(f"The optimiser step failed at epoch {epoch}, step {step + 1} ({exc}); "
                              f"learning rate {s.optimizer.param_groups[0]['lr']:g} is too large for "
                              f"{next(s.model.parameters()).dtype}; last good checkpoint: {last_good}") from None
    return loss


def _check_loss(s: Setup, config: TrainConfig, loss: float, epoch: int, step: int, last_good: str) -> None:
    """Raise :class:`DivergenceError` on a non-finite loss or one above ``divergence_factor`` × the run's first."""
    if s.first_loss is None:
        s.first_loss = loss
    loss_ref = s.first_loss
    if not math.isfinite(loss) or loss > config.divergence_factor * max(loss_ref, 1e-12):
        raise DivergenceError(f"Training diverged: loss {loss:.3g} at epoch {epoch}, step {step + 1} "
                              f"(first loss {loss_ref:.3g}; rule {config.rule}, lr {config.lr}); last good checkpoint: "
                              f"{last_good}. Try a smaller learning rate.")


@torch.no_grad()
def epoch_metrics(s: Setup, epoch: int, batch_loss: float, seconds: float) -> dict:
    """Full-data metrics after an epoch (each rank evaluates its contiguous share; the sums are reduced),
    with ``val_acc`` when the run holds out a validation split."""
    s.model.eval()
    a, b = s.group.shard_range(s.train_x.shape[0])
    loss_sum, correct = 0.0, 0
    for i in range(a, b, 4096):
        out = s.model(s.train_x[i:min(i + 4096, b)])
        y = s.train_y[i:min(i + 4096, b)]
        loss_sum += float(quadratic_loss(out, one_hot(y, out.shape[1], out.dtype))) * len(y)
        correct += int((out.argmax(1) == y).sum())
    c, d = s.group.shard_range(s.test_x.shape[0])
    test_correct = correct_count(s.model, s.test_x[c:d], s.test_y[c:d])
    counts = active_counts(s.model, s.test_x[c:d])
    engaged, total = counts if counts is not None else (math.nan, 0)
    val_correct = 0
    if s.val_x is not None:
        e, f = s.group.shard_range(s.val_x.shape[0])
        val_correct = correct_count(s.model, s.val_x[e:f], s.val_y[e:f])
    loss_sum, correct, test_correct, engaged, total, val_correct = s.group.all_sum(
        [loss_sum, correct, test_correct, engaged, total, val_correct])
    n_train, n_test = s.train_x.shape[0], s.test_x.shape[0]
    record = {"epoch": epoch, "train_loss": loss_sum / n_train, "batch_loss": batch_loss,
              "train_acc": correct / n_train, "test_acc": test_correct / max(1, n_test),
              "active_fraction": engaged / total if total else (0.0 if counts is not None else math.nan),
              "epoch_seconds": seconds, "data_verified": not s.data.meta.get("unverified_files")}
    if s.val_x is not None:
        record["val_acc"] = val_correct / s.val_x.shape[0]
    return record


def _checkpoint(s: Setup, epoch: int, history: list[dict]) -> dict:
    ckpt = {"epoch": epoch, "model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(),
            "scheduler": s.scheduler.state_dict(), "history": history, "first_loss": s.first_loss,
            "rule_state": s.rule.state_dict(), "compile_choices": measured_choices()}
    if s.augment is not None:
        ckpt["augment"] = s.augment.state_dict()
    return ckpt


def train(config: TrainConfig, progress: bool = True, resume: bool = False, log: Callable[[str], None] | None = print,
          overwrite: bool = False) -> list[dict]:
    """Train according to ``config`` into its run folder (:class:`RunFolder`); returns the per-epoch metrics.

    Args:
        resume: continue from ``config.out/checkpoint.pt`` if present (epochs already done are skipped;
            without a checkpoint the run restarts from scratch, with a note).
        log: called with one line per epoch (``None`` for silence).
        overwrite: start afresh in a folder that holds another run (otherwise refused).

    Raises:
        RunFolderError: a new run into a folder that holds one (without ``overwrite``); a resumed run
            whose folder holds different settings; a damaged checkpoint.
    """
    config = config.resolved()   # lr=None: the rule's recommended rate, recorded in config.json
    torch.manual_seed(config.seed)
    group = join(config.device, config.dist_timeout)
    history = _train(config, group, progress, resume, log if group.is_main else None, overwrite)
    group.close()
    return history


def _train(config: TrainConfig, group: Group, progress: bool, resume: bool, log, overwrite: bool) -> list[dict]:
    # rank 0 alone probes the folder and removes leftover temporaries, on a resume as on a start; the
    # others wait for it before they read the folder (several probes at once made each other fail)
    # (rank 0 also locks the folder for the run's lifetime: a second run into it is refused)
    folder = RunFolder(config.out, writer=group.is_main)
    try:
        group.barrier()
        return _train_in(folder, config, group, progress, resume, log, overwrite)
    except ValueError:   # refused (a rule that rejects the model at its first step): leave nothing behind
        if group.is_main and not resume:
            folder.discard_unstarted()
        raise
    finally:
        folder.close()


def _train_in(folder: RunFolder, config: TrainConfig, group: Group, progress: bool, resume: bool, log,
              overwrite: bool) -> list[dict]:
    if resume:
        if (folder.path / "config.json").exists():
            _check_same_run(folder.path, config)
    elif group.is_main or not overwrite:   # rank 0 alone removes a replaced run's files
        folder.refuse_overwrite(overwrite)
    s = build(config, group)
    history: list[dict] = []
    start = 0
    ckpt = folder.load_checkpoint(map_location=config.device, note=log) if resume else None
    if resume and ckpt is None and log and folder.holds_run():   # a fresh folder (reproduce's new rows): no note
        log(f"note: {folder.path} holds a run that stopped before its first checkpoint; starting it from scratch")
    if ckpt is not None:
        try:
            s.model.load_state_dict(ckpt["model"])
            s.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:   # size mismatch, missing keys, other groups
            detail = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise RunFolderError(f"{folder.checkpoint_path} does not fit the model {config.arch!r} builds now "
                                 f"({(detail[1] if len(detail) > 1 else detail[0] if detail else type(exc).__name__)[:200]}): "
                                 "it was written for another model (a changed builder, or one that ignores the seed?); "
                                 "resume with the model that wrote it, or start again with --overwrite") from None
        if "scheduler" in ckpt:
            s.scheduler.load_state_dict(ckpt["scheduler"])
        s.rule.load_state_dict(ckpt.get("rule_state", {}))
        if s.augment is not None:
            if "augment" not in ckpt:
                raise RunFolderError(f"{folder.checkpoint_path} holds no augmentation state, but the run augments "
                                     "(--augment crop-flip): it was written by another run; start again with --overwrite")
            s.augment.load_state_dict(ckpt["augment"])
        start, history, s.first_loss = ckpt["epoch"], ckpt["history"], ckpt.get("first_loss")
        if start > config.epochs:
            raise RunFolderError(f"{folder.path} already holds {start} epochs, more than the {config.epochs} asked "
                                 "for; ask for more epochs to extend it, or --overwrite to start again")
    group.barrier()   # every rank has read the folder before rank 0 writes to it
    main = group.is_main
    if main:
        folder.start(config.to_dict(), history)
    board = TensorBoardLogger(config.tensorboard, s.data.image_shape) if config.tensorboard and main else None
    if log and getattr(s.rule, "output", "se") == "ce":
        log(f"note: sq-loss is the squared error ½‖y − output‖² that every run reports; {config.rule} with output=ce "
            "trains the cross-entropy of softmax(output), so its outputs are logits and sq-loss grows with them: "
            "read the accuracies")
    if log and config.check_equilibrium and s.rule.equilibrium_options() is None:
        log(f"note: --check-equilibrium measures nothing for {config.rule}: its gradient is not an approximation of an "
            "inference equilibrium's (see inferlearn.diagnostics.equilibrium_gap)")
    # auto's choices belong to the whole run: its length (not what is left of it), and on --resume the measured ones
    replay_choices(ckpt.get("compile_choices", {}) if ckpt is not None else {})
    planned = config.epochs * (s.train_x.shape[0] // config.batch_size)   # full batches of the run
    for epoch in range(start + 1, config.epochs + 1):
        t0, c0, d0 = time.perf_counter(), compile_seconds(), len(compile_decisions())
        with compiling(config.compile), planned_batches(planned):
            calls = compiled_calls()
            batch_loss = run_epoch(s, config, epoch, progress, last_good=folder.last_good())
        if epoch == start + 1 and main:
            _warn_uncompiled(config, compiled_calls() - calls)
        seconds = time.perf_counter() - t0
        record = epoch_metrics(s, epoch, batch_loss, seconds)
        record["compile_seconds"] = compile_seconds() - c0   # included in epoch_seconds
        gap = check_equilibrium(s, config, epoch) if config.check_equilibrium and main else None
        if gap is not None:
            record["equilibrium_gap"] = gap
        history.append(record)
        due = epoch % config.checkpoint_every == 0 or epoch == config.epochs
        if main:
            folder.record(record, _checkpoint(s, epoch, history) if due else None)
        if board is not None:
            board.log_epoch(record, s.model.modules())
        if log:
            compiled = f" (compile {record['compile_seconds']:.1f}s)" if record["compile_seconds"] else ""
            compiled += "".join(f"\n  auto: {d}" for d in compile_decisions()[d0:])   # what --compile auto measured
            val = f"val {record['val_acc']:.4f}  " if "val_acc" in record else ""
            gap = f"  gap {record['equilibrium_gap']:.3f}" if record.get("equilibrium_gap") is not None else ""
            log(f"epoch {epoch:3d}  sq-loss {record['train_loss']:.4f}  train {record['train_acc']:.4f}  {val}"
                f"test {record['test_acc']:.4f}  active {record['active_fraction']:.3f}{gap}  {seconds:.1f}s{compiled}")
    if board is not None:
        board.close()
    if main:
        folder.plot(history, config.rule, title=f"{config.data} {config.arch} {config.act}")
    group.barrier()   # no rank leaves (and tears the group down) before rank 0 has written everything
    return history


#: the training images on which ``--check-equilibrium`` measures the gap, and the gap above which it warns
EQUILIBRIUM_SAMPLES = 32
EQUILIBRIUM_GAP_WARN = 0.1


def check_equilibrium(s: Setup, config: TrainConfig, epoch: int) -> float | None:
    """``--check-equilibrium``: :func:`~inferlearn.diagnostics.equilibrium_gap` at the weights after ``epoch`` on the
    first :data:`EQUILIBRIUM_SAMPLES` training images (as trained: standardised, not augmented); warns once per
    run (:class:`~inferlearn.errors.ConvergenceWarning`) above :data:`EQUILIBRIUM_GAP_WARN`. ``None`` for a rule
    without an equilibrium to compare with. The model, the rule and every random stream are left as they were."""
    x, y = s.train_x[:EQUILIBRIUM_SAMPLES], s.train_y[:EQUILIBRIUM_SAMPLES]
    gap = equilibrium_gap(s.rule, s.model, x, y, epoch=epoch, n_samples=s.train_x.shape[0])
    if gap is not None and gap > EQUILIBRIUM_GAP_WARN and not s.gap_warned:
        s.gap_warned = True
        settled = ", ".join(f"{k}={v}" for k, v in s.rule.equilibrium_options().items())
        warnings.warn(f"{config.rule}: after epoch {epoch} the weight gradient is {100 * gap:.0f} % from the one at its "
                      f"inference's equilibrium (on {x.shape[0]} training images, float64, against {settled}): it is "
                      f"not the equilibrium's; more or larger inference steps bring it closer (warned once per run; "
                      f"every epoch's gap is equilibrium_gap in metrics.jsonl)", ConvergenceWarning, stacklevel=2)
    return gap


def _warn_uncompiled(config: TrainConfig, calls: int) -> None:
    """One :class:`CompileWarning` when ``--compile on`` (or ``no-cudagraphs``) compiled nothing in an epoch: the
    rule has no compiled step for the model, so the option changed nothing."""
    if config.compile in ("on", "no-cudagraphs") and not calls and not compile_failed():
        warnings.warn(f"--compile {config.compile}: rule {config.rule!r} has no compiled step for {config.arch!r} "
                      "(nothing was compiled in the first epoch); it runs eagerly, as with --compile off",
                      CompileWarning, stacklevel=2)


def finished_history(config: TrainConfig) -> list[dict] | None:
    """The metrics of the run ``config`` describes when its folder holds it *finished* (``config.json`` with the
    same settings, a checkpoint, and ``metrics.jsonl`` up to ``config.epochs``), else ``None``; reads only, so a
    finished run is skipped without touching its files (a resumed :func:`train` rewrites them).

    Raises:
        RunFolderError: the folder holds a run with other settings.
    """
    config = config.resolved()
    out = Path(config.out)
    metrics = out / "metrics.jsonl"
    if not ((out / "config.json").exists() and metrics.exists() and (out / "checkpoint.pt").exists()):
        return None
    _check_same_run(out, config)
    history = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return history if history and history[-1].get("epoch") == config.epochs else None


def _check_same_run(out: Path, config: TrainConfig) -> None:
    """Refuse to resume a folder that holds a run with different settings (only ``epochs`` may grow)."""
    saved = load_config(out).to_dict()
    current = config.to_dict()
    diff = sorted(k for k in current
                  if k not in ("epochs", "out", "device", "tensorboard", "threads", "compile", "nproc", "dist_timeout",
                               "check_equilibrium")
                  and saved.get(k, TrainConfig().to_dict().get(k)) != current[k])
    if diff:
        raise RunFolderError(f"{out} holds a run with different settings ({', '.join(diff)}); "
                             "use another --out folder, or --overwrite to replace it")


def load_config(folder: str | Path) -> TrainConfig:
    """Read ``config.json`` of a run folder (:class:`RunFolderError` naming the file when missing or damaged)."""
    if not Path(folder).is_dir():
        raise RunFolderError(f"Run folder {folder} does not exist; check the path given to --resume")
    d = RunFolder(folder, writer=False).read_config()   # read only: every process of a run may call this
    if not isinstance(d, dict) or "rule" not in d:
        raise RunFolderError(f"{Path(folder) / 'config.json'} is not the config of an `inferlearn train` run "
                             "(an admm run folder? resume it with `inferlearn admm --resume`)")
    d.pop("model_sizes", None)
    try:
        config = TrainConfig.from_dict(d)
        make_rule(config.rule, config.rule_options)   # the rule's options too, before anything trains
        return config
    except (ValueError, TypeError) as exc:
        raise RunFolderError(f"{Path(folder) / 'config.json'} holds invalid settings ({exc}); correct it in "
                             "config.json (it was edited by hand?), or start the run again with --overwrite") from None
