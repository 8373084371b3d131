"""Does standard lifted training (J_0) pre-train a deep network that back-propagation cannot train?

Zach & Estellers (BMVC 2019, Sec. 3): lifted networks trained with J_0 "have a strong tendency to
yield linear networks ... this also justifies to use them for pre-training, as they are less
susceptible to vanishing gradients due to their preference for linear behavior". We test it on an MLP
with many hidden layers of 64 hard-sigmoid units (``[0, 1]`` boxes) on MNIST, where back-propagation
from the library's initialisation (``N(0, 1/fan_in)``, zero biases) learns slowly: the
back-propagated gradient of the first layer is orders of magnitude below the last layer's.

Per depth, from the same initial weights and with the same total number of epochs:

* **BP from scratch**: back-propagation (quadratic loss, SGD η = 1/20, batch 50) for ``--epochs``;
* **J_0 pre-training + BP**: ``--pretrain-epochs`` of standard lifted training (γ as given, the J_0
  warm-up learning rate 0.1 η), then back-propagation (fresh SGD, η) for the remaining epochs.

Reported: test accuracy after every epoch, the active fraction of hidden units, and the
back-propagated gradient-norm ratio ‖∇W_0‖ / ‖∇W_L‖ (first to last layer) at the start of
back-propagation. The ADMM version of the vanishing-gradient claim is ``bench_vanishing.py``.

Writes ``benchmarks/results/bench_pretrain.md`` and ``.png``. Run::

    OMP_NUM_THREADS=1 python benchmarks/bench_pretrain.py --depths 12,20 --epochs 10 --pretrain-epochs 3
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from inferlearn.diagnostics import rule_gradients
from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import build, epoch_metrics, run_epoch

RESULTS = Path(__file__).parent / "results"


def grad_ratio(model, x, labels) -> float:
    """‖∇W_0‖ / ‖∇W_L‖ of back-propagation's (quadratic-loss) gradient on a batch."""
    g = rule_gradients(make_rule("backprop"), model, x, labels)
    w = [v for k, v in g.items() if k.endswith("weight")]
    return float(w[0].norm() / w[-1].norm())


def run(arch: str, act: str, epochs: int, pretrain: int, gamma: float | None, args) -> dict:
    """Train (optionally J_0 pre-training first) and return the per-epoch history and the ratio."""
    history, ratio = [], None
    common = dict(data="mnist", arch=arch, act=act, batch_size=50, seed=args.seed, limit_train=args.limit_train,
                  out="/tmp/inferlearn-bench-pretrain")
    model = None
    phases = [("lifted-j0", pretrain), ("backprop", epochs - pretrain)] if pretrain else [("backprop", epochs)]
    for rule, n in phases:
        opts = {"gamma": gamma} if rule == "lifted-j0" else {}
        lr = args.lr * 0.1 if rule == "lifted-j0" else args.lr   # J_0's warm-up rate (LiftedJ0 docstring)
        cfg = TrainConfig(rule=rule, rule_options=opts, epochs=n, lr=lr, **common)
        s = build(cfg)
        if model is not None:
            s.model.load_state_dict(model.state_dict())
        if rule == "backprop":
            ratio = grad_ratio(s.model, s.train_x[:500], s.train_y[:500])
        for e in range(1, n + 1):
            t0 = time.perf_counter()
            loss = run_epoch(s, cfg, e, progress=False)
            m = epoch_metrics(s, len(history) + 1, loss, time.perf_counter() - t0)
            m["rule"] = rule
            history.append(m)
            print(json.dumps({"arch": arch, "gamma": gamma, **{k: m[k] for k in ("epoch", "rule", "train_acc",
                              "test_acc", "active_fraction", "epoch_seconds")}}), flush=True)
        model = s.model
    return {"history": history, "ratio": ratio}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="12,20", help="comma-separated numbers of hidden layers of 64 units")
    ap.add_argument("--act", default="hard-sigmoid")
    ap.add_argument("--epochs", type=int, default=10, help="total epochs of every method")
    ap.add_argument("--pretrain-epochs", type=int, default=3)
    ap.add_argument("--gammas", default="0.125,0.5", help="J_0 feedback weights to pre-train with")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "bench_pretrain"), help="writes OUT.md and OUT.png")
    args = ap.parse_args()
    torch.set_num_threads(1)
    depths = [int(d) for d in args.depths.split(",")]
    gammas = [float(g) for g in args.gammas.split(",")]
    results = {}
    for depth in depths:
        arch = "-".join(["784"] + ["64"] * depth + ["10"])
        results[depth] = {"BP from scratch": run(arch, args.act, args.epochs, 0, None, args)}
        for g in gammas:
            results[depth][f"J_0 (γ = {g:g}) {args.pretrain_epochs} ep. + BP"] = run(
                arch, args.act, args.epochs, args.pretrain_epochs, g, args)
    write(results, args)


def write(results, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (depth, runs) in zip(axes[0], results.items()):
        for name, r in runs.items():
            ax.plot([m["epoch"] for m in r["history"]], [m["test_acc"] for m in r["history"]], marker="o",
                    markersize=3, label=name)
        ax.axvline(args.pretrain_epochs + 0.5, color="grey", lw=0.8, ls=":")
        ax.set_title(f"MNIST, {depth} hidden layers of 64 {args.act} units")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    cmd = (f"OMP_NUM_THREADS=1 python benchmarks/bench_pretrain.py --depths {args.depths} --act {args.act} "
           f"--epochs {args.epochs} --pretrain-epochs {args.pretrain_epochs} --gammas {args.gammas} --lr {args.lr} "
           f"--limit-train {args.limit_train} --seed {args.seed}")
    lines = ["# Lifted (J_0) pre-training of a deep network with vanishing gradients (bench_pretrain.py)", "",
             f"Command: `{cmd}`", "",
             f"MNIST, first {args.limit_train} training images, the whole test set; MLPs with D hidden layers of 64 "
             f"{args.act} units, weights N(0, 1/fan_in), zero biases, same initial weights for every method; "
             f"quadratic loss, SGD batch 50. BP: η = {args.lr}. J_0 pre-training: {args.pretrain_epochs} epochs of "
             f"standard lifted training at 0.1 η (its warm-up rate), then BP at η for the remaining epochs "
             f"({args.epochs} in total for every method). ‖∇W₀‖/‖∇W_L‖: back-propagated gradient norm of the "
             "first over the last weight matrix (500 training images) when back-propagation starts. "
             f"Picture: `{out.with_suffix('.png').name}` (test accuracy per epoch; dotted line: end of pre-training).", "",
             "| depth | method | test acc after pre-training | active after pre-training | ‖∇W₀‖/‖∇W_L‖ at BP start | "
             "test acc, epoch 1 of BP | final test acc | final train acc | final active |",
             "|---|---|---|---|---|---|---|---|---|"]
    for depth, runs in results.items():
        for name, r in runs.items():
            h = r["history"]
            pre = args.pretrain_epochs if "J_0" in name else 0
            pre_acc = f"{h[pre - 1]['test_acc']:.4f}" if pre else "—"
            pre_act = f"{h[pre - 1]['active_fraction']:.3f}" if pre else f"{h[0]['active_fraction']:.3f} (epoch 1)"
            lines.append(f"| {depth} | {name} | {pre_acc} | {pre_act} | {r['ratio']:.1e} | {h[pre]['test_acc']:.4f} | "
                         f"{h[-1]['test_acc']:.4f} | {h[-1]['train_acc']:.4f} | {h[-1]['active_fraction']:.3f} |")
    lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps({str(d): {n: r for n, r in runs.items()} for d, runs in results.items()},
                                                   indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
