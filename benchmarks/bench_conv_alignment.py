"""Per-layer gradient alignment with back-propagation on random conv nets, at each rule's defaults.

For 3 seeds of ``conv_net((1, 28, 28), [8, 16], [64], 10)`` (average pooling, ReLU units) and one fixed
batch of 100 random 28×28 inputs, the cosine between each rule's gradient and back-propagation's for
every parameter, in float32 at default options (and Fenchel BP also at β = 0.01). Reports the lowest
per-layer cosine per seed: the one-engine issue asks for ≥ 0.99 (Fenchel BP), ≥ 0.9 (EqProp) and
≥ 0.8 (contrastive).

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_conv_alignment.py       → benchmarks/results/conv_alignment.md
"""
from __future__ import annotations

from pathlib import Path

import torch

from inferlearn.diagnostics import gradient_alignment
from inferlearn.models import conv_net
from inferlearn.rules import make_rule

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = [("fenchel-bp", {}), ("fenchel-bp", {"beta": 0.01}), ("eqprop", {}), ("contrastive", {}), ("pc", {}),
            ("lifted-j0", {})]


def main() -> int:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(100, 784, generator=g), torch.randint(0, 10, (100,), generator=g)
    lines = ["# Gradient alignment with back-propagation on random conv nets", "",
             "Command: `OMP_NUM_THREADS=1 python benchmarks/bench_conv_alignment.py`", "",
             "`conv_net((1, 28, 28), [8, 16], [64], 10, seed=s)` (Conv3×3 → ReLU → AvgPool2 twice, Linear 64, "
             "Linear 10), one batch of 100 uniform random images, float32, default options unless given. "
             "Lowest cosine over the network's parameters, per seed.", "",
             "| rule | options | seed 0 | seed 1 | seed 2 |", "|---|---|---|---|---|"]
    for name, options in VARIANTS:
        mins = []
        for seed in range(3):
            rows = gradient_alignment(make_rule(name, options), conv_net((1, 28, 28), [8, 16], [64], 10, seed=seed), x, y)
            mins.append(min(r["cosine"] for r in rows))
        opts = ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"
        lines.append(f"| {name} | {opts} | " + " | ".join(f"{m:.3f}" for m in mins) + " |")
    (RESULTS / "conv_alignment.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
