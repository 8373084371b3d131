"""Compiled versus eager on the graph engine: conv nets and residual networks, predictive coding and back-propagation.

The graph engine's compiled units (:mod:`inferlearn.engine.compiled`) are predictive coding's value-node step on a
graph (``PC_GRAPH_STEP`` in ``engine/layered.py``: the predictions, their vector–Jacobian product traced into the
graph, the update) and back-propagation's forward pass of any model but a dense chain (``GRAPH_FORWARD`` in
``rules/backprop.py``, whose backward ``torch.compile`` compiles with it). On these models a step costs
milliseconds, so the per-call cost of a compiled step (tens of microseconds) does not matter; what does is whether
inductor's kernels beat eager PyTorch's. This script measures it, and ``--compile auto`` on CPU follows the result.

For each model (``conv:8-16/64``, ``vgg5:width=0.25``, ``resnet20:width=0.25``; ReLU, seed 0) and rule (``pc`` at its
defaults, T = 20 steps of 0.1; ``backprop``), on colour CIFAR-10 at batch ``--batch``, per mini-batch::

    opt.zero_grad(); rule.backward(model, x, labels); opt.step()        # SGD, lr 0.01

Timing protocol: one thread, eager and compiled (``compiling("on")``) in the same process, interleaved within each
repeat (direction alternating), each from the seed's weights on the same batches; ``--warmup`` untimed batches (the
compiled variant compiles there in the first repeat: its compile time, with a cold inductor cache unless
``--warm-cache``), then ``--batches`` timed ones; the median over ``--repeats`` of the per-batch time. After the
first repeat the two variants' parameters are compared (relative difference of the flattened parameters after the
same batches: float32 rounding only).

Usage (pinned to one core)::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_graph_compile.py \\
        --data-dir /path/to/cifar10-color --allow-unverified

Writes ``benchmarks/results/graph_compile.md`` and ``graph_compile.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

if "--warm-cache" not in sys.argv:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")


import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("conv:8-16/64", "vgg5:width=0.25", "resnet20:width=0.25")
RULES = ("pc", "backprop")
LR, SEED = 0.01, 0


def run(arch: str, rule_name: str, mode: str, data, idx, warmup: int):
    """Train on the batches ``idx``; returns (median seconds per timed batch, compile seconds, final parameters)."""
    from inferlearn.engine import compiled
    from inferlearn.models.build import build_model
    from inferlearn.rules import make_rule

    x, y = data
    model = build_model(arch, "relu", x.shape[1], 10, (3, 32, 32), seed=SEED)
    rule = make_rule(rule_name, {})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    c0, times = compiled.compile_seconds(), []
    with compiled.compiling("on" if mode == "compiled" else "off"), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # PC's far-from-equilibrium notice on VGG-5 / ResNet-20: not the point here
        for i, rows in enumerate(idx):
            if i == warmup:
                c1 = compiled.compile_seconds()
            t0 = time.perf_counter()
            opt.zero_grad()
            rule.backward(model, x[rows], y[rows])
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    if compiled.compile_failed():
        raise RuntimeError("torch.compile failed: the compiled variant ran eagerly")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return statistics.median(times), c1 - c0, params


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--allow-unverified", action="store_true", help="read the lossy development copy of CIFAR-10")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--batches", type=int, default=8, help="timed mini-batches per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (compile times warm)")
    ap.add_argument("--out", default=str(RESULTS / "graph_compile"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from inferlearn.data import load_dataset
    from inferlearn.errors import DataError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = load_dataset("cifar10", args.data_dir, allow_unverified=args.allow_unverified)
    except DataError as exc:
        print(f"bench_graph_compile: {exc}", file=sys.stderr)
        return 2
    x, y = d.train_x.reshape(d.train_x.shape[0], -1).float(), d.train_y
    n = args.warmup + args.batches
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))[:n * args.batch].view(n, args.batch)
    rows = []
    for arch in args.models.split(","):
        for rule_name in RULES:
            t = {"eager": [], "compiled": []}
            compile_s, diff = None, None
            for r in range(args.repeats):
                order = ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")
                params = {}
                for mode in order:
                    sec, comp, params[mode] = run(arch, rule_name, mode, (x, y), idx, args.warmup)
                    t[mode].append(sec)
                    if mode == "compiled" and r == 0:
                        compile_s = comp
                if r == 0:
                    diff = float((params["compiled"] - params["eager"]).norm() / params["eager"].norm())
            row = {"model": arch, "rule": rule_name, "eager_ms": 1e3 * statistics.median(t["eager"]),
                   "compiled_ms": 1e3 * statistics.median(t["compiled"]), "compile_s": compile_s, "param_diff": diff,
                   "eager_all_ms": [1e3 * v for v in t["eager"]], "compiled_all_ms": [1e3 * v for v in t["compiled"]]}
            row["ratio"] = row["compiled_ms"] / row["eager_ms"]
            rows.append(row)
            print(f"{arch:22s} {rule_name:9s} eager {row['eager_ms']:8.1f} ms  compiled {row['compiled_ms']:8.1f} ms  "
                  f"ratio {row['ratio']:.2f}  compile {compile_s:.1f} s  params rel diff {diff:.1e}", flush=True)
    write(rows, args, d)
    return 0


def write(rows, args, d) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    unverified = bool(d.meta.get("unverified_files"))
    cmd = " ".join(["python benchmarks/bench_graph_compile.py",
                    *("DIR" if a.startswith("/") else a for a in sys.argv[1:])])
    lines = [
        "# Compiled vs eager on the graph engine (conv nets, residual networks)", "",
        f"Command: `{cmd}` (commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); torch "
        f"{torch.__version__}, one thread.", "",
        f"Data: CIFAR-10 colour, {'the lossy JPEG-derived development copy (--allow-unverified)' if unverified else 'the published files'}; "
        f"batch {args.batch}, {args.batches} timed mini-batches after {args.warmup} warm-up ones, median per mini-batch, "
        f"median of {args.repeats} interleaved repeats. *compile*: seconds spent compiling in the warm-up "
        f"({'warm' if args.warm_cache else 'cold'} inductor cache). *params diff*: relative difference of the parameters "
        "after the same batches, compiled vs eager.", "",
        "| model | rule | eager (ms / batch) | compiled (ms / batch) | compiled / eager | compile (s) | params diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| `{r['model']}` | {r['rule']} | {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | **{r['ratio']:.2f}** | "
                     f"{r['compile_s']:.1f} | {r['param_diff']:.1e} |")
    pc = [r["ratio"] for r in rows if r["rule"] == "pc"]
    bp = [r["ratio"] for r in rows if r["rule"] == "backprop"]
    lines += ["", f"Predictive coding's compiled step: compiled / eager {min(pc):.2f}-{max(pc):.2f}; back-propagation's "
              f"compiled forward and backward: {min(bp):.2f}-{max(bp):.2f}. `--compile auto` on CPU compiles the first "
              "for runs of at least `GRAPH_AUTO_CPU_MIN_BATCHES` mini-batches and keeps it where it measures faster than "
              "eager; it leaves the second eager; `on` compiles both.", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "batch": args.batch}, indent=1))
    print(f"wrote {out.with_suffix('.md')}")


if __name__ == "__main__":
    sys.exit(main())
