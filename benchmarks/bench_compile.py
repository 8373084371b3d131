"""Compiled inference steps versus eager: epoch time of every rule, ratio to back-propagation, compile time.

For each rule (back-propagation, Fenchel BP, contrastive, EqProp, lifted J_0, predictive coding T = 15,
lifted Fenchel) this times training on MNIST with ``MLP("784-64-64-64-10", "relu", seed=0)`` and
``torch.optim.SGD(lr=0.05)``, eager and with the compiled steps of :mod:`inferlearn.engine.compiled`
(``compiling("on")``: ``torch.compile(dynamic=False)`` of one step, inductor's C++ kernels on CPU), at
batch 50 and 256. Per mini-batch::

    opt.zero_grad(); rule.backward(model, x, labels); opt.step()

Timing protocol (the machine is shared and noisy): one thread, every variant in the same process,
variants interleaved round-robin within each repeat (direction alternating between repeats), each run
from the seed's initial weights on the same batches, ``--warmup`` untimed mini-batches (the compiled
variant compiles there, in the first repeat: that is its compile time) then ``--batches`` timed ones,
scaled to an epoch (``ceil(60000 / batch)`` mini-batches); the median over ``--repeats``. Compile times
are cold: inductor's on-disk cache points at a fresh folder (``--warm-cache`` keeps the user's).

It also counts the operations of one eager mini-batch (torch.profiler, top-level ``aten::`` calls) of
contrastive, EqProp and PC at batch 50, and times the step-size bound (:func:`gram_norm_bound`) against
the symmetric eigen-solve it replaced. ``--baseline-src DIR`` adds the operation counts and eager epoch
times of another checkout's ``src`` (e.g. ``git archive`` of the commit before this work).

Usage (pinned to one core)::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_compile.py --batches 200 --repeats 5

Writes ``benchmarks/results/compile.md`` and ``compile.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

if "--warm-cache" not in sys.argv and "--child" not in sys.argv:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

if os.environ.get("BENCH_SRC"):   # the baseline's subprocess: import the other checkout, not the installed package
    sys.path.insert(0, os.environ["BENCH_SRC"])

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ARCH, ACT, LR, SEED, N_TRAIN = "784-64-64-64-10", "relu", 0.05, 0, 60000
RULES = ("backprop", "fenchel-bp", "contrastive", "eqprop", "lifted-j0", "pc", "lifted-fenchel")
TARGETS = {"contrastive": 2.0, "eqprop": 2.5, "fenchel-bp": 1.1}
OPS_RULES = ("contrastive", "eqprop", "pc")


def load():
    from inferlearn.data import load_dataset

    d = load_dataset("mnist")
    return d.train_x, d.train_y


def batches(n: int, count: int, batch: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    while perm.numel() < count * batch:
        perm = torch.cat([perm, torch.randperm(n, generator=g)])
    return perm[:count * batch].view(count, batch)


def run(rule_name: str, mode: str, x, y, idx, warmup: int) -> tuple[float, float]:
    """Train on ``idx``; returns (seconds of the timed batches, compile seconds during the warm-up)."""
    from inferlearn.models import MLP
    from inferlearn.rules import make_rule

    compiled = None
    if mode != "eager":
        from inferlearn.engine import compiled
    model = MLP(ARCH, ACT, seed=SEED)
    rule = make_rule(rule_name, {})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ctx = compiled.compiling("on") if compiled else _null()
    c0 = compiled.compile_seconds() if compiled else 0.0
    t0 = None
    with ctx, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # solver tolerance misses: not the point here
        for i, rows in enumerate(idx):
            if i == warmup:
                c1 = compiled.compile_seconds() if compiled else 0.0
                t0 = time.perf_counter()
            opt.zero_grad()
            rule.backward(model, x[rows], y[rows])
            opt.step()
    if compiled and compiled.compile_failed():
        raise RuntimeError("torch.compile failed: the compiled variant ran eagerly")
    return time.perf_counter() - t0, (c1 - c0)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def timing(x, y, batch: int, modes: tuple[str, ...], rules, n_batches: int, warmup: int, repeats: int):
    n_batches = max(20, round(n_batches * 50 / batch))   # about the same number of samples at every batch size
    idx = batches(x.shape[0], warmup + n_batches, batch)
    per_epoch = math.ceil(N_TRAIN / batch) / n_batches
    variants = [(r, m) for r in rules for m in modes]
    times = {v: [] for v in variants}
    compile_s = {}
    for rep in range(repeats):
        order = variants if rep % 2 == 0 else variants[::-1]
        for v in order:
            t, c = run(v[0], v[1], x, y, idx, warmup)
            times[v].append(t * per_epoch)
            if v[1] != "eager" and v not in compile_s:
                compile_s[v] = c
            print(f"  batch {batch} rep {rep + 1}/{repeats} {v[0]:>15} {v[1]:>8}: {t * per_epoch:6.2f} s/epoch"
                  + (f" (compiled in {c:.1f} s)" if v[1] != 'eager' and rep == 0 else ""), flush=True)
    return {f"{r}|{m}": {"median": statistics.median(ts), "all": ts} for (r, m), ts in times.items()}, \
        {f"{r}|{m}": s for (r, m), s in compile_s.items()}


def op_counts(x, y, batch: int = 50) -> dict:
    """Top-level aten operations of one eager mini-batch (after 5 warm-up batches) per rule."""
    from torch.profiler import ProfilerActivity, profile

    from inferlearn.models import MLP
    from inferlearn.rules import make_rule

    out = {}
    for name in OPS_RULES:
        model = MLP(ARCH, ACT, seed=SEED)
        rule = make_rule(name, {})
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(5):
                opt.zero_grad()
                rule.backward(model, x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
                opt.step()
            opt.zero_grad()
            with profile(activities=[ProfilerActivity.CPU]) as p:
                rule.backward(model, x[:batch], y[:batch])
        ev = [e for e in p.events() if e.name.startswith("aten::")
              and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
        out[name] = len(ev)
    return out


def lambda_timing(repeats: int = 300) -> dict:
    """Microseconds per call: the symmetric eigen-solve of the Gram matrix vs the squaring bound."""
    from inferlearn.engine.problems import gram_norm_bound
    from inferlearn.models import MLP

    W = MLP(ARCH, ACT, seed=SEED).layers[1].weight.detach()

    def eig(W):
        W = W.to(torch.float64)
        return float(torch.linalg.eigvalsh(W.t() @ W)[-1])

    res = {}
    for _ in range(2):
        for name, f in (("eigvalsh", eig), ("gram_norm_bound", gram_norm_bound)):
            f(W)
            t0 = time.perf_counter()
            for _ in range(repeats):
                f(W)
            res.setdefault(name, []).append((time.perf_counter() - t0) / repeats * 1e6)
    out = {k: min(v) for k, v in res.items()}
    out["bound/exact"] = gram_norm_bound(W) / eig(W)
    return out


def child(args) -> int:
    """Baseline measurements in a subprocess (``BENCH_SRC`` points at the other checkout)."""
    x, y = load()
    res = {"ops": op_counts(x, y)}
    t, _ = timing(x, y, 50, ("eager",), args.rules, args.batches, args.warmup, args.repeats)
    res["eager50"] = t
    print("JSON" + json.dumps(res))
    return 0


def environment() -> str:
    import platform

    aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS')}, CPU affinity {aff}, Python {platform.python_version()}, "
            f"{platform.machine()}, load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def write(results: dict, args, cmd: str, elapsed: float) -> str:
    L = ["# Compiled inference steps versus eager (CPU)", "", "Command:", "", "```", cmd, "```", "",
         f"MNIST, `MLP(\"{ARCH}\", \"{ACT}\", seed={SEED})`, `torch.optim.SGD(lr={LR})`, default rule options "
         "(PC: T = 15 steps). Loop per mini-batch: `opt.zero_grad(); rule.backward(model, x, labels); opt.step()`. "
         f"Each run starts from the seed's initial weights, trains {args.warmup} untimed warm-up mini-batches "
         f"(where the compiled variant compiles, in the first repeat), then times {args.batches} mini-batches at batch 50 "
         "(the same number of samples at larger batches, at least 20 mini-batches), scaled to an epoch (ceil(60000 / batch) mini-batches). All variants in one process, round-robin within "
         f"each repeat (direction alternating); medians over {args.repeats} repeats. {environment()}. "
         f"Compile times {'with a warm' if args.warm_cache else 'cold (a fresh)'} inductor cache. "
         f"Total wall time: {elapsed / 60:.1f} min.", "",
         "*compiled* = `inferlearn.engine.compiled.compiling(\"on\")` (`--compile` on the command line): one step "
         "of each rule (the block sweep, the PC step, the back-propagation step) through "
         "`torch.compile(dynamic=False, fullgraph=True)`, one graph per shape reused across steps and batches. "
         "Ratios to BP: each rule's median epoch over back-propagation's median epoch in the same mode "
         "(*best* = each rule's faster mode over BP's faster mode).", ""]
    for batch in args.batch_sizes:
        t, comp = results["times"][str(batch)], results["compile"][str(batch)]
        bp = {m: t[f"backprop|{m}"]["median"] for m in ("eager", "compiled")}
        bp_best = min(bp.values())
        L += [f"## Batch {batch}", "",
              "| rule | eager s/epoch | compiled s/epoch | compiled/eager | eager/BP | compiled/BP | best/BP-best | compile time (s) |",
              "|---|---|---|---|---|---|---|---|"]
        for r in args.rules:
            e, c = t[f"{r}|eager"]["median"], t[f"{r}|compiled"]["median"]
            L.append(f"| {r} | {e:.2f} | {c:.2f} | {c / e:.2f} | {e / bp['eager']:.2f} | {c / bp['compiled']:.2f} | "
                     f"**{min(e, c) / bp_best:.2f}** | {comp.get(f'{r}|compiled', float('nan')):.1f} |")
        L += ["", "Spread (min – max s/epoch over repeats): " + "; ".join(
            f"{k.replace('|', ' ')} {min(v['all']):.2f}–{max(v['all']):.2f}" for k, v in t.items()), ""]
    b0 = str(args.batch_sizes[0])
    t0 = results["times"][b0]
    bp_best = min(t0["backprop|eager"]["median"], t0["backprop|compiled"]["median"])
    L += [f"## Targets (batch {b0}, each rule's faster mode over back-propagation's faster mode)", "",
          "| rule | target | measured | met |", "|---|---|---|---|"]
    for r, target in TARGETS.items():
        if f"{r}|eager" not in t0:
            continue
        best = min(t0[f"{r}|eager"]["median"], t0[f"{r}|compiled"]["median"]) / bp_best
        L.append(f"| {r} | ≤ {target:g}× BP | {best:.2f}× | {'yes' if best <= target else 'no'} |")
    L.append("| pc (T = 15) | as fast as PCX (JAX) | see the PCX benchmark | — |")
    L += ["", "## Operations per eager mini-batch (batch 50, top-level `aten::` calls, torch.profiler)", ""]
    base = results.get("baseline")
    if base:
        bbp = base["eager50"].get("backprop|eager", {}).get("median", float("nan"))
        abp = t0["backprop|eager"]["median"]
        L += ["| rule | operations before | after | eager s/epoch before | after | eager/BP before | after |",
              "|---|---|---|---|---|---|---|"]
        for r in OPS_RULES:
            bt = base["eager50"].get(f"{r}|eager", {}).get("median", float("nan"))
            at = t0[f"{r}|eager"]["median"]
            L.append(f"| {r} | {base['ops'][r]} | {results['ops'][r]} | {bt:.2f} | {at:.2f} | {bt / bbp:.2f} | "
                     f"{at / abp:.2f} |")
        L.append(f"| backprop | — | — | {bbp:.2f} | {abp:.2f} | 1.00 | 1.00 |")
        label = args.baseline_label or f"`{args.baseline_src}`"
        L += ["", f"*before* = {label} (its eager epoch times measured in a separate process, "
              "same protocol, so compare them loosely)."]
    else:
        L += ["| rule | operations |", "|---|---|"] + [f"| {r} | {results['ops'][r]} |" for r in OPS_RULES]
    lt = results["lambda"]
    L += ["", "## Step-size bound", "",
          f"λ_max(WᵀW) of the MLP's 64×64 layer: symmetric eigen-solve (float64 `eigvalsh`) {lt['eigvalsh']:.0f} µs, "
          f"`gram_norm_bound` (four squarings) {lt['gram_norm_bound']:.0f} µs per call (best of 2 × 300); the bound "
          f"is {lt['bound/exact']:.4f} × the exact value.", ""]
    return "\n".join(L) + "\n"


def plot(results: dict, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.batch_sizes), figsize=(6 * len(args.batch_sizes), 4), squeeze=False)
    for ax, batch in zip(axes[0], args.batch_sizes):
        t = results["times"][str(batch)]
        bp = t["backprop|eager"]["median"]
        xs = range(len(args.rules))
        for j, (mode, color) in enumerate((("eager", "tab:gray"), ("compiled", "tab:blue"))):
            ax.bar([i + 0.4 * j - 0.2 for i in xs], [t[f"{r}|{mode}"]["median"] / bp for r in args.rules], 0.4,
                   label=mode, color=color)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(args.rules, rotation=30, ha="right")
        ax.set_ylabel("epoch time / eager back-propagation")
        ax.set_title(f"MNIST MLP, batch {batch}, 1 CPU thread")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200, help="timed mini-batches per run at batch 50 (scaled to the "
                   "same number of samples at other batch sizes)")
    p.add_argument("--warmup", type=int, default=5, help="untimed mini-batches per run (compilation happens here)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[50, 256])
    p.add_argument("--rules", nargs="+", default=list(RULES))
    p.add_argument("--baseline-src", default=None, help="another checkout's src/ for operation counts and eager times")
    p.add_argument("--baseline-label", default=None, help="how the results name the baseline (e.g. its commit)")
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (compile times warm)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        return child(args)
    if "backprop" not in args.rules:
        args.rules.insert(0, "backprop")
    start = time.perf_counter()
    x, y = load()
    results = {"times": {}, "compile": {}}
    if args.baseline_src:
        env = dict(os.environ, BENCH_SRC=str(Path(args.baseline_src).resolve()))
        cmd = [sys.executable, __file__, "--child", "--batches", str(args.batches), "--warmup", str(args.warmup),
               "--repeats", str(max(1, args.repeats // 2)), "--rules", "backprop", *OPS_RULES]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results["baseline"] = json.loads(out.split("JSON", 1)[1])
        print("baseline:", results["baseline"]["ops"], flush=True)
    results["ops"] = op_counts(x, y)
    print("ops:", results["ops"], flush=True)
    results["lambda"] = lambda_timing()
    for batch in args.batch_sizes:
        t, c = timing(x, y, batch, ("eager", "compiled"), args.rules, args.batches, args.warmup, args.repeats)
        results["times"][str(batch)], results["compile"][str(batch)] = t, c
    elapsed = time.perf_counter() - start
    cmd = "OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_compile.py " + " ".join(
        repr(a) if " " in a else a for a in (argv if argv is not None else sys.argv[1:]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compile.md").write_text(write(results, args, cmd, elapsed))
    (RESULTS / "compile.json").write_text(json.dumps(results, indent=1))
    plot(results, args, RESULTS / "compile.png")
    print((RESULTS / "compile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
