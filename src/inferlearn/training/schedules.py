"""Learning-rate schedules by name, as ``torch.optim.lr_scheduler`` objects stepped once per epoch (or once per
optimiser step, for ``warmup-cosine``).

The training loop never writes the optimiser's learning rate itself, so any scheduler works; these
are the ones the command line offers (``--lr-schedule``):

* ``constant``: the learning rate of the config throughout;
* ``warmup``: standard lifted training's warm-up (Zach & Estellers 2019, Sec. 5: "the first epochs
  utilized a smaller learning rate"): ``warmup_scale × lr`` for ``warmup_epochs`` epochs, then
  ``after × lr``. Defaults 5 epochs at 0.1, then 0.3 (see :class:`~inferlearn.rules.lifted.LiftedJ0`);
  ``warmup:E:F:A`` sets them (``E`` epochs at ``F × lr``, then ``A × lr``), e.g. ``warmup:5:0.001:0.1``
  for J_0 with the global scaling (``benchmarks/results/j0_investigation_scaling.md``);
* ``scaled:F``: the constant ``F × lr`` (least squares on raw pixels needs ``F = 0.1`` at the
  networks' learning rate, see :func:`inferlearn.baselines.least_squares_fit`);
* ``cosine`` or ``cosine:W``: a linear warm-up over ``W`` epochs (default 0), then a cosine decay over the
  remaining ``T - W`` of the run's ``T`` epochs (Loshchilov & Hutter 2017, SGDR, without restarts), the
  recipe of the CIFAR benchmarks. In epoch ``e`` (0-based) the learning rate is

  ``η_e = η · (e + 1)/W`` for ``e < W``, and ``η_e = η · ½ (1 + cos(π (e − W)/(T − W)))`` for ``e ≥ W``,

  so the last warm-up epoch and the first cosine epoch both run at ``η``, and the last epoch at
  ``η (1 + cos(π (T - W - 1)/(T - W)))/2 > 0``. The schedule depends on ``T``: a resumed run that
  changes ``--epochs`` continues on the curve of the new length (the epochs already done keep theirs);
* ``warmup-cosine:P:W:F``: PCX's benchmark schedule (optax's ``warmup_cosine_decay_schedule`` with
  ``init_value = η``, ``peak_value = P η``, ``warmup_steps = W S``, ``decay_steps = S``, ``end_value = F η``,
  Pinchetti et al. 2024, ``examples/s4_1_discriminative_mode``), stepped once per *optimiser step*: over the
  run's ``S`` steps, step ``s`` (0-based) runs at

  ``η_s = η (1 + (P − 1) s / (W S))`` for ``s < W S``, and
  ``η_s = η (F + (P − F) ½ (1 + cos(π (s − W S)/(S − W S))))`` after,

  a linear warm-up from ``η`` to ``P η`` and a cosine from ``P η`` to the floor ``F η``. PCX's recipes are
  ``warmup-cosine:1.1:0.1:0.1``; plain ``warmup-cosine`` means that.
"""
from __future__ import annotations

import math

import torch


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_epochs: int = 5, warmup_scale: float = 0.1,
                    after: float = 0.3) -> torch.optim.lr_scheduler.LambdaLR:
    """``warmup_scale × lr`` for the first ``warmup_epochs`` epochs (0-based), then ``after × lr``."""
    if not isinstance(warmup_epochs, int) or warmup_epochs < 0:
        raise ValueError(f"Invalid warmup_epochs: {warmup_epochs}")
    for name, v in (("warmup_scale", warmup_scale), ("after", after)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"Invalid {name}: {v}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: warmup_scale if e < warmup_epochs else after)


def cosine_factor(epoch: int, epochs: int, warmup_epochs: int = 0) -> float:
    """The factor ``η_e / η`` of ``cosine:W`` in 0-based ``epoch`` of an ``epochs``-epoch run (module docstring)."""
    if epoch < warmup_epochs:
        return (epoch + 1) / warmup_epochs
    return 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup_epochs) / max(1, epochs - warmup_epochs)))


#: PCX's benchmark schedule: warm-up to 1.1 η over 10 % of the steps, cosine to 0.1 η
PCX_WARMUP_COSINE = (1.1, 0.1, 0.1)


def check_schedule(name: str, epochs: int | None = None) -> str:
    """Validate a schedule name: ``constant``, ``warmup``, ``warmup:E:F:A``, ``scaled:F`` with ``F > 0``,
    ``cosine`` or ``cosine:W`` (``W`` warm-up epochs, an integer ``0 ≤ W < epochs`` when ``epochs`` is given),
    ``warmup-cosine`` or ``warmup-cosine:P:W:F`` (``P, F > 0``, ``0 ≤ W < 1``)."""
    if name in ("constant", "warmup", "cosine", "warmup-cosine"):
        return name
    if name.startswith("warmup-cosine:"):
        if _warmup_cosine_parts(name) is None:
            raise ValueError(f"Invalid lr schedule {name!r}; use warmup-cosine:P:W:F (a linear warm-up from lr to P × lr "
                             "over the fraction W of the steps, then a cosine to F × lr; P, F > 0, 0 ≤ W < 1), e.g. "
                             "warmup-cosine:1.1:0.1:0.1 (PCX's)")
        return name
    if name.startswith("cosine:"):
        w = _cosine_warmup(name)
        if w is None:
            raise ValueError(f"Invalid lr schedule {name!r}; use cosine:W with W ≥ 0 warm-up epochs (an integer), "
                             "e.g. cosine:5")
        if epochs is not None and w >= epochs:
            raise ValueError(f"Invalid lr schedule {name!r}: {w} warm-up epochs leave none of the {epochs} epochs "
                             "for the cosine decay; use fewer warm-up epochs or more --epochs")
        return name
    if name.startswith("warmup:"):
        if _warmup_parts(name) is not None:
            return name
        raise ValueError(f"Invalid lr schedule {name!r}; use warmup:E:F:A (E epochs at F × lr, then A × lr; "
                         "E ≥ 0 an integer, F, A > 0), e.g. warmup:5:0.001:0.1")
    if name.startswith("scaled:"):
        try:
            f = float(name.split(":", 1)[1])
        except ValueError:
            f = math.nan
        if math.isfinite(f) and f > 0:
            return name
    raise ValueError(f"Invalid lr schedule {name!r}; use 'constant', 'warmup', 'warmup:E:F:A', 'scaled:F' "
                     "(e.g. scaled:0.1), 'cosine', 'cosine:W' (e.g. cosine:5) or 'warmup-cosine:P:W:F' (e.g. "
                     "warmup-cosine:1.1:0.1:0.1)")


def _cosine_warmup(name: str) -> int | None:
    """``W`` of ``cosine`` / ``cosine:W``, or ``None`` when it does not parse or is negative."""
    if name == "cosine":
        return 0
    try:
        w = int(name.split(":", 1)[1])
    except ValueError:
        return None
    return w if w >= 0 else None


def warmup_cosine_factor(step: int, steps: int, peak: float, warmup: float, floor: float) -> float:
    """The factor ``η_s / η`` of ``warmup-cosine:P:W:F`` at 0-based optimiser ``step`` of ``steps`` (module
    docstring); past the last step it stays at the floor."""
    w = warmup * steps
    if step < w:
        return 1.0 + (peak - 1.0) * step / w
    t = min(1.0, (step - w) / max(steps - w, 1e-12))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def _warmup_cosine_parts(name: str) -> tuple[float, float, float] | None:
    """``(P, W, F)`` of ``warmup-cosine[:P:W:F]``, or ``None`` when it does not parse or is out of range."""
    if name == "warmup-cosine":
        return PCX_WARMUP_COSINE
    parts = name.split(":")[1:]
    try:
        p, w, f = (float(v) for v in parts)
    except ValueError:
        return None
    if not all(math.isfinite(v) for v in (p, w, f)) or p <= 0 or f <= 0 or not 0 <= w < 1:
        return None
    return p, w, f


def is_per_step(name: str) -> bool:
    """Whether the schedule ``name`` is stepped once per optimiser step (``warmup-cosine``) instead of per epoch."""
    return name == "warmup-cosine" or name.startswith("warmup-cosine:")


def _warmup_parts(name: str) -> tuple[int, float, float] | None:
    """``(E, F, A)`` of ``warmup:E:F:A``, or ``None`` when it does not parse or is out of range."""
    parts = name.split(":")[1:]
    if len(parts) != 3:
        return None
    try:
        e, f, a = int(parts[0]), float(parts[1]), float(parts[2])
    except ValueError:
        return None
    if e < 0 or not all(math.isfinite(v) and v > 0 for v in (f, a)):
        return None
    return e, f, a


def make_schedule(name: str, optimizer: torch.optim.Optimizer, epochs: int | None = None,
                  steps_per_epoch: int | None = None) -> torch.optim.lr_scheduler.LRScheduler:
    """The scheduler called ``name`` for ``optimizer`` (see the module docstring); ``cosine`` needs the
    run's length ``epochs``, ``warmup-cosine`` also its optimiser steps per epoch (and is stepped per step:
    :func:`is_per_step`)."""
    check_schedule(name, epochs)
    if is_per_step(name):
        if epochs is None or steps_per_epoch is None:
            raise ValueError(f"The lr schedule {name!r} needs the run's epochs and steps per epoch")
        parts, total = _warmup_cosine_parts(name), epochs * steps_per_epoch
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine_factor(s, total, *parts))
    if name == "cosine" or name.startswith("cosine:"):
        if epochs is None:
            raise ValueError(f"The lr schedule {name!r} needs the run's number of epochs")
        w = _cosine_warmup(name)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: cosine_factor(e, epochs, w))
    if name == "warmup":
        return warmup_schedule(optimizer)
    if name.startswith("warmup:"):
        return warmup_schedule(optimizer, *_warmup_parts(name))
    factor = float(name.split(":", 1)[1]) if name.startswith("scaled:") else 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: factor)
