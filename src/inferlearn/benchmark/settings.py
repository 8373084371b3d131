"""The settings of one benchmark run (the command line's choices) and the names of its run folders."""
from __future__ import annotations

from dataclasses import dataclass

from .protocols import Budget

DIVERGED = "diverged.json"
PLAN = "benchmark.json"


@dataclass(frozen=True)
class Settings:
    """How one invocation runs a protocol (what the command line gives).

    Attributes:
        out: the benchmark's folder.
        budget: the :class:`Budget` (width and epoch factors).
        seeds: final runs per variant (seeds ``0 … seeds−1``).
        device: ``cpu`` or ``cuda``.
        data_dir, allow_unverified: where the data are read from (``TrainConfig``'s).
        threads: PyTorch intra-op threads (recorded in each run's config).
        compile: ``TrainConfig.compile``.
        reuse: a ``results.json`` whose recorded runs are taken instead of trained (:func:`load_reuse`), or ``None``.
        variants: the names of the variants to run (``--variants``), or ``None`` for all; the others' finished runs
            stay in the folder, and a later run of every variant skips the finished ones.
    """

    out: str
    budget: Budget
    seeds: int = 5
    device: str = "cpu"
    data_dir: str | None = None
    allow_unverified: bool = False
    threads: int = 1
    compile: str = "auto"
    reuse: str | None = None
    variants: tuple | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.seeds, int) and self.seeds >= 1):
            raise ValueError(f"Invalid --seeds {self.seeds}: give an integer ≥ 1 (final runs per variant)")
        if not str(self.out).strip():
            raise ValueError("Invalid --out '': give a folder, e.g. --out runs/benchmark")


def point_name(point: dict) -> str:
    """A search point's folder name: ``lr=0.001,rule.step_size=0.1`` (``default`` for the empty point)."""
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items()) or "default"
