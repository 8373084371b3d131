"""GPU: every rule eager vs compiled vs CUDA graphs, on the MNIST MLP and the conv net, batch 50 / 256 / 1024.

Three modes of :mod:`inferlearn.engine.compiled`:

* ``eager``      -- ``compiling("off")``;
* ``compiled``   -- ``compiling("no-cudagraphs")``: one step of each rule through ``torch.compile(dynamic=False)``
  (inductor's Triton kernels);
* ``cudagraphs`` -- ``compiling("on")`` (the default on CUDA, ``TrainConfig.compile="auto"``): the same
  with ``mode="reduce-overhead"``, each compiled step captured once as a CUDA graph and replayed.

Models: ``MLP("784-64-64-64-10", "relu", seed=0)`` and ``conv_net((1, 28, 28), [8, 16], [64], 10)`` (the
``conv:8-16/64`` of ``inferlearn train``). On the conv net only the steps of chains of ``nn.Linear`` maps
are compiled (the block sweep, the PC step, the BP step of dense chains); the generic conv paths run
eagerly in every mode, so their three columns should agree -- that is a measurement of what is not
compiled yet, not noise.

Protocol per (model, batch, rule, mode): the data on the GPU, ``--warmup`` untimed mini-batches (the
compiled modes compile there; their compile time is reported), then ``--batches`` timed ones between
``torch.cuda.synchronize()`` calls, scaled to an epoch (``ceil(60000 / batch)`` mini-batches); modes and
rules interleaved within each repeat; median over ``--repeats``. Ratios are to eager back-propagation
on the same model and batch.

Usage (on a machine with an NVIDIA GPU; without one it stops with one line)::

    python benchmarks/bench_gpu.py --batches 100 --repeats 3

Writes ``benchmarks/results/gpu.md`` and ``gpu.png``. ``--quick`` runs a few rules and batches only
(a check that the script works, in about two minutes).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path


import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RULES = ("backprop", "fenchel-bp", "contrastive", "eqprop", "lifted-j0", "pc", "lifted-fenchel")
MODES = {"eager": "off", "compiled": "no-cudagraphs", "cudagraphs": "on"}
MODELS = ("mlp", "conv")
N_TRAIN, LR, SEED = 60000, 0.05, 0


def build(kind: str, device: torch.device) -> torch.nn.Module:
    from inferlearn.models import MLP, conv_net

    model = MLP("784-64-64-64-10", "relu", seed=SEED) if kind == "mlp" else conv_net((1, 28, 28), [8, 16], [64], 10, seed=SEED)
    return model.to(device)


def run(kind: str, rule_name: str, mode: str, x, y, idx, warmup: int, device) -> tuple[float, float]:
    """Seconds of the timed mini-batches and compile seconds during the warm-up."""
    from inferlearn.engine import compiled
    from inferlearn.rules import make_rule

    model = build(kind, device)
    rule = make_rule(rule_name, {})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    c0 = compiled.compile_seconds()
    t0 = c1 = None
    with compiled.compiling(MODES[mode]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, rows in enumerate(idx):
            if i == warmup:
                torch.cuda.synchronize()
                c1 = compiled.compile_seconds()
                t0 = time.perf_counter()
            opt.zero_grad()
            rule.backward(model, x[rows], y[rows])
            opt.step()
        torch.cuda.synchronize()
    if compiled.compile_failed():
        raise RuntimeError(f"torch.compile failed ({kind}, {rule_name}, {mode}); see the warning above")
    return time.perf_counter() - t0, c1 - c0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=100, help="timed mini-batches per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed mini-batches (compilation, CUDA-graph capture)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[50, 256, 1024])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rules", nargs="+", default=list(RULES))
    p.add_argument("--quick", action="store_true", help="MLP, batch 256, backprop/contrastive/pc, 1 repeat")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu.py: no CUDA device (torch.cuda.is_available() is False); run it on a machine with an "
              "NVIDIA GPU and a CUDA build of PyTorch", file=sys.stderr)
        return 2
    if args.quick:
        args.models, args.batch_sizes, args.rules, args.repeats, args.batches = ["mlp"], [256], \
            ["backprop", "contrastive", "pc"], 1, 30
    if "backprop" not in args.rules:
        args.rules.insert(0, "backprop")
    device = torch.device("cuda")
    from inferlearn.data import load_dataset

    data = load_dataset("mnist")
    x, y = data.train_x.to(device), data.train_y.to(device)
    start = time.perf_counter()
    times: dict[str, list[float]] = {}
    compile_s: dict[str, float] = {}
    for kind in args.models:
        for batch in args.batch_sizes:
            g = torch.Generator().manual_seed(1)
            idx = torch.randperm(x.shape[0], generator=g)[:(args.warmup + args.batches) * batch]
            idx = idx.view(-1, batch).to(device)
            per_epoch = math.ceil(N_TRAIN / batch) / args.batches
            for rep in range(args.repeats):
                variants = [(r, m) for r in args.rules for m in MODES]
                for rule_name, mode in (variants if rep % 2 == 0 else variants[::-1]):
                    key = f"{kind}|{batch}|{rule_name}|{mode}"
                    t, c = run(kind, rule_name, mode, x, y, idx, args.warmup, device)
                    times.setdefault(key, []).append(t * per_epoch)
                    if mode != "eager":
                        compile_s[key] = max(compile_s.get(key, 0.0), c)
                    print(f"{key}: {t * per_epoch:.3f} s/epoch" + (f" (compile {c:.1f} s)" if c else ""), flush=True)
    elapsed = time.perf_counter() - start
    med = {k: statistics.median(v) for k, v in times.items()}
    cmd = "python benchmarks/bench_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# Rules on the GPU: eager vs compiled vs CUDA graphs", "", "Command:", "", "```", cmd, "```", "",
             f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, Python "
             f"{platform.python_version()}. MNIST on the GPU, SGD lr {LR}, default rule options; {args.warmup} "
             f"warm-up then {args.batches} timed mini-batches per run, scaled to an epoch; median of "
             f"{args.repeats} interleaved repeats. Total wall time {elapsed / 60:.1f} min. Modes: eager "
             "(`compiling(\"off\")`), compiled (`\"no-cudagraphs\"`), CUDA graphs (`\"on\"`, the CUDA default). "
             "On the conv net only dense (Linear) steps are compiled; its generic conv paths run eagerly in "
             "every mode.", ""]
    for kind in args.models:
        for batch in args.batch_sizes:
            bp = med[f"{kind}|{batch}|backprop|eager"]
            lines += [f"## {kind}, batch {batch}", "",
                      "| rule | eager s/epoch | compiled | CUDA graphs | eager/BP | compiled/BP | CUDA graphs/BP | compile s (compiled, graphs) |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in args.rules:
                e, c, g = (med[f"{kind}|{batch}|{r}|{m}"] for m in MODES)
                cs = [compile_s.get(f"{kind}|{batch}|{r}|{m}", 0.0) for m in ("compiled", "cudagraphs")]
                lines.append(f"| {r} | {e:.3f} | {c:.3f} | {g:.3f} | {e / bp:.2f} | {c / bp:.2f} | {g / bp:.2f} | "
                             f"{cs[0]:.1f}, {cs[1]:.1f} |")
            lines.append("")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gpu.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "gpu.json").write_text(json.dumps({"times": times, "compile_seconds": compile_s}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, b) for k in args.models for b in args.batch_sizes]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (kind, batch) in zip(axes[0], panels):
        bp = med[f"{kind}|{batch}|backprop|eager"]
        for j, mode in enumerate(MODES):
            ax.bar([i + 0.27 * (j - 1) for i in range(len(args.rules))],
                   [med[f"{kind}|{batch}|{r}|{mode}"] / bp for r in args.rules], 0.27, label=mode)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(args.rules)))
        ax.set_xticklabels(args.rules, rotation=30, ha="right")
        ax.set_title(f"{kind}, batch {batch}")
        ax.set_ylabel("epoch time / eager back-propagation")
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "gpu.png", dpi=110)
    print((RESULTS / "gpu.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
