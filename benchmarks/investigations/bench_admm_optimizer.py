"""Time of a batch block-ADMM epoch: one optimiser per block (as first written) vs one shared optimiser.

MNIST (first 10k training images), MLP 784-256-256-10 ReLU in 3 blocks, batch 128, Adam lr 1e-3,
β = 1, ζ = 0.5. Variants, all from the same initial weights, one epoch each in turn per round
(medians over rounds, so that the drifting load of a shared machine hits all alike):

- ``per-block Adam``: one ``torch.optim.Adam`` per block (single-tensor kernels, the CPU default);
- ``one Adam``: the trainer's shared optimiser without fused kernels (bit-identical updates, tested);
- ``one fused Adam``: the default (``fused_optimizer=True``; same update up to round-off, tested);
- BP SGD (lr 0.05, momentum 0.9) and BP Adam on the whole network, for the ratios.

Writes ``results/bench_admm_optimizer.md``. Run::

    python benchmarks/investigations/bench_admm_optimizer.py --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.data import load_dataset

RESULTS = Path(__file__).resolve().parent.parent / "results"   # benchmarks/results


class PerBlock:
    """One optimiser per block behind the trainer's ``zero_grad``/``step`` interface."""

    def __init__(self, blocks):
        self.opts = [torch.optim.Adam(b.parameters(), lr=1e-3) for b in blocks]

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=10000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("mnist")
    X = ds.train_x[:args.limit_train].reshape(-1, 1, 28, 28)
    Y = ds.train_y[:args.limit_train]

    def admm(kind):
        tr = BlockADMM(split_sequential(mlp("784-256-256-10", seed=0)),
                       ADMMConfig(batch_size=128, lr=1e-3, beta=1.0, zeta=0.5, fused_optimizer=kind == "fused"))
        if kind == "per-block":
            tr.optimizer = PerBlock(tr.blocks)
        tr.init_state(X, Y)
        return tr

    def bp(name):
        net = mlp("784-256-256-10", seed=0)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) if name == "sgd" else \
            torch.optim.Adam(net.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)

        def epoch():
            perm = torch.randperm(len(X), generator=g)
            for a in range(0, len(X), 128):
                idx = perm[a:a + 128]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(X.index_select(0, idx)), Y.index_select(0, idx)).backward()
                opt.step()
        return {"epoch": epoch}

    runners = {"BP SGD (lr 0.05, m 0.9)": bp("sgd"), "BP Adam (lr 1e-3)": bp("adam"),
               "block-ADMM batch, per-block Adam": admm("per-block"), "block-ADMM batch, one Adam": admm("one"),
               "block-ADMM batch, one fused Adam (default)": admm("fused")}
    times = {m: [] for m in runners}
    theta = {m: [] for m in runners}
    for _ in range(args.rounds):
        for m, r in runners.items():
            t0 = time.perf_counter()
            out = r["epoch"]() if isinstance(r, dict) else r.epoch()
            times[m].append(time.perf_counter() - t0)
            if out:
                theta[m].append(out["theta_seconds"])
    sgd = statistics.median(times["BP SGD (lr 0.05, m 0.9)"])
    lines = ["# Batch block-ADMM epoch time: per-block vs shared optimiser (bench_admm_optimizer.py)", "",
             f"Command: `python benchmarks/investigations/bench_admm_optimizer.py --rounds {args.rounds} "
             f"--limit-train {args.limit_train}`", "",
             "MNIST, MLP 784-256-256-10 in 3 blocks, batch 128, one thread on a shared 2-core machine; one epoch "
             f"of each variant in turn, {args.rounds} rounds, medians.", "",
             "| method | s / epoch | ratio to BP SGD | Θ pass s | Z sweep + dual s |", "|---|---|---|---|---|"]
    for m, v in times.items():
        t = statistics.median(v)
        th = f"{statistics.median(theta[m]):.3f}" if theta[m] else "–"
        zd = f"{t - statistics.median(theta[m]):.3f}" if theta[m] else "–"
        lines.append(f"| {m} | {t:.3f} | {t / sgd:.2f}× | {th} | {zd} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_admm_optimizer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
