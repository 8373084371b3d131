"""Rules on a residual network: epoch-time ratios to back-propagation on ``resnet20``, beside their floors.

Times one training step (``opt.zero_grad(); rule.backward(model, x, labels); opt.step()``) of each rule
on the zoo's CIFAR ResNet-20 (``--arch resnet20``: 3 stages of 3 basic blocks, no BatchNorm, option-B
shortcuts as the zoo builds them), batch 32, 3×32×32 inputs, and reports the ratio to back-propagation's
step (= the epoch-time ratio at a fixed batch size).

The **multiply-add floor** of predictive coding with ``T`` inference steps counts passes through the
network: the forward pass that initialises the value nodes, ``T`` steps that each need the predictions
(one forward) and the gradient with respect to the value nodes (one backward), and the weight gradient
(one backward), against back-propagation's forward plus two backward passes: ``(2T + 2) / 3``
(5.33 at ``T = 7``, PCX's VGG-5 setting). For the lifted rules the floor is set by the solver's sweeps
(each about one forward and one adjoint pass), reported as measured.

Timing protocol: one thread, all variants in one process, interleaved round-robin within each repeat,
each from the same initial weights; inputs are uniform random tensors of CIFAR's shape (the cost of
a step does not depend on the pixel values, except the lifted solvers' sweep counts, which are reported);
the median over ``--repeats``.

Usage::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_graph.py --repeats 5

Writes ``benchmarks/results/graph_<arch>.md`` (e.g. ``graph_resnet20.md``; ``--arch vgg5:width=0.5`` →
``graph_vgg5_width_0_5.md``).
"""
from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
import warnings
from pathlib import Path


import torch  # noqa: E402

from inferlearn import read_graph  # noqa: E402
from inferlearn.models import build_model  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE, CLASSES, BATCH = (3, 32, 32), 10, 32
# The lifted two-phase rules (contrastive, EqProp) are left out: their signal γ^(ℓ_L − 1) over resnet20's
# longest path (ℓ_L = 20 nodes) is 1e-23 at γ = 1/16, below float32's and float64's resolution
# (they warn with PrecisionWarning and their gradients are round-off).
VARIANTS = [("backprop", "backprop", {}), ("pc T=7", "pc", {"steps": 7}), ("pc T=20", "pc", {"steps": 20}),
            ("fenchel-bp", "fenchel-bp", {})]


def step_time(model, rule, batches, warmup: int = 1) -> tuple[float, float]:
    """Median seconds per step over ``batches`` (after ``warmup`` untimed ones) and mean solver sweeps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times, sweeps = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (x, y) in enumerate(batches):
            t = time.perf_counter()
            opt.zero_grad()
            info = rule.backward(model, x, y)
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t)
                ex = info.extras
                sweeps.append(ex.get("solver_iterations", ex.get("inference_steps", 0)) + ex.get("free_solver_iterations", 0))
    return statistics.median(times), (sum(sweeps) / len(sweeps) if sweeps else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="resnet20")
    p.add_argument("--batches", type=int, default=4, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    n = SHAPE[0] * SHAPE[1] * SHAPE[2]
    base = build_model(args.arch, "relu", n, CLASSES, SHAPE, seed=0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(BATCH, n, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
               for _ in range(args.batches + 1)]
    graph = read_graph(base, example=batches[0][0])
    runs: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
    sweeps: dict[str, float] = {}
    for r in range(args.repeats):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for label, name, opts in order:
            t, s = step_time(copy.deepcopy(base), make_rule(name, opts), batches)
            runs[label].append(t)
            sweeps[label] = s
    bp = statistics.median(runs["backprop"])
    rows = []
    for label, name, opts in VARIANTS:
        med = statistics.median(runs[label])
        floor = ""
        if name == "pc":
            floor = f"{(2 * opts['steps'] + 2) / 3:.2f}"
        elif name == "fenchel-bp":
            floor = "1.00"
        rows.append(f"| {label} | {med * 1000:.1f} | **{med / bp:.2f}** | {floor} |")
    params = sum(p.numel() for p in base.parameters())
    text = f"""# Rules on a residual network: `{args.arch}` step-time ratios to back-propagation

Command:

```
OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_graph.py --arch {args.arch} --repeats {args.repeats}
```

Model: the zoo's `{args.arch}` ({params:,} parameters; read as a graph of {graph.depth} nodes with
{sum(len(l.edges) for l in graph.nodes)} edges, {sum(len(l.edges) > 1 for l in graph.nodes)} of the nodes summing a skip connection),
batch {BATCH}, 3×32×32 uniform random inputs, SGD; default rule options except `steps`. Median over {args.repeats}
interleaved repeats of the median of {args.batches} timed steps. torch {torch.__version__}, {args.threads} thread(s),
Python {platform.python_version()}, {platform.machine()}. Total wall time: {(time.time() - start) / 60:.1f} min.

The PC floor `(2T + 2)/3` counts passes through the network (module docstring); a ratio at the floor
means no overhead beyond the passes the method needs.

| rule | ms / step | ratio to BP | multiply-add floor |
|---|---|---|---|
""" + "\n".join(rows) + "\n"
    if args.arch.startswith("vgg5"):
        text += ("\nPCX (Pinchetti et al. 2024, arXiv:2407.01163) reports PC's time per epoch at 4.65× BP's on VGG-5 "
                 "at T = 7, on a GPU; the ratio above is ours on one CPU core, beside the same floor.\n")
    RESULTS.mkdir(exist_ok=True)
    name = "".join(c if c.isalnum() else "_" for c in args.arch).strip("_")
    (RESULTS / f"graph_{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
