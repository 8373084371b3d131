"""How small may γ be? The contrastive gradient's error against back-propagation's, by γ, depth and precision.

In Tables 2–3 at γ = 1/8, contrastive training ends 0.7–1.4 test points below back-propagation, and its
training loss rises again after about 25 epochs. At γ = 1/32 Table 2 matches back-propagation, but on
Table 3's deeper network γ = 1/32 trains worse than γ = 1/8 and ReLU diverges in the first epoch. The
contrastive gradient divides ``min Ê − min E`` by γ^{L-1}: the clamped and free activations of layer k
differ by O(γ^{L-1-k}) of the output error, so at the first layer the signal is a difference of order
γ^{L-1} between two O(1) solutions. In float32 (ε ≈ 1.2e-7), and with the solver's stopping tolerance
(1e-5 on the projected-gradient step), that signal drowns once γ^{L-1} is small.

This script separates the three sources of error, per layer, on the tables' Fashion-MNIST networks
(784-64×H-10, H = 3, 4, 5 hidden layers), ReLU and hard sigmoid, at weights trained briefly by
back-propagation (the same initial weights as the tables, seed 0):

* **bias** — the float64 reference solver (active-set Newton, exact to ≈1e-13): the γ-bias of J_1 itself;
* **solver** — the default solver (block projected gradient, tolerance 1e-5) in float64;
* **float32** — the default solver in float32, as the tables train.

Each is the relative error ``‖g − g_BP‖ / ‖g_BP‖`` of a weight matrix's gradient against float64
back-propagation on the same batch. Writes ``results/contrastive_small_gamma.md`` and ``.png``. Run::

    OMP_NUM_THREADS=1 python benchmarks/investigations/contrastive_small_gamma.py
"""
from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path

import torch

from inferlearn.diagnostics import rule_gradients
from inferlearn.rules import BackProp, make_rule
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import build, run_epoch

RESULTS = Path(__file__).resolve().parent.parent / "results"
VARIANTS = {  # name: (solver options, dtype)
    "bias (reference, float64)": ({"solver": "reference"}, torch.float64),
    "solver (block-pg 1e-5, float64)": ({}, torch.float64),
    "float32 (block-pg 1e-5, as trained)": ({}, torch.float32),
}


def trained_model(hidden: int, act: str, epochs: int, limit_train: int):
    """The tables' initial weights (seed 0), trained ``epochs`` epochs by back-propagation on a subset."""
    cfg = TrainConfig(data="fashion-mnist", arch="-".join(["784"] + ["64"] * hidden + ["10"]), act=act,
                      rule="backprop", epochs=epochs, batch_size=50, optimizer="sgd", lr=0.05, seed=0,
                      limit_train=limit_train, out="unused")
    s = build(cfg)
    for e in range(1, epochs + 1):
        run_epoch(s, cfg, e, progress=False)
    return s.model, s.train_x, s.train_y


def relative_errors(model, x, labels, rule_options: dict, rule: str = "contrastive") -> dict[str, list[float]]:
    """Per variant, the relative error of each weight matrix's gradient (``rule``) vs float64 BP."""
    m64 = copy.deepcopy(model).double()
    ref = rule_gradients(BackProp(), m64, x.double(), labels)
    names = [n for n in ref if n.endswith("weight")]
    out = {}
    for variant, (opts, dtype) in VARIANTS.items():
        r = make_rule(rule, {**rule_options, **opts})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # iteration-limit and precision warnings are part of the finding
            g = rule_gradients(r, copy.deepcopy(model).to(dtype), x.to(dtype), labels)
        out[variant] = [float((g[n].double() - ref[n]).norm() / ref[n].norm()) for n in names]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", default="3,4,5", help="numbers of hidden layers (Table 1 shape, Table 2, Table 3)")
    ap.add_argument("--acts", default="relu,hard-sigmoid")
    ap.add_argument("--gammas", default="8,16,32,64", help="denominators: γ = 1/n")
    ap.add_argument("--betas", default="0.1,0.01", help="equilibrium propagation's β (at γ = 1/8)")
    ap.add_argument("--samples", type=int, default=500, help="batch on which gradients are compared")
    ap.add_argument("--epochs", type=int, default=1, help="back-propagation epochs before the comparison")
    ap.add_argument("--limit-train", type=int, default=10000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hiddens = [int(h) for h in args.hidden.split(",")]
    acts = args.acts.split(",")
    dens = [int(d) for d in args.gammas.split(",")]
    betas = [float(b) for b in args.betas.split(",")]
    t0 = time.time()
    rows = []
    for act in acts:
        for h in hiddens:
            model, X, Y = trained_model(h, act, args.epochs, args.limit_train)
            x, y = X[-args.samples:], Y[-args.samples:]
            for d in dens:
                for variant, errs in relative_errors(model, x, y, {"gamma": 1 / d}).items():
                    rows.append({"act": act, "hidden": h, "den": d, "variant": variant, "errs": errs})
                    print(act, h, f"1/{d}", variant, [f"{e:.3g}" for e in errs], flush=True)
            for beta in betas:
                opts = {"gamma": 1 / 8, "beta": beta, "nudging": "symmetric"}
                for variant, errs in relative_errors(model, x, y, opts, rule="eqprop").items():
                    rows.append({"act": act, "hidden": h, "beta": beta, "variant": variant, "errs": errs})
                    print(act, h, f"eqprop β={beta}", variant, [f"{e:.3g}" for e in errs], flush=True)
    write(rows, args, acts, hiddens, dens, time.time() - t0)


def _error_table(h: int, head: str, entries) -> list[str]:
    """A Markdown table of per-layer relative errors: one row per ``(setting, signal, row)``."""
    lines = [head + " variant | " + " | ".join(f"W{k}" for k in range(h + 1)) + " |", "|---|---|---|" + "---|" * (h + 1)]
    for setting, signal, r in entries:
        lines.append(f"| {setting} | {signal:.1e} | {r['variant']} | " + " | ".join(f"{e:.3g}" for e in r["errs"]) + " |")
    return lines + [""]


def write(rows, args, acts, hiddens, dens, seconds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = ["# Contrastive training at small γ: bias, solver tolerance and float32", "",
             f"Command: `python benchmarks/investigations/contrastive_small_gamma.py --hidden {args.hidden} "
             f"--acts {args.acts} --gammas {args.gammas} --betas {args.betas} --samples {args.samples} --epochs {args.epochs} "
             f"--limit-train {args.limit_train}`", "",
             f"Fashion-MNIST 784-64×H-10 (H hidden layers; H = 4 is Table 2, H = 5 Table 3), the tables' initial "
             f"weights (seed 0) after {args.epochs} epoch(s) of back-propagation (SGD 0.05, batch 50) on the first "
             f"{args.limit_train} training images; gradients on the last {args.samples} of them. Relative error "
             "‖g − g_BP‖/‖g_BP‖ of each weight matrix's contrastive gradient (J_1/γ^{L-1}) against float64 "
             "back-propagation. *bias*: exact inference (float64 reference solver), the γ-bias of J_1 itself; "
             "*solver*: the default block projected-gradient solver (tolerance 1e-5, at most 100 iterations) in "
             "float64; *float32*: the same solver in float32, as the tables train. "
             "Equilibrium propagation (symmetric nudging, γ = 1/8) is measured the same way for each β: its "
             "signal, the nudged minus free difference, is of order β γ^(L-1). "
             f"Wall time {seconds / 60:.1f} min.", ""]
    for act in acts:
        for h in hiddens:
            selected = [r for r in rows if r["act"] == act and r["hidden"] == h]
            lines += [f"## {act}, {h} hidden layers (γ^(L-1) = γ^{h})", ""]
            lines += _error_table(h, "| γ | γ^(L-1) |", [(f"1/{r['den']}", (1 / r["den"]) ** h, r)
                                                         for r in selected if "den" in r])
            lines += [f"Equilibrium propagation, {act}, {h} hidden layers, γ = 1/8:", ""]
            lines += _error_table(h, "| β | β γ^(L-1) |", [(f"{r['beta']:g}", r["beta"] * (1 / 8) ** h, r)
                                                           for r in selected if "beta" in r])
    (RESULTS / "contrastive_small_gamma.md").write_text("\n".join(lines))

    fig, axes = plt.subplots(len(acts), len(hiddens), figsize=(4 * len(hiddens), 3.4 * len(acts)), squeeze=False,
                             sharey=True)
    for i, act in enumerate(acts):
        for j, h in enumerate(hiddens):
            ax = axes[i][j]
            for variant, style in zip(VARIANTS, ("-o", "--s", ":^")):
                errs = [max(r["errs"]) for d in dens for r in rows
                        if r["act"] == act and r["hidden"] == h and r.get("den") == d and r["variant"] == variant]
                ax.loglog([1 / d for d in dens], errs, style, label=variant)
            ax.set_title(f"{act}, {h} hidden: largest error over the layers", fontsize=9)
            ax.set_xlabel("γ")
            ax.set_xticks([1 / d for d in dens], [f"1/{d}" for d in dens])
            ax.minorticks_off()
            ax.grid(alpha=0.3, which="both")
            if j == 0:
                ax.set_ylabel("‖g − g_BP‖ / ‖g_BP‖")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "contrastive_small_gamma.png", dpi=110)


if __name__ == "__main__":
    main()
