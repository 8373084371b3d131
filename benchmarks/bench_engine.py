"""Generic layered engine versus the fused dense engine on an MLP: epoch time, ratios, agreement.

For each energy-based rule (contrastive, eqprop, lifted-j0, pc) this times training with
``engine="generic"`` against ``engine="auto"`` (the fused dense path on an MLP), and both against
back-propagation, on MNIST with ``MLP("784-64-64-64-10", "relu", seed=0)``, batch 50,
``torch.optim.SGD(lr=0.05)``. Per mini-batch::

    opt.zero_grad(); rule.backward(model, x, labels); opt.step()

Timing protocol (the machine is shared and noisy): one thread, every variant in the same process,
variants interleaved round-robin within each repeat, each variant run starts from the seed's
initial weights on the same batch sequence, ``--warmup`` untimed batches then ``--batches`` timed
ones, scaled to a full epoch (``60000 / batch`` mini-batches); the median over ``--repeats``.

It also checks that the two engines agree: the cosine between their gradients on one batch (at
initialisation and after a short training), and the test accuracy after one epoch on the first
``--acc-train`` training images.

Usage (pinned to one core)::

    OMP_NUM_THREADS=1 taskset -c 1 \\
        .venv/bin/python benchmarks/bench_engine.py --batches 300 --repeats 7

``--profile RULE`` instead profiles the generic engine of one rule with cProfile (``--batches``
mini-batches) and prints the top functions.

Writes ``benchmarks/results/engine_generic_vs_fused.md`` and ``.png``.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import platform
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path


import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from inferlearn.data import load_dataset  # noqa: E402
from inferlearn.models import MLP  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402
from inferlearn.units import Clamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "engine_generic_vs_fused"
WARNINGS: collections.Counter = collections.Counter()   # solver warnings (missed tolerance) per rule/engine
ITERATIONS: dict[str, list] = collections.defaultdict(list)   # solver iterations per timed mini-batch
RULES = ("contrastive", "eqprop", "lifted-j0", "pc")
ARCH, ACT, BATCH, LR, SEED = "784-64-64-64-10", "relu", 50, 0.05, 0


def build_model(kind: str = "mlp") -> nn.Module:
    """The benchmark MLP; ``kind="sequential"``: the same weights as a plain ``nn.Sequential``."""
    mlp = MLP(ARCH, ACT, seed=SEED)
    if kind == "mlp":
        return mlp
    mods: list[nn.Module] = []
    for i, lin in enumerate(mlp.layers):
        mods.append(lin)
        if i < len(mlp.activations):
            mods.append(Clamp(ACT))
    return nn.Sequential(*mods)


def variants() -> list[tuple[str, str, dict, str]]:
    """``(label, rule, options, model kind)``; back-propagation first."""
    out = [("backprop", "backprop", {}, "mlp"),
           ("backprop autograd (nn.Sequential)", "backprop", {"fused": False}, "sequential")]
    for r in RULES:
        out.append((f"{r} fused", r, {"engine": "auto"}, "mlp"))
        out.append((f"{r} generic", r, {"engine": "generic"}, "mlp"))
    return out


def batch_order(n: int, count: int, seed: int = 1) -> torch.Tensor:
    """``count`` mini-batch index rows drawn from a fixed permutation of ``n`` samples."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    need = count * BATCH
    while perm.numel() < need:
        perm = torch.cat([perm, torch.randperm(n, generator=g)])
    return perm[:need].view(count, BATCH)


def train(model: nn.Module, rule, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, warmup: int = 0) -> float:
    """Train on the mini-batches ``idx`` (rows); return the wall time of all but the first ``warmup``."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    t0, its = None, []
    with warnings.catch_warnings(record=True) as caught:   # solver tolerance misses: counted, not printed
        warnings.simplefilter("always")
        for i, rows in enumerate(idx):
            if i == warmup:
                t0 = time.perf_counter()
            xb, yb = x[rows], y[rows]
            opt.zero_grad()
            info = rule.backward(model, xb, yb)
            opt.step()
            if i >= warmup:
                ex = info.extras   # eqprop: free phase + nudged phase(s)
                its.append(ex.get("solver_iterations", ex.get("inference_steps", 0)) + ex.get("free_solver_iterations", 0))
    t = time.perf_counter() - t0 if t0 is not None else 0.0
    key = getattr(rule, "name", "?") + (f" {rule.engine}" if hasattr(rule, "engine") else "")
    WARNINGS[key] += len(caught)
    ITERATIONS[key].extend(its)
    return t


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(1) == y).float().mean())


def grads(model: nn.Module, rule, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, y)
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()   # float32 grads, float64 cosines
    model.zero_grad(set_to_none=True)
    return g


def per_layer_cos(model: nn.Module, a: torch.Tensor, b: torch.Tensor) -> float:
    """The smallest cosine over the parameter tensors."""
    out, i = [], 0
    for p in model.parameters():
        n = p.numel()
        out.append(float(torch.nn.functional.cosine_similarity(a[i:i + n], b[i:i + n], dim=0)))
        i += n
    return min(out)


def agreement(data, n_train: int) -> dict[str, dict]:
    """Gradient cosines (init and after training) and test accuracy, fused versus generic."""
    xb, yb = data.test_x[:BATCH], data.test_y[:BATCH]    # a fixed batch, not used for training
    idx = batch_order(n_train, n_train // BATCH, seed=2)
    out = {}
    for r in RULES:
        fused, generic = make_rule(r, {"engine": "auto"}), make_rule(r, {"engine": "generic"})
        row = {}
        m = build_model()
        gf, gg = grads(m, fused, xb, yb), grads(m, generic, xb, yb)
        row["cos_init"] = float(torch.nn.functional.cosine_similarity(gf, gg, dim=0))
        row["cos_init_min_layer"] = per_layer_cos(m, gf, gg)
        row["rel_err_init"] = float((gf - gg).norm() / gf.norm())
        accs = {}
        for eng, rule in (("fused", fused), ("generic", generic)):
            m = build_model()
            train(m, rule, data.train_x[:n_train], data.train_y[:n_train], idx)
            accs[eng] = accuracy(m, data.test_x, data.test_y)
            if eng == "fused":   # gradients of both engines at the fused-trained weights
                gf, gg = grads(m, fused, xb, yb), grads(m, generic, xb, yb)
                row["cos_trained"] = float(torch.nn.functional.cosine_similarity(gf, gg, dim=0))
                row["cos_trained_min_layer"] = per_layer_cos(m, gf, gg)
                row["rel_err_trained"] = float((gf - gg).norm() / gf.norm())
        row["acc_fused"], row["acc_generic"] = accs["fused"], accs["generic"]
        out[r] = row
        print(f"[agree] {r}: {row}", flush=True)
    return out


def timing(data, batches: int, warmup: int, repeats: int) -> dict[str, list[float]]:
    vs = variants()
    idx = batch_order(data.train_x.shape[0], warmup + batches, seed=1)
    per_epoch = data.train_x.shape[0] / BATCH / batches    # scale factor: timed batches -> one epoch
    times: dict[str, list[float]] = {label: [] for label, *_ in vs}
    for rep in range(repeats):
        order = vs if rep % 2 == 0 else vs[::-1]          # alternate direction: no fixed position bias
        for label, rule, opts, kind in order:
            model = build_model(kind)
            t = train(model, make_rule(rule, opts), data.train_x, data.train_y, idx, warmup)
            times[label].append(t * per_epoch)
        print(f"[time] repeat {rep + 1}/{repeats}: " +
              ", ".join(f"{k}={v[-1]:.2f}s" for k, v in times.items()), flush=True)
    return times


def profile(data, rule: str, batches: int, top: int) -> str:
    idx = batch_order(data.train_x.shape[0], batches + 10, seed=1)
    model, r = build_model(), make_rule(rule, {"engine": "generic"})
    train(model, r, data.train_x, data.train_y, idx[:10])
    prof = cProfile.Profile()
    prof.enable()
    train(model, r, data.train_x, data.train_y, idx[10:])
    prof.disable()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return s.getvalue()


def environment() -> str:
    aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, CPU affinity {aff}, Python {platform.python_version()}, "
            f"{platform.machine()}")


def write_results(times: dict[str, list[float]], agree: dict, args, cmd: str, elapsed: float) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    bp = med["backprop"]
    lines = ["| rule | fused s/epoch | generic s/epoch | generic/fused | fused/BP | generic/BP | meets ≤ 1.2 |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    for r in RULES:
        f, g = med[f"{r} fused"], med[f"{r} generic"]
        # the ratio's spread: generic/fused per repeat (same repeat, adjacent in time)
        per_rep = [gg / ff for gg, ff in zip(times[f"{r} generic"], times[f"{r} fused"])]
        rows.append((r, f, g, g / f, f / bp, g / bp, min(per_rep), max(per_rep)))
        lines.append(f"| {r} | {f:.2f} | {g:.2f} | **{g / f:.2f}** | {f / bp:.2f} | {g / bp:.2f} | "
                     f"{'yes' if g / f <= 1.2 else 'no'} |")
    bpa = med["backprop autograd (nn.Sequential)"]
    lines.append(f"| backprop (fused on MLP; \"generic\" = autograd on nn.Sequential, `fused=False`) | {bp:.2f} | "
                 f"{bpa:.2f} | **{bpa / bp:.2f}** | 1.00 | {bpa / bp:.2f} | {'yes' if bpa / bp <= 1.2 else 'no'} |")
    its = ["| rule | engine | mean solver iterations / mini-batch (timed runs) | ms per mini-batch per iteration |",
           "|---|---|---|---|"]
    for r in RULES:
        for eng, lab in (("auto", "fused"), ("generic", "generic")):
            v = ITERATIONS.get(f"{r} {eng}", [])
            m = statistics.mean(v) if v else float("nan")
            its.append(f"| {r} | {lab} | {m:.1f} | {1000 * med[f'{r} {lab}'] / (1200 * m):.2f} |")
    spread = ["| rule | generic/fused per repeat (min – max) | all generic/fused per repeat |", "|---|---|---|"]
    for r, *_, lo, hi in rows:
        per_rep = [gg / ff for gg, ff in zip(times[f"{r} generic"], times[f"{r} fused"])]
        spread.append(f"| {r} | {lo:.2f} – {hi:.2f} | {', '.join(f'{v:.2f}' for v in per_rep)} |")
    raw = ["| variant | s/epoch per repeat | median |", "|---|---|---|"]
    for k, v in times.items():
        raw.append(f"| {k} | {', '.join(f'{t:.2f}' for t in v)} | {med[k]:.2f} |")
    agr = ["| rule | 1 − cos at init (all / worst tensor) | rel. error at init | 1 − cos after training "
           "(all / worst tensor) | rel. error after training | test acc fused | test acc generic |",
           "|---|---|---|---|---|---|---|"]
    for r, a in agree.items():
        agr.append(f"| {r} | {1 - a['cos_init']:.1e} / {1 - a['cos_init_min_layer']:.1e} | {a['rel_err_init']:.1e} | "
                   f"{1 - a['cos_trained']:.1e} / {1 - a['cos_trained_min_layer']:.1e} | {a['rel_err_trained']:.1e} | "
                   f"{a['acc_fused']:.4f} | {a['acc_generic']:.4f} |")
    scale = 60000 / BATCH / args.batches
    warn_text = ", ".join(f"{k}: {v}" for k, v in sorted(WARNINGS.items())) or "none"
    text = f"""# Generic layered engine versus fused dense engine on an MLP

Command:

```
{cmd}
```

MNIST, `MLP("{ARCH}", "{ACT}", seed={SEED})`, batch {BATCH}, `torch.optim.SGD(lr={LR})`, default rule
options except `engine` (`auto` = fused dense path on an MLP, `generic` = the layered engine).
Loop per mini-batch: `opt.zero_grad(); rule.backward(model, x, labels); opt.step()`.
Each timed run starts from the seed's initial weights, trains {args.warmup} untimed warm-up mini-batches,
then times {args.batches} mini-batches (= {args.batches * BATCH} images, 1/{scale:g} of an epoch), scaled ×{scale:g}
to s/epoch (1200 mini-batches). All variants run in one process, round-robin within each repeat (direction
alternating between repeats); the table shows the median over {args.repeats} repeats. {environment()}.
Total wall time of the benchmark run: {elapsed / 60:.1f} min.

Target set by the project: generic/fused ≤ 1.2 on the MLP.

## Epoch time (median)

{chr(10).join(lines)}

## Spread of generic/fused

{chr(10).join(spread)}

## Solver iterations

Mean over all timed mini-batches (pc: its fixed inference steps; eqprop: free-phase plus nudged-phase
iterations; contrastive: the one stacked free+clamped solve). The last column is the time per mini-batch
divided by the iterations (includes the per-batch set-up, so it is only indicative of per-iteration cost).

{chr(10).join(its)}

## Agreement of the two engines (float32)

Cosine between the two engines' flattened weight gradients (all tensors together, and the worst single
tensor), computed in float64 from the float32 gradients; the target is cos > 0.999, i.e. 1 − cos < 1e-3.
Gradients on one fixed batch of {BATCH} test images, at initialisation and at the weights after the fused
engine's short training; test accuracy (10000 test images) after 1 epoch on the first {args.acc_train}
training images (batch {BATCH}, same batch order for both engines).

{chr(10).join(agr)}

## Raw timings (s/epoch, scaled)

{chr(10).join(raw)}

## Notes

* Solver warnings (tolerance missed) over the whole run, per rule and engine: {warn_text}.
* generic/fused is the median generic epoch over the median fused epoch; the per-repeat ratios above pair
  runs that were adjacent in time and show the noise.
* fused/BP and generic/BP are relative to the fused back-propagation (`make_rule("backprop")` on the MLP).
* The `backprop autograd` row is `BackProp(fused=False)` on an `nn.Sequential` with the same layers and
  `Clamp` units (optional comparison: autograd/fused for back-propagation).
* The shared machine switches between a faster and a slower state (whole repeats, or part of one, about
  1.5× faster, visible in the raw timings); a generic/fused pair that straddles a switch gives an outlying
  per-repeat ratio, which the medians ignore.
* Profile of a generic engine: `... benchmarks/bench_engine.py --profile RULE --batches 300` (cProfile,
  prints the top functions by own and cumulative time).
* Rules whose solver stops at a tolerance (contrastive, eqprop, lifted-j0 with `block-pg`) do work that
  depends on the weights; both engines follow the same trajectory (gradients agree), so the comparison
  is like for like.
"""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{NAME}.md").write_text(text)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r[0] for r in rows]
    xs = range(len(names))
    w = 0.38
    ax1.bar([i - w / 2 for i in xs], [r[1] for r in rows], w, label="fused (engine=auto)")
    ax1.bar([i + w / 2 for i in xs], [r[2] for r in rows], w, label="generic")
    ax1.axhline(bp, color="k", lw=0.8, ls="--", label=f"backprop ({bp:.2f} s)")
    ax1.set_xticks(list(xs), names)
    ax1.set_ylabel("s / epoch (median)")
    ax1.set_title("Epoch time, MNIST 784-64-64-64-10, batch 50, 1 thread")
    ax1.legend(fontsize=8)
    ax2.bar(list(xs), [r[3] for r in rows], 0.6, color="tab:orange",
            yerr=[[r[3] - r[6] for r in rows], [r[7] - r[3] for r in rows]], capsize=4)
    ax2.axhline(1.2, color="r", lw=1, ls="--", label="target 1.2")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_xticks(list(xs), names)
    ax2.set_ylabel("generic / fused (median; bars: per-repeat range)")
    ax2.set_title("Generic engine overhead")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=110)
    plt.close(fig)
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=300, help="timed mini-batches per run (scaled to an epoch)")
    p.add_argument("--warmup", type=int, default=10, help="untimed mini-batches before timing")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--acc-train", type=int, default=10000, help="training images for the accuracy check")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", default=None, metavar="RULE", help="profile the generic engine of RULE and exit")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset("mnist")
    if args.profile:
        print(profile(data, args.profile, args.batches, args.top))
        return 0
    t0 = time.perf_counter()
    agree = agreement(data, args.acc_train)
    times = timing(data, args.batches, args.warmup, args.repeats)
    cmd = ("OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_engine.py "
           + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    print(write_results(times, agree, args, cmd, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
