"""Does block-ADMM train a deep sigmoid/tanh network where back-propagation stalls?

The paper claims that because back-propagation stops at every decoupling variable, block-ADMM
"can readily mitigate the vanishing gradient problem". We test it on MLPs with 12 hidden layers of
sigmoid (and tanh) units on MNIST: back-propagation with SGD and Adam vs block-ADMM with one block
per layer, same epochs, same initial weights. We also report, at initialisation, the ratio of the
first to the last layer's back-propagated weight-gradient norm (how much the gradient vanishes).
Writes ``benchmarks/results/bench_vanishing.md``.

Run::

    python benchmarks/bench_vanishing.py
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.blocks import mlp, split_sequential
from inferlearn.data import load_dataset
from inferlearn.errors import DivergenceError

RESULTS = Path(__file__).parent / "results"


def acc(net, x, y):
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def grad_ratio(net, X, Y):
    net.zero_grad()
    F.cross_entropy(net(X[:512]), Y[:512]).backward()
    lin = [m for m in net if isinstance(m, torch.nn.Linear)]
    r = float(lin[0].weight.grad.norm() / lin[-1].weight.grad.norm())
    net.zero_grad()
    return r


def bp(net, X, Y, epochs, name, lr, seed):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9) if name == "sgd" else torch.optim.Adam(net.parameters(), lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(X), generator=g)
        for a in range(0, len(X), 128):
            idx = perm[a:a + 128]
            opt.zero_grad()
            F.cross_entropy(net(X[idx]), Y[idx]).backward()
            opt.step()


def admm(net, X, Y, epochs, seed, **kw):
    blocks = split_sequential(net)
    if kw.get("z_steps") == "T-1":
        kw["z_steps"] = len(blocks) - 1
    tr = BlockADMM(blocks, ADMMConfig(batch_size=128, lr=1e-3, beta=1.0, seed=seed, **kw))
    if tr.cfg.mode == "batch":
        tr.init_state(X, Y)
    for _ in range(epochs):
        m = tr.epoch() if tr.cfg.mode == "batch" else tr.epoch(X, Y)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit-train", type=int, default=5000)
    ap.add_argument("--limit-test", type=int, default=2000)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--width", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("mnist")
    X, Y = ds.train_x[:args.limit_train], ds.train_y[:args.limit_train]
    Xt, Yt = ds.test_x[:args.limit_test], ds.test_y[:args.limit_test]
    arch = "-".join(["784"] + [str(args.width)] * args.depth + ["10"])
    rows = []
    for act in ("sigmoid", "tanh"):
        base = mlp(arch, act=act, seed=0)
        ratio = grad_ratio(copy.deepcopy(base), X, Y)
        for name, fn in [("BP SGD (lr 0.05, m 0.9)", lambda n: bp(n, X, Y, args.epochs, "sgd", 0.05, 0)),
                         ("BP Adam (lr 1e-3)", lambda n: bp(n, X, Y, args.epochs, "adam", 1e-3, 0)),
                         ("block-ADMM batch, ζ=0.5", lambda n: admm(n, X, Y, args.epochs, 0, zeta=0.5)),
                         ("block-ADMM batch, ζ=0.5, 5 z-steps", lambda n: admm(n, X, Y, args.epochs, 0, zeta=0.5,
                                                                               z_steps=5)),
                         ("block-ADMM online, ζ=0.1, T−1 z-steps", lambda n: admm(n, X, Y, args.epochs, 0, mode="online",
                                                                                 zeta=0.1, z_steps="T-1"))]:
            net = copy.deepcopy(base)
            t0 = time.perf_counter()
            try:
                fn(net)
                a = acc(net, Xt, Yt)
            except DivergenceError:
                a = float("nan")  # reported as "diverged"
            dt = time.perf_counter() - t0
            rows.append((act, name, a, ratio, dt))
            print(rows[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["# Vanishing gradients: deep sigmoid/tanh MLP (bench_vanishing.py)", "",
             f"Command: `python benchmarks/bench_vanishing.py --epochs {args.epochs} "
             f"--limit-train {args.limit_train} --limit-test {args.limit_test} --depth {args.depth} --width {args.width}`", "",
             f"MLP {arch} ({args.depth} hidden layers), PyTorch default init, first {args.limit_train} MNIST training "
             f"images, first {args.limit_test} test images, {args.epochs} epochs, batch 128, cross-entropy. "
             "Block-ADMM: one block per layer (T = depth + 1, decoupling variables at the pre-activations), Adam lr 1e-3 per block, β (online ρ) = 1. "
             "`‖∇W₁‖/‖∇W_L‖` is the back-propagated gradient-norm ratio first/last layer at initialisation.", "",
             "| units | method | test acc | ‖∇W₁‖/‖∇W_L‖ at init | train time (s) |", "|---|---|---|---|---|"]
    for act, name, a, r, dt in rows:
        lines.append(f"| {act} | {name} | {'diverged (NaN)' if a != a else f'{a:.4f}'} | {r:.1e} | {dt:.1f} |")
    (RESULTS / "bench_vanishing.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
