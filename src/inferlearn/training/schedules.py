"""Learning-rate schedules by name, as ``torch.optim.lr_scheduler`` objects stepped once per epoch.

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
  changes ``--epochs`` continues on the curve of the new length (the epochs already done keep theirs).
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


def check_schedule(name: str, epochs: int | None = None) -> str:
    """Validate a schedule name: ``constant``, ``warmup``, ``warmup:E:F:A``, ``scaled:F`` with ``F > 0``,
    ``cosine`` or ``cosine:W`` (``W`` warm-up epochs, an integer ``0 ≤ W < epochs`` when ``epochs`` is given)."""
    if name in ("constant", "warmup", "cosine"):
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
                     "(e.g. scaled:0.1), 'cosine' or 'cosine:W' (e.g. cosine:5)")


def _cosine_warmup(name: str) -> int | None:
    """``W`` of ``cosine`` / ``cosine:W``, or ``None`` when it does not parse or is negative."""
    if name == "cosine":
        return 0
    try:
        w = int(name.split(":", 1)[1])
    except ValueError:
        return None
    return w if w >= 0 else None


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


def make_schedule(name: str, optimizer: torch.optim.Optimizer,
                  epochs: int | None = None) -> torch.optim.lr_scheduler.LRScheduler:
    """The scheduler called ``name`` for ``optimizer`` (see the module docstring); ``cosine`` needs the
    run's length ``epochs``."""
    check_schedule(name, epochs)
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
