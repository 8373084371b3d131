"""The argmin layer's contrastive gradient against implicit differentiation, as the batch grows.

NNLS layer ``argmin_{z ≥ 0} ½‖Dz − y‖² + ¼‖z‖²`` (12 → 6), float64, squared loss averaged over the
batch, symmetric nudging, default solver. With a batch-mean loss the incoming gradient ``g`` shrinks like
1/B. Two mechanisms keep the gradient accurate: β is per sample (the nudge is β B g), and the nudged
solve's tolerance is tightened to the nudge. Columns:

* the layer at its defaults: β = 1e-3 per sample;
* the old behaviour: a nudge of 1e-3 · g whatever the batch (β = 1e-3 / B per sample) and the solver's
  fixed tolerance 1e-6 (a solver wrapper the layer cannot tighten);
* the same small nudge with the tolerance scaled to it.

Reports ‖∇_contrastive − ∇_implicit‖ / ‖∇_implicit‖ for the dictionary D.

Run:  python benchmarks/bench_argmin_batch.py        → benchmarks/results/argmin_batch.md
"""
from __future__ import annotations

from pathlib import Path

import torch

from inferlearn.bilevel import AcceleratedProjectedGradient, ArgminLayer, Box, LeastSquaresEnergy

RESULTS = Path(__file__).resolve().parent / "results"
DT = torch.float64


class FixedTolerance:
    """A solver the layer does not recognise, so it keeps its own tolerance (1e-6)."""

    def __init__(self):
        self.inner = AcceleratedProjectedGradient()

    def __call__(self, *args):
        return self.inner(*args)


def relative_error(batch: int, solver, beta: float) -> float:
    gen = torch.Generator().manual_seed(1)
    D = torch.randn(12, 6, generator=gen, dtype=DT)
    y = torch.rand(batch, 12, generator=gen, dtype=DT)
    t = torch.rand(batch, 6, generator=gen, dtype=DT)
    grads = {}
    for mode in ("contrastive", "implicit"):
        energy = LeastSquaresEnergy(D.clone(), ridge=0.5)
        layer = ArgminLayer(energy, Box.nonnegative(), beta=beta, backward=mode, solver=solver)
        ((layer(y) - t) ** 2).sum(1).mean().backward()
        grads[mode] = energy.D.grad
    return float((grads["contrastive"] - grads["implicit"]).norm() / grads["implicit"].norm())


def main() -> int:
    lines = ["# Argmin layer: contrastive vs implicit gradient by batch size", "",
             "Command: `python benchmarks/bench_argmin_batch.py`", "",
             "NNLS layer (12 → 6, ridge 0.5), float64, batch-mean squared loss, symmetric nudging. "
             "Relative error of the dictionary's gradient against implicit differentiation.", "",
             "| batch | the layer (β = 1e-3 per sample) | old: nudge 1e-3·g, tolerance 1e-6 | nudge 1e-3·g, scaled tolerance |",
             "|---|---|---|---|"]
    for batch in (1, 10, 100, 1000):
        lines.append(f"| {batch} | {relative_error(batch, None, 1e-3):.2e} | "
                     f"{relative_error(batch, FixedTolerance(), 1e-3 / batch):.2e} | "
                     f"{relative_error(batch, None, 1e-3 / batch):.2e} |")
    (RESULTS / "argmin_batch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
