"""Block-ADMM (batch and online) vs back-propagation with SGD and Adam, same epochs.

For MNIST and Fashion-MNIST, an MLP and a small conv net, each method starts from the same
initial weights and sees the same number of epochs. Reports final test accuracy, median time per
epoch (training only, evaluation excluded) and its ratio to SGD back-propagation, and the memory of
the per-sample state (Z and U). Writes ``benchmarks/results/bench_admm.md`` and ``.png``.

Run (what the committed results used; 2 shared CPU cores, hence the subsets)::

    python benchmarks/bench_admm.py

Options select a subset of methods (``--methods``, keys below), the paper's literal formulation
(``batch-paper``: a ``Z_T`` on the output; ``batch-paper-prop``: plus Proposition 1's schedule, i.e. growing
primal passes and the adaptive penalty), other data (``--datasets cifar10-gray --allow-unverified``;
``--limit-test 0`` = the whole test split, needed where the test split is sorted by class) and another
results file (``--tag NAME`` writes ``bench_admm_NAME.md`` / ``.png``)::

    python benchmarks/bench_admm.py --methods adam,batch,batch-paper,batch-paper-prop,batch-prop --timing-rounds 0 --tag paper
    python benchmarks/bench_admm.py --datasets cifar10-gray --allow-unverified --limit-train 10000 \
        --limit-train-conv 10000 --limit-test 0 --methods sgd,adam,batch,online --timing-rounds 0 --tag cifar10
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


# --methods key -> display name (the names are the rows of the results tables)
METHODS = {"sgd": "BP SGD (lr 0.05, m 0.9)", "adam": "BP Adam (lr 1e-3)", "batch": "block-ADMM batch",
           "online": "block-ADMM online", "online-shift": "block-ADMM online + shifts ±2",
           "batch-paper": "block-ADMM batch, paper form (Z_T)",
           "batch-paper-prop": "block-ADMM batch, paper form + Prop. 1 schedule",
           "batch-prop": "block-ADMM batch + Prop. 1 schedule (no Z_T)"}


PAPER_NOTE = ("Paper form: a decoupling variable Z_T on the output with the loss J(Z_T, Y), solved exactly in the "
              "reverse Z sweep (which starts at Z_T), β_T = 1; + Prop. 1 schedule: p_k = ⌈0.9^(−2k)⌉ primal passes in "
              "epoch k = 0, 1, … and the adaptive penalty (η_k = 0.9^k, β ← 2β while the residual exceeds η_k; the "
              "same schedule without Z_T separates the two changes). ")


def methods(X, Y, T, bs, seed, image_shape=(1, 28, 28), keys=tuple(METHODS)):
    cfg = dict(batch_size=bs, lr=1e-3, beta=1.0, seed=seed)
    prop = dict(zeta=0.5, primal_schedule="proposition", adaptive=True, eta0=1.0, eta_decay=0.9, penalty_growth=2.0, **cfg)
    make = {
        "sgd": lambda net: BP(net, X, Y, "sgd", 0.05, bs, seed),
        "adam": lambda net: BP(net, X, Y, "adam", 1e-3, bs, seed),
        "batch": lambda net: ADMM(net, X, Y, ADMMConfig(zeta=0.5, **cfg)),
        "online": lambda net: ADMM(net, X, Y, ADMMConfig(mode="online", zeta=0.1, z_steps=T - 1, **cfg)),
        "online-shift": lambda net: ADMM(net, X, Y, ADMMConfig(
            mode="online", zeta=0.1, z_steps=T - 1, **cfg), transform=random_shift(2, image_shape)),
        "batch-paper": lambda net: ADMM(net, X, Y, ADMMConfig(zeta=0.5, formulation="paper", **cfg)),
        # Proposition 1's conditions: primal passes p_k = ⌈d^{-2k}⌉ and Shi et al.'s penalty rule, η_k = d^k
        "batch-paper-prop": lambda net: ADMM(net, X, Y, ADMMConfig(formulation="paper", **prop)),
        "batch-prop": lambda net: ADMM(net, X, Y, ADMMConfig(**prop)),
    }
    return {METHODS[k]: make[k] for k in keys}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--limit-train-conv", type=int, default=5000)
    ap.add_argument("--limit-test", type=int, default=5000)
    ap.add_argument("--timing-rounds", type=int, default=3)
    ap.add_argument("--datasets", default="mnist,fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default="sgd,adam,batch,online,online-shift",
                    help=f"comma-separated method keys: {', '.join(METHODS)}")
    ap.add_argument("--nets", default="mlp,conv", help="comma-separated: mlp, conv")
    ap.add_argument("--allow-unverified", action="store_true", help="read data whose checksums differ (with a warning)")
    ap.add_argument("--tag", default=None, help="write results/bench_admm_TAG.md and .png instead of bench_admm.*")
    ap.add_argument("--timing-only", action="store_true",
                    help="skip the accuracy runs; write results/bench_admm_timing.md (rerun on a quieter machine)")
    return ap


def ap_defaults() -> dict:
    return vars(parser().parse_args([]))


def main():
    ap = parser()
    args = ap.parse_args()
    keys = [k for k in args.methods.split(",") if k]
    bad = [k for k in keys if k not in METHODS]
    if bad or not keys:
        ap.error(f"unknown method {', '.join(bad) or '(none given)'}; choose from {', '.join(METHODS)}")
    if args.tag is not None and not args.tag.replace("-", "").replace("_", "").isalnum():
        ap.error(f"invalid --tag {args.tag!r}: use letters, digits, - and _")
    if args.timing_only and args.tag is not None:
        ap.error("--timing-only writes bench_admm_timing.md; drop --tag")
    nets = [a for a in args.nets.split(",") if a]
    if not nets or any(a not in ("mlp", "conv") for a in nets):
        ap.error(f"invalid --nets {args.nets!r}: choose from mlp, conv")
    if args.timing_rounds > 0 and not {"sgd", "batch"} <= set(keys):
        ap.error("timing reports ratios to BP SGD and block-ADMM batch's split: include sgd,batch in --methods "
                 "or give --timing-rounds 0")
    torch.set_num_threads(1)
    bs = 128
    rows, curves, timing = [], {}, {}
    for i, dname in enumerate(args.datasets.split(",")[:1] if args.timing_only else args.datasets.split(",")):
        ds = load_dataset(dname, allow_unverified=args.allow_unverified)
        shape = tuple(ds.image_shape)
        C, H, W = shape
        for arch in nets:
            n = args.limit_train if arch == "mlp" else args.limit_train_conv
            X = ds.train_x[:n].reshape(-1, *shape)
            Y = ds.train_y[:n]
            nt = args.limit_test or len(ds.test_x)
            Xt, Yt = ds.test_x[:nt].reshape(-1, *shape), ds.test_y[:nt]
            base = (mlp(f"{C * H * W}-256-256-{ds.n_classes}", seed=args.seed) if arch == "mlp" else
                    conv_net((16, 32), ds.n_classes, in_channels=C, image_size=H, seed=args.seed))
            T = len(split_sequential(copy.deepcopy(base)))
            meths = methods(X, Y, T, bs, args.seed, shape, keys)
            for mname, make in ({} if args.timing_only else meths).items():
                net = copy.deepcopy(base)
                runner = make(net)
                accs, seconds, passes = [], 0.0, 0
                for _ in range(args.epochs):
                    t0 = time.perf_counter()
                    runner.epoch()
                    seconds += time.perf_counter() - t0
                    passes += getattr(runner, "last", {}).get("primal_steps", 1)
                    accs.append(accuracy(net, Xt, Yt))
                rows.append([dname, arch, n, mname, accs[-1], runner.state_bytes, passes, seconds])
                curves[(dname, arch, mname)] = accs
                print(f"{dname:14s} {arch:4s} {mname:30s} acc {accs[-1]:.4f} state {runner.state_bytes / 2**20:.1f} MiB",
                      flush=True)
            if i == 0 and args.timing_rounds > 0:
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
    extra = "".join(f" --{k.replace('_', '-')} {getattr(args, k)}" for k in ("datasets", "nets", "methods", "seed", "tag")
                    if getattr(args, k) != ap_defaults()[k])
    test = (f"the first {args.limit_test} test images" if args.limit_test else "the whole test split")
    lines = ["# Block-ADMM vs back-propagation (bench_admm.py)", "",
             f"Command: `python benchmarks/bench_admm.py --epochs {args.epochs} "
             f"--limit-train {args.limit_train} --limit-train-conv {args.limit_train_conv} --limit-test {args.limit_test} "
             f"--timing-rounds {args.timing_rounds}{extra}{' --allow-unverified' if args.allow_unverified else ''}`",
             "", f"Reduced setting (2 shared CPU cores, one thread): the first {args.limit_train} (MLP) / "
             f"{args.limit_train_conv} (conv) training images, {test}, "
             f"{args.epochs} epochs, batch 128, seed {args.seed}, all methods from the same initial weights. "
             "MLP D-256-256-10 ReLU (D = pixels) and conv net Conv16-Pool-ReLU-Conv32-Pool-ReLU-Linear, each split into 3 "
             "blocks at the pre-activations (`default_split_points`). Block-ADMM: Adam lr 1e-3 per block, β = 1, ζ = 0.5, "
             "1 primal step, 1 z-step; online: ρ = 1, ζ = 0.1, z-steps = T−1 = 2, scalar duals. "
             + (PAPER_NOTE if any(k in args.methods.split(",") for k in ("batch-paper", "batch-paper-prop", "batch-prop"))
                else "") +
             "State = memory of Z and U (batch mode; the online mode keeps only T−1 scalars). Primal passes = "
             "Θ passes over the data in all epochs; train s = wall-clock training time (evaluation excluded; a "
             "shared machine, so ±30%).", "",
             "## Test accuracy after the same number of epochs", "",
             "| data | net | train N | method | test acc | Δ vs BP Adam (points) | Z,U state | primal passes | train s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for d, a, n, m, acc, mem, passes, sec in rows:
        delta = f"{100 * (acc - adam[(d, a)]):+.1f}" if (d, a) in adam else "—"
        lines.append(f"| {d} | {a} | {n} | {m} | {acc:.4f} | {delta} | {mem / 2**20:.1f} MiB | {passes} | {sec:.0f} |")
    if timing:
        lines += ["", f"## Time per epoch ({first}, training only)", "",
                  f"Each method's epochs were run in turn ({args.timing_rounds} rounds) and the median taken, so that "
                  "the drifting load of the shared machine hits all methods alike; ratios are to BP SGD on the same network.",
                  "", "| net | method | s / epoch | ratio to BP SGD |", "|---|---|---|---|"]
    for arch, t in timing.items():
        sgd = t["BP SGD (lr 0.05, m 0.9)"]
        for m, v in t.items():
            if m != "theta share":
                lines.append(f"| {arch} | {m} | {v:.3f} | {v / sgd:.2f}× |")
    name = "bench_admm" if args.tag is None else f"bench_admm_{args.tag}"
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
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
    fig.savefig(RESULTS / f"{name}.png", dpi=100)


if __name__ == "__main__":
    main()
