"""Why does batch block-ADMM (Algorithm 1) lag BP+Adam at equal epochs? One variant per call.

Same setting as ``bench_admm.py`` (MNIST, first 10k training / 5k test images, MLP 784-256-256-10
ReLU split into 3 blocks at the pre-activations, batch 128, Adam lr 1e-3, seed 0, same initial
weights). Each call trains one variant (``--set key=value`` overrides of :class:`ADMMConfig`, or
``--bp adam|sgd`` for back-propagation) and appends a JSON line with the test accuracy after every
epoch, the final relative residuals and the median training seconds per epoch to
``results/bench_admm_investigation.jsonl``; ``--report`` turns that file into
``results/bench_admm_investigation_runs.md``. Run one process at a time (2 shared cores)::

    python benchmarks/investigations/bench_admm_investigation.py --name base --epochs 5
    python benchmarks/investigations/bench_admm_investigation.py --name zs5 --set z_steps=5
    python benchmarks/investigations/bench_admm_investigation.py --report
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.data import load_dataset

RESULTS = Path(__file__).resolve().parent.parent / "results"   # benchmarks/results
LOG = RESULTS / "bench_admm_investigation.jsonl"


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text in ("true", "false"):
        return text == "true"
    if "," in text:
        return [float(v) for v in text.split(",")]
    return text


def accuracy(net, x, y) -> float:
    net.eval()
    with torch.no_grad():
        acc = int((net(x).argmax(1) == y).sum())
    net.train()
    return acc / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name")
    ap.add_argument("--set", nargs="*", default=[], help="ADMMConfig overrides key=value (trainer attrs: fused=...)")
    ap.add_argument("--bp", choices=["adam", "sgd"], help="back-propagation baseline instead of block-ADMM")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--limit-test", type=int, default=5000)
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        return report()
    torch.set_num_threads(1)
    ds = load_dataset(args.dataset)
    X = ds.train_x[:args.limit_train].reshape(-1, 1, 28, 28)
    Y = ds.train_y[:args.limit_train]
    Xt, Yt = ds.test_x[:args.limit_test].reshape(-1, 1, 28, 28), ds.test_y[:args.limit_test]
    net = mlp("784-256-256-10", seed=args.seed)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    accs, times, extra = [], [], {}
    if args.bp:
        opt = torch.optim.Adam(net.parameters(), lr=1e-3) if args.bp == "adam" else \
            torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(args.seed)
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            perm = torch.randperm(len(X), generator=g)
            for a in range(0, len(X), 128):
                idx = perm[a:a + 128]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(X.index_select(0, idx)), Y.index_select(0, idx)).backward()
                opt.step()
            times.append(time.perf_counter() - t0)
            accs.append(accuracy(net, Xt, Yt))
    else:
        trainer_attrs = {k: _value(v) for k, v in overrides.items() if k not in ADMMConfig.__dataclass_fields__}
        cfg = ADMMConfig(**{"batch_size": 128, "lr": 1e-3, "beta": 1.0, "zeta": 0.5, "seed": args.seed,
                            **{k: _value(v) for k, v in overrides.items() if k in ADMMConfig.__dataclass_fields__}})
        tr = BlockADMM(split_sequential(net), cfg)
        for k, v in trainer_attrs.items():
            if not hasattr(tr, k):
                raise SystemExit(f"unknown option {k}")
            setattr(tr, k, v)
        tr.init_state(X, Y)
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            m = tr.epoch()
            times.append(time.perf_counter() - t0)
            accs.append(accuracy(net, Xt, Yt))
        extra = {k: v for k, v in m.items() if k.startswith(("rel_residual", "theta_seconds", "z_dual_seconds"))}
    rec = {"name": args.name or (f"bp-{args.bp}" if args.bp else "admm"), "set": overrides, "bp": args.bp,
           "dataset": args.dataset, "n_train": len(X), "epochs": args.epochs, "accs": accs,
           "median_epoch_s": statistics.median(times), **extra}
    print(json.dumps(rec), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def report():
    recs = [json.loads(s) for s in LOG.read_text().splitlines() if s.strip()]
    lines = ["# Batch block-ADMM investigation: every run (bench_admm_investigation.py)", "",
             "MNIST (first 10k train / 5k test unless noted), MLP 784-256-256-10 ReLU, 3 blocks, batch 128, "
             "Adam lr 1e-3, seed 0. Overrides are ADMMConfig fields on top of β = 1, ζ = 0.5, 1 z-step, "
             "1 primal step. Seconds per epoch are medians on a shared, loaded 2-core machine (compare only "
             "runs made close in time).", "",
             "| run | overrides | epochs | test acc per epoch | final | s/epoch | rel. residuals (last) |",
             "|---|---|---|---|---|---|---|"]
    for r in recs:
        ov = "BP " + r["bp"] if r["bp"] else (", ".join(f"{k}={v}" for k, v in r["set"].items()) or "(defaults)")
        res = ", ".join(f"{r[k]:.3f}" for k in sorted(r) if k.startswith("rel_residual"))
        lines.append(f"| {r['name']} | {ov} | {r['epochs']} | {' '.join(f'{a:.3f}' for a in r['accs'])} | "
                     f"{r['accs'][-1]:.4f} | {r['median_epoch_s']:.2f} | {res} |")
    (RESULTS / "bench_admm_investigation_runs.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
