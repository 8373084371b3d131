"""The box units' clamp, forward and backward: inferlearn's ``Box.project`` against ``torch.clamp`` and ``torch.relu``.

Every box unit (ReLU, hard-sigmoid, hard-tanh) is the clamp ``Π_C(a) = clamp(a, lo, hi)``. Differentiated by autograd
(the generic paths: conv nets, graphs, back-propagation through ``Clamp`` modules, predictive coding's value-node
steps) its backward is ``g`` where ``lo ≤ a ≤ hi``, else 0. torch's own clamp backward builds that mask from boolean
tensors, and on CPU boolean element-wise kernels are slow; ``Box.project`` instead multiplies by a floating-point
mask made in the forward pass (``units._FloatClamp``), with the same values and gradients. This times, per
tensor shape, one forward and backward (``torch.autograd.grad``) of each, on one thread, median of ``--repeats``
runs of ``--calls`` calls, interleaved; and checks that the gradients are identical.

Usage::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_units.py

Writes ``benchmarks/results/units.md``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((50, 8, 28, 28), (50, 16, 14, 14), (256, 64), (50, 64, 16, 16))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out", default=str(RESULTS / "units.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from inferlearn.units import get_units

    rows = []
    for units in ("relu", "hard-sigmoid"):
        u = get_units(units)
        lo, hi = u.clamp_bounds(torch.zeros(()))
        for shape in SHAPES:
            g = torch.Generator().manual_seed(0)
            a = (2 * torch.rand(shape, generator=g) - 0.5).requires_grad_(True)
            grad_out = torch.randn(shape, generator=g)
            variants = {"Box.project": lambda: u.project(a), "torch.clamp": lambda: a.clamp(min=lo, max=hi)}
            if units == "relu":
                variants["torch.relu"] = lambda: torch.relu(a)
            grads = {k: torch.autograd.grad(f(), a, grad_out)[0] for k, f in variants.items()}
            same = torch.equal(grads["Box.project"], grads["torch.clamp"])
            times = {k: [] for k in variants}
            for r in range(args.repeats):
                for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                    f = variants[k]
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        torch.autograd.grad(f(), a, grad_out)
                    times[k].append((time.perf_counter() - t0) / args.calls)
            med = {k: 1e6 * statistics.median(v) for k, v in times.items()}
            rows.append((units, shape, med, same))
            print(units, shape, {k: round(v) for k, v in med.items()}, "same gradient" if same else "GRADIENTS DIFFER",
                  flush=True)
    lines = ["# Box units: forward and backward of the clamp", "",
             f"Command: `python benchmarks/bench_units.py --repeats {args.repeats} --calls {args.calls}` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); torch {torch.__version__}, one thread. µs per "
             "forward and `torch.autograd.grad` backward, median of the repeats (interleaved). *same*: "
             "`Box.project`'s gradient equals `torch.clamp`'s exactly.", "",
             "| units | shape | Box.project (µs) | torch.clamp (µs) | torch.relu (µs) | project / clamp | same |",
             "|---|---|---|---|---|---|---|"]
    for units, shape, med, same in rows:
        relu = f"{med['torch.relu']:.0f}" if "torch.relu" in med else "—"
        lines.append(f"| {units} | {'×'.join(map(str, shape))} | {med['Box.project']:.0f} | {med['torch.clamp']:.0f} | "
                     f"{relu} | **{med['Box.project'] / med['torch.clamp']:.2f}** | {'yes' if same else 'NO'} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
