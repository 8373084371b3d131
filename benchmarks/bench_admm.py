"""Block-ADMM (batch and online) vs back-propagation with SGD and Adam, same epochs.

For MNIST and Fashion-MNIST, an MLP and a small conv net, each method starts from the same
initial weights and sees the same number of epochs. Reports final test accuracy, median time per
epoch (training only, evaluation excluded) and its ratio to SGD back-propagation, and the memory of
the per-sample state (Z and U). Writes ``benchmarks/results/bench_admm.md`` and ``.png``.

Run (what the committed results used; 2 shared CPU cores, hence the subsets)::

    python benchmarks/bench_admm.py
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from inferlearn.admm.trainer import ADMMConfig, BlockADMM, random_shift  # noqa: E402
from inferlearn.admm.blocks import conv_net, mlp, split_sequential  # noqa: E402
from inferlearn.data import load_dataset  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def accuracy(net, x, y) -> float:
    net.eval()
    with torch.no_grad():
        acc = sum(int((net(x[a:a + 2048]).argmax(1) == y[a:a + 2048]).sum()) for a in range(0, len(x), 2048))
    net.train()
    return acc / len(x)


class BP:
    """Back-propagation trainer with the same interface as the block-ADMM wrapper below."""

    def __init__(self, net, X, Y, opt_name, lr, bs, seed):
        self.net, self.X, self.Y, self.bs = net, X, Y, bs
        self.opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9) if opt_name == "sgd" else \
            torch.optim.Adam(net.parameters(), lr=lr)
        self.g = torch.Generator().manual_seed(seed)
        self.state_bytes = 0

    def epoch(self):
        X, Y, bs = self.X, self.Y, self.bs
        perm = torch.randperm(len(X), generator=self.g)
        for a in range(0, len(X), bs):
            idx = perm[a:a + bs]
            self.opt.zero_grad(set_to_none=True)
            F.cross_entropy(self.net(X.index_select(0, idx)), Y.index_select(0, idx)).backward()
            self.opt.step()


class ADMM:
    def __init__(self, net, X, Y, cfg, transform=None):
        self.tr = BlockADMM(split_sequential(net), cfg)
        self.X, self.Y, self.transform = X, Y, transform
        if cfg.mode == "batch":
            self.tr.init_state(X, Y)
        self.state_bytes = self.tr.memory_bytes()["state_bytes"]

    def epoch(self):
        self.last = self.tr.epoch() if self.tr.cfg.mode == "batch" else self.tr.epoch(self.X, self.Y, self.transform)


def methods(X, Y, T, bs, seed):
    cfg = dict(batch_size=bs, lr=1e-3, beta=1.0, seed=seed)
    return {
        "BP SGD (lr 0.05, m 0.9)": lambda net: BP(net, X, Y, "sgd", 0.05, bs, seed),
        "BP Adam (lr 1e-3)": lambda net: BP(net, X, Y, "adam", 1e-3, bs, seed),
        "block-ADMM batch": lambda net: ADMM(net, X, Y, ADMMConfig(zeta=0.5, **cfg)),
        "block-ADMM online": lambda net: ADMM(net, X, Y, ADMMConfig(mode="online", zeta=0.1, z_steps=T - 1, **cfg)),
        "block-ADMM online + shifts ±2": lambda net: ADMM(net, X, Y, ADMMConfig(
            mode="online", zeta=0.1, z_steps=T - 1, **cfg), transform=random_shift(2, (1, 28, 28))),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--limit-train-conv", type=int, default=5000)
    ap.add_argument("--limit-test", type=int, default=5000)
    ap.add_argument("--timing-rounds", type=int, default=3)
    ap.add_argument("--datasets", default="mnist,fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timing-only", action="store_true",
                    help="skip the accuracy runs; write results/bench_admm_timing.md (rerun on a quieter machine)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bs = 128
    rows, curves, timing = [], {}, {}
    for i, dname in enumerate(args.datasets.split(",")[:1] if args.timing_only else args.datasets.split(",")):
        ds = load_dataset(dname)
        for arch in ("mlp", "conv"):
            n = args.limit_train if arch == "mlp" else args.limit_train_conv
            X = ds.train_x[:n].reshape(-1, 1, 28, 28)
            Y = ds.train_y[:n]
            Xt, Yt = ds.test_x[:args.limit_test].reshape(-1, 1, 28, 28), ds.test_y[:args.limit_test]
            base = mlp("784-256-256-10", seed=args.seed) if arch == "mlp" else conv_net((16, 32), seed=args.seed)
            T = len(split_sequential(copy.deepcopy(base)))
            meths = methods(X, Y, T, bs, args.seed)
            for mname, make in ({} if args.timing_only else meths).items():
                net = copy.deepcopy(base)
                runner = make(net)
                accs = []
                for _ in range(args.epochs):
                    runner.epoch()
                    accs.append(accuracy(net, Xt, Yt))
                rows.append([dname, arch, n, mname, accs[-1], runner.state_bytes])
                curves[(dname, arch, mname)] = accs
                print(f"{dname:14s} {arch:4s} {mname:30s} acc {accs[-1]:.4f} state {runner.state_bytes / 2**20:.1f} MiB",
                      flush=True)
            if i == 0:
                # Timing: one epoch of each method in turn, repeated; the median per method is robust to
                # the load of a shared machine drifting over time (all methods see the same drift).
                runners = {m: make(copy.deepcopy(base)) for m, make in meths.items()}
                times = {m: [] for m in meths}
                split = []  # block-ADMM batch: share of the epoch in the Θ pass vs the Z/dual passes
                for _ in range(args.timing_rounds):
                    for m, r in runners.items():
                        t0 = time.perf_counter()
                        r.epoch()
                        times[m].append(time.perf_counter() - t0)
                        if m == "block-ADMM batch":
                            split.append(r.last["theta_seconds"] / (r.last["theta_seconds"] + r.last["z_dual_seconds"]))
                timing[arch] = {m: statistics.median(v) for m, v in times.items()}
                timing[arch]["theta share"] = statistics.median(split)
                print(arch, timing[arch], flush=True)
    write(rows, curves, timing, args)


def write(rows, curves, timing, args):
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.timing_only:
        lines = ["# Block-ADMM vs back-propagation: time per epoch (bench_admm.py --timing-only)", "",
                 f"Command: `python benchmarks/bench_admm.py --timing-only "
                 f"--limit-train {args.limit_train} --limit-train-conv {args.limit_train_conv} "
                 f"--timing-rounds {args.timing_rounds}`", "",
                 "Same networks and settings as `bench_admm.md`; each method's epochs run in turn, "
                 f"{args.timing_rounds} rounds, median per method, ratio to BP SGD on the same network.", "",
                 "| net | train N | method | s / epoch | ratio to BP SGD |", "|---|---|---|---|---|"]
        for arch, t in timing.items():
            sgd = t["BP SGD (lr 0.05, m 0.9)"]
            n = args.limit_train if arch == "mlp" else args.limit_train_conv
            for m, v in t.items():
                if m != "theta share":
                    lines.append(f"| {arch} | {n} | {m} | {v:.3f} | {v / sgd:.2f}× |")
        lines += ["", "Where block-ADMM batch spends its epoch (median share): " + "; ".join(
            f"{arch}: {100 * t['theta share']:.0f}% in the mini-batch Θ pass (one optimiser step per block per "
            f"batch, 5 row gathers of X, Z, U), {100 - 100 * t['theta share']:.0f}% in the full-data Z sweep and dual "
            "update (forward of f_t, forward+backward of f_{t+1} per Z_t, forward for the dual)"
            for arch, t in timing.items()) + "."]
        (RESULTS / "bench_admm_timing.md").write_text("\n".join(lines) + "\n")
        return
    adam = {(r[0], r[1]): r[4] for r in rows if r[3].startswith("BP Adam")}
    first = args.datasets.split(",")[0]
    lines = ["# Block-ADMM vs back-propagation (bench_admm.py)", "",
             f"Command: `python benchmarks/bench_admm.py --epochs {args.epochs} "
             f"--limit-train {args.limit_train} --limit-train-conv {args.limit_train_conv} --limit-test {args.limit_test} "
             f"--timing-rounds {args.timing_rounds}`",
             "", f"Reduced setting (2 shared CPU cores, one thread): the first {args.limit_train} (MLP) / "
             f"{args.limit_train_conv} (conv) training images, the first {args.limit_test} test images, "
             f"{args.epochs} epochs, batch 128, seed {args.seed}, all methods from the same initial weights. "
             "MLP 784-256-256-10 ReLU and conv net Conv16-Pool-ReLU-Conv32-Pool-ReLU-Linear, each split into 3 blocks "
             "at the pre-activations (`default_split_points`). Block-ADMM: Adam lr 1e-3 per block, β = 1, ζ = 0.5, "
             "1 primal step, 1 z-step; online: ρ = 1, ζ = 0.1, z-steps = T−1 = 2, scalar duals. "
             "State = memory of Z and U (batch mode; the online mode keeps only T−1 scalars).", "",
             "## Test accuracy after the same number of epochs", "",
             "| data | net | train N | method | test acc | Δ vs BP Adam (points) | Z,U state |",
             "|---|---|---|---|---|---|---|"]
    for d, a, n, m, acc, mem in rows:
        lines.append(f"| {d} | {a} | {n} | {m} | {acc:.4f} | {100 * (acc - adam[(d, a)]):+.1f} | {mem / 2**20:.1f} MiB |")
    lines += ["", f"## Time per epoch ({first}, training only)", "",
              f"Each method's epochs were run in turn ({args.timing_rounds} rounds) and the median taken, so that "
              "the drifting load of the shared machine hits all methods alike; ratios are to BP SGD on the same network.",
              "", "| net | method | s / epoch | ratio to BP SGD |", "|---|---|---|---|"]
    for arch, t in timing.items():
        sgd = t["BP SGD (lr 0.05, m 0.9)"]
        for m, v in t.items():
            if m != "theta share":
                lines.append(f"| {arch} | {m} | {v:.3f} | {v / sgd:.2f}× |")
    (RESULTS / "bench_admm.md").write_text("\n".join(lines) + "\n")
    keys = sorted({(d, a) for d, a, _ in curves})
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, (d, a) in zip(axes[0], keys):
        for (d2, a2, m), accs in curves.items():
            if (d2, a2) == (d, a):
                ax.plot(range(1, len(accs) + 1), accs, marker="o", label=m)
        ax.set_title(f"{d} / {a}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "bench_admm.png", dpi=100)


if __name__ == "__main__":
    main()
