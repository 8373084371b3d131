"""Block-ADMM (batch and online) vs back-propagation with SGD and Adam, same epochs.

For MNIST and Fashion-MNIST, an MLP and a small conv net, each method starts from the same
initial weights and sees the same number of epochs. Reports final test accuracy, median time per
epoch (training only, evaluation excluded) and its ratio to SGD back-propagation, and the memory of
the per-sample state (Z and U). Writes ``benchmarks/results/bench_admm.md`` and ``.png``.

Run (what the committed results used; 2 shared CPU cores, hence the subsets)::

    INFERLEARN_DATA=/work/shared/data python benchmarks/bench_admm.py
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

from inferlearn.admm import ADMMConfig, BlockADMM, random_shift  # noqa: E402
from inferlearn.blocks import conv_net, mlp, split_sequential  # noqa: E402
from inferlearn.data import load_dataset  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def accuracy(net, x, y) -> float:
    net.eval()
    with torch.no_grad():
        acc = sum(int((net(x[a:a + 2048]).argmax(1) == y[a:a + 2048]).sum()) for a in range(0, len(x), 2048))
    net.train()
    return acc / len(x)


def run_bp(net, X, Y, Xt, Yt, epochs, opt_name, lr, bs, seed):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9) if opt_name == "sgd" else \
        torch.optim.Adam(net.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    times, accs = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(len(X), generator=g)
        for a in range(0, len(X), bs):
            idx = perm[a:a + bs]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(X.index_select(0, idx)), Y.index_select(0, idx)).backward()
            opt.step()
        times.append(time.perf_counter() - t0)
        accs.append(accuracy(net, Xt, Yt))
    return times, accs, 0


def run_admm(net, X, Y, Xt, Yt, epochs, cfg, transform=None):
    tr = BlockADMM(split_sequential(net), cfg)
    if cfg.mode == "batch":
        tr.init_state(X, Y)
    times, accs = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        tr.epoch() if cfg.mode == "batch" else tr.epoch(X, Y, transform)
        times.append(time.perf_counter() - t0)
        accs.append(accuracy(net, Xt, Yt))
    return times, accs, tr.memory_bytes()["state_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--limit-train-conv", type=int, default=5000)
    ap.add_argument("--limit-test", type=int, default=5000)
    ap.add_argument("--datasets", default="mnist,fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bs = 128
    rows, curves = [], {}
    for dname in args.datasets.split(","):
        ds = load_dataset(dname)
        for arch in ("mlp", "conv"):
            n = args.limit_train if arch == "mlp" else args.limit_train_conv
            X = ds.train_x[:n].reshape(-1, 1, 28, 28)
            Y = ds.train_y[:n]
            Xt, Yt = ds.test_x[:args.limit_test].reshape(-1, 1, 28, 28), ds.test_y[:args.limit_test]
            base = mlp("784-256-256-10", seed=args.seed) if arch == "mlp" else conv_net((16, 32), seed=args.seed)
            T = len(split_sequential(copy.deepcopy(base)))
            methods = {
                "BP SGD (lr 0.05, m 0.9)": lambda net: run_bp(net, X, Y, Xt, Yt, args.epochs, "sgd", 0.05, bs, args.seed),
                "BP Adam (lr 1e-3)": lambda net: run_bp(net, X, Y, Xt, Yt, args.epochs, "adam", 1e-3, bs, args.seed),
                "block-ADMM batch": lambda net: run_admm(net, X, Y, Xt, Yt, args.epochs, ADMMConfig(
                    batch_size=bs, lr=1e-3, beta=1.0, zeta=0.5, seed=args.seed)),
                "block-ADMM online": lambda net: run_admm(net, X, Y, Xt, Yt, args.epochs, ADMMConfig(
                    mode="online", batch_size=bs, lr=1e-3, beta=1.0, zeta=0.1, z_steps=T - 1, seed=args.seed)),
                "block-ADMM online + shifts ±2": lambda net: run_admm(net, X, Y, Xt, Yt, args.epochs, ADMMConfig(
                    mode="online", batch_size=bs, lr=1e-3, beta=1.0, zeta=0.1, z_steps=T - 1, seed=args.seed),
                    transform=random_shift(2, (1, 28, 28))),
            }
            sgd_time = None
            for mname, fn in methods.items():
                times, accs, mem = fn(copy.deepcopy(base))
                med = statistics.median(times)
                sgd_time = sgd_time or med
                rows.append((dname, arch, n, mname, accs[-1], med, med / sgd_time, mem))
                curves[(dname, arch, mname)] = accs
                print(f"{dname:14s} {arch:4s} {mname:30s} acc {accs[-1]:.4f} epoch {med:.3f}s "
                      f"ratio {med / sgd_time:.2f} state {mem / 2**20:.1f} MiB", flush=True)
    write(rows, curves, args)


def write(rows, curves, args):
    RESULTS.mkdir(parents=True, exist_ok=True)
    adam = {(r[0], r[1]): r[4] for r in rows if r[3].startswith("BP Adam")}
    lines = ["# Block-ADMM vs back-propagation (bench_admm.py)", "",
             f"Command: `INFERLEARN_DATA=/work/shared/data python benchmarks/bench_admm.py --epochs {args.epochs} "
             f"--limit-train {args.limit_train} --limit-train-conv {args.limit_train_conv} --limit-test {args.limit_test}`",
             "", f"Reduced setting (2 shared CPU cores, one thread): the first {args.limit_train} (MLP) / "
             f"{args.limit_train_conv} (conv) training images, the first {args.limit_test} test images, "
             f"{args.epochs} epochs, batch 128, seed {args.seed}. MLP 784-256-256-10 ReLU split into 3 blocks (one per "
             "layer); conv net Conv16-ReLU-Pool-Conv32-ReLU-Pool-Linear split into 3 blocks (one per stage). "
             "Block-ADMM: Adam lr 1e-3 per block, β = 1, ζ = 0.5, 1 primal step; online: ρ = 1, ζ = 0.1, z-steps = T−1 = 2. "
             "Time per epoch is the median over epochs of the training time only; the ratio is to BP SGD on the same "
             "network. State = memory of Z and U (batch mode; online keeps only scalar duals). Timings on a shared "
             "machine are noisy (±30%).", "",
             "| data | net | train N | method | test acc | Δ vs Adam (points) | s / epoch | ratio to SGD | Z,U state |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d, a, n, m, acc, med, ratio, mem in rows:
        lines.append(f"| {d} | {a} | {n} | {m} | {acc:.4f} | {100 * (acc - adam[(d, a)]):+.1f} | {med:.3f} | "
                     f"{ratio:.2f}× | {mem / 2**20:.1f} MiB |")
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
