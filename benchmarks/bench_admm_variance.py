"""Online block-ADMM: does the scalar dual reduce the variance of the stochastic weight gradient?

The paper (seed 003, §3.2) says the online variant's scalar dual λ_t "considerably reduces the variance in
the gradient induced by re-initializing the auxiliary variables z". Test: train the online variant (MLP
784-256-256-10, 3 blocks, the settings of ``bench_admm.py``) and, at fixed weights after each of a few
epochs, compute the Θ gradient of the online objective ``J + Σ_t (λ_t h_t + (ρ/2) h_t²)`` (after the
z re-initialisation and z steps, exactly as a training step does: ``BlockADMM.online_gradient``) on many
mini-batches, once with the trained duals λ_t ("with") and once with λ_t = 0 ("without"), on the same
batches. Reported per block: the total variance ``E_b ‖g_b − ḡ‖²`` across batches, and the relative
variance ``E_b ‖g_b − ḡ‖² / ‖ḡ‖²`` (noise-to-signal; the dual also scales the gradient, so the absolute
variance alone cannot say whether the gradient got noisier). The ratio with/without is given with its
range over 5 disjoint groups of batches. Writes ``results/bench_admm_variance.md`` and ``.png``.

    python benchmarks/bench_admm_variance.py
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from inferlearn.admm.blocks import mlp, split_sequential  # noqa: E402
from inferlearn.admm import ADMMConfig, BlockADMM  # noqa: E402
from inferlearn.data import load_dataset  # noqa: E402

RESULTS = Path(__file__).parent / "results"
GROUPS = 5


def gradients(tr: BlockADMM, X, Y, batches, lam) -> list[torch.Tensor]:
    """Per block, a (n_batches, n_params) tensor of Θ gradients at the current weights with duals ``lam``."""
    saved = tr.lam
    tr.lam = list(lam)
    out = [[] for _ in tr.blocks]
    try:
        for idx in batches:
            tr.online_gradient(X[idx], Y[idx])
            for t, b in enumerate(tr.blocks):
                out[t].append(torch.cat([p.grad.reshape(-1) for p in b.parameters()]).double())
    finally:
        tr.lam = saved
        tr.optimizer.zero_grad(set_to_none=True)
    return [torch.stack(g) for g in out]


def variance(g: torch.Tensor) -> tuple[float, float]:
    """Total variance across batches (unbiased) and the same divided by the squared mean gradient."""
    mean = g.mean(0)
    v = float((g - mean).pow(2).sum(1).sum() / (len(g) - 1))
    return v, v / float(mean.pow(2).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="mnist", choices=["mnist", "fashion-mnist"])
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=3, help="online epochs; gradients measured after each")
    ap.add_argument("--batches", type=int, default=500, help="mini-batches per measurement (a multiple of 5)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.epochs < 1 or args.batches < 2 * GROUPS or args.batches % GROUPS or args.batch_size < 1:
        ap.error(f"need --epochs ≥ 1, --batches a multiple of {GROUPS} and ≥ {2 * GROUPS}, --batch-size ≥ 1")
    torch.set_num_threads(1)
    ds = load_dataset(args.data)
    X, Y = ds.train_x[:args.limit_train].reshape(-1, 1, 28, 28), ds.train_y[:args.limit_train]
    blocks = split_sequential(mlp("784-256-256-10", seed=args.seed))
    T = len(blocks)
    tr = BlockADMM(blocks, ADMMConfig(mode="online", batch_size=args.batch_size, lr=1e-3, beta=1.0, zeta=0.1,
                                      z_steps=T - 1, seed=args.seed))
    g = torch.Generator().manual_seed(args.seed + 1)
    rows = []
    for epoch in range(1, args.epochs + 1):
        tr.epoch(X, Y)
        batches = [torch.randperm(len(X), generator=g)[:args.batch_size] for _ in range(args.batches)]
        with_dual = gradients(tr, X, Y, batches, tr.lam)
        without = gradients(tr, X, Y, batches, [0.0] * (T - 1))
        for t in range(T):
            vw, rw = variance(with_dual[t])
            vo, ro = variance(without[t])
            n = args.batches // GROUPS
            grp = [variance(with_dual[t][i * n:(i + 1) * n])[1] / variance(without[t][i * n:(i + 1) * n])[1]
                   for i in range(GROUPS)]
            rows.append(dict(epoch=epoch, block=t + 1, lam=", ".join(f"{v:.3g}" for v in tr.lam), vw=vw, vo=vo,
                             rw=rw, ro=ro, lo=min(grp), hi=max(grp)))
            print(rows[-1], flush=True)
    write(rows, args)


def write(rows, args):
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["# Online block-ADMM: gradient variance with and without the scalar dual (bench_admm_variance.py)", "",
             f"Command: `python benchmarks/bench_admm_variance.py --data {args.data} --limit-train {args.limit_train} "
             f"--epochs {args.epochs} --batches {args.batches} --batch-size {args.batch_size} --seed {args.seed}`", "",
             f"MLP 784-256-256-10 ReLU in 3 blocks, online block-ADMM (Adam lr 1e-3, ρ = 1, ζ = 0.1, 2 z-steps), trained on "
             f"the first {args.limit_train} {args.data} training images. After each epoch, at fixed weights, the Θ "
             f"gradient of the online objective (z re-initialised by a forward pass and 2 z-steps, as in training) on "
             f"{args.batches} random mini-batches of {args.batch_size}, with the trained scalar duals λ_t and with λ_t = 0 "
             "(same batches). Var = E‖g − ḡ‖² across batches; rel. = Var / ‖ḡ‖². Ratio = rel. with / rel. without "
             f"(range over {GROUPS} disjoint groups of batches). Block 3 holds the loss; blocks 1–2 carry a constraint.", "",
             "| epoch | λ_1, λ_2 | block | Var with λ | Var λ = 0 | rel. with λ | rel. λ = 0 | ratio rel. (with / without) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['epoch']} | {r['lam']} | {r['block']} | {r['vw']:.3g} | {r['vo']:.3g} | {r['rw']:.3g} | "
                     f"{r['ro']:.3g} | {r['rw'] / r['ro']:.2f} ({r['lo']:.2f}–{r['hi']:.2f}) |")
    (RESULTS / "bench_admm_variance.md").write_text("\n".join(lines) + "\n")
    blocks = sorted({r["block"] for r in rows})
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for b in blocks:
        rs = [r for r in rows if r["block"] == b]
        ax.plot([r["epoch"] for r in rs], [r["rw"] / r["ro"] for r in rs], marker="o", label=f"block {b}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("epoch (weights at which gradients are sampled)")
    ax.set_ylabel("relative variance, with λ / λ = 0")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "bench_admm_variance.png", dpi=100)


if __name__ == "__main__":
    main()
