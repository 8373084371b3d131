"""Why does standard lifted training (J_0) end below linear regression in Table 1?

Table 1 (``benchmarks/results/lifted_table1/``): J_0 reaches 0.784 / 0.765 test accuracy (ReLU / hard
sigmoid) while linear regression reaches 0.860; the paper says J_0, with a smaller learning rate in
its first epochs, "at least" matches linear regression. This script tests the candidate causes on
MNIST 784-64-64-64-10, γ = 1/8, batch 50, η = 1/20, on a training subset:

1. **Learning-rate schedule**: J_0 runs with the default warm-up (5 epochs at 0.1 η, then 0.3 η),
   constant 0.1 η and 0.3 η, warm-up then η, and the ``global`` 1/γ^{L-1} scaling at several rates;
   linear units; linear regression (closed form and the table's SGD row) and a deep *linear* network
   trained by back-propagation as references. Each run reports the forward training loss, accuracies,
   active fraction, the J_0 value per sample (``min Ê / γ^{L-1}``, comparable to the quadratic loss),
   how far each layer moved from its initial weights, and the accuracy of a closed-form least-squares
   refit of the output layer on the network's last hidden features (what the output layer could do
   with the features the hidden layers learned).
2. **Solver accuracy**: the J_0 gradient from the default solver (block projected gradient, float32,
   tolerances 1e-4 / 1e-5 / 1e-7) and the paper's 15-sweep coordinate descent against the float64
   reference solver, at the initial and at the J_0-trained weights.
3. **Gradient scale**: per layer, the norm ratio and cosine of J_0's gradient (layer-wise 1/γ^k
   scaling) and contrastive's (1/γ^{L-1}) to back-propagation's, at the initial and J_0-trained weights.
4. **J_0's optimum**: rescaling a trained ReLU network (W_{L-1} × s, W_0 and the hidden biases / s)
   leaves its forward pass unchanged but lowers min Ê: J_0 has no minimiser at the least-squares fit.

Writes a Markdown report (and a PNG of test accuracy per epoch). Run::

    OMP_NUM_THREADS=1 python benchmarks/investigations/j0_vs_linear_regression.py --limit-train 10000 --epochs 20
"""
from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from pathlib import Path

import torch

from inferlearn.baselines import least_squares_fit
from inferlearn.diagnostics import evaluate, rule_gradients
from inferlearn.engine.problems import LiftedEnergy
from inferlearn.engine.solvers import get_solver
from inferlearn.errors import DivergenceError
from inferlearn.losses import one_hot
from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import build, epoch_metrics, run_epoch
from inferlearn.training.schedules import warmup_schedule

RESULTS = Path(__file__).resolve().parent.parent / "results"
ARCH = "784-64-64-64-10"
GAMMA = 1 / 8


def j0_value(model, x, labels, gamma=GAMMA) -> float:
    """Mean ``min_z Ê(z; x, y) / γ^{L-1}`` (float64, tight block-pg solve)."""
    m = copy.deepcopy(model).double()
    energy = LiftedEnergy.from_model(m, gamma)
    problem = energy.problem(x.double(), one_hot(labels, energy.sizes[-1], torch.float64))
    hidden, _ = get_solver("block-pg", tol=1e-9, max_iter=5000, on_fail="ignore").solve(problem)
    return float(problem.value(hidden).mean()) / energy.term_weights[energy.depth]


@torch.no_grad()
def last_hidden(model, x):
    zs = model.forward_all(x)[0] if hasattr(model, "forward_all") else None
    return zs[-2]


@torch.no_grad()
def refit_accuracy(model, s) -> float:
    """Test accuracy of a closed-form least-squares output layer on the forward last-hidden features."""
    h_tr, h_te = last_hidden(model, s.train_x), last_hidden(model, s.test_x)
    w, b = least_squares_fit(h_tr, s.train_y, 10)
    pred = (h_te.double() @ w.T + b).argmax(1)
    return float((pred == s.test_y).double().mean())


def train_variant(name, args, act="relu", rule="lifted-j0", opts=None, arch=ARCH, schedule=(5, 0.1, 0.3)):
    """Train one variant; ``schedule`` = (warm-up epochs, warm-up factor, factor after) of η."""
    opts = dict(opts or {})
    if rule in ("lifted-j0", "contrastive"):
        opts.setdefault("gamma", GAMMA)
    cfg = TrainConfig(data="mnist", arch=arch, act=act, rule=rule, rule_options=opts, epochs=args.epochs,
                      batch_size=50, lr=args.lr, seed=args.seed, limit_train=args.limit_train,
                      out="/tmp/inferlearn-j0-investigation", divergence_factor=1e4)
    torch.manual_seed(args.seed)
    s = build(cfg)
    s.scheduler = warmup_schedule(s.optimizer, *schedule)
    w0 = {k: v.detach().clone() for k, v in s.model.state_dict().items() if k.endswith("weight")}
    history, diverged = [], None
    t0 = time.perf_counter()
    for e in range(1, args.epochs + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss = run_epoch(s, cfg, e, progress=False)
        except DivergenceError as exc:
            diverged = f"diverged in epoch {e}"
            print(name, exc, flush=True)
            break
        history.append(epoch_metrics(s, e, loss, 0.0))
        print(json.dumps({"variant": name, **{k: history[-1][k] for k in ("epoch", "train_loss", "test_acc",
                                                                          "active_fraction")}}), flush=True)
    out = {"name": name, "history": history, "diverged": diverged, "minutes": (time.perf_counter() - t0) / 60}
    if history and diverged is None:   # a diverged run's weights are not worth measuring
        sd = s.model.state_dict()
        out["moved"] = [float((sd[k] - w0[k]).norm() / w0[k].norm()) for k in w0]
        out["norms"] = [float(sd[k].norm()) for k in w0]
        if len(w0) > 1:
            out["refit"] = refit_accuracy(s.model, s)
        if len(w0) > 1:
            out["j0"] = j0_value(s.model, s.train_x[:1000], s.train_y[:1000])
    out["model"] = s.model
    out["setup"] = s
    return out


def grad_table(model, x, labels) -> list[dict]:
    """Per layer: J_0 and J_1 gradient norm ratio and cosine to BP's."""
    m = copy.deepcopy(model).double()
    x = x.double()
    bp = rule_gradients(make_rule("backprop"), m, x, labels)
    j0 = rule_gradients(make_rule("lifted-j0", {"gamma": GAMMA, "solver": "reference"}), m, x, labels)
    j1 = rule_gradients(make_rule("contrastive", {"gamma": GAMMA, "solver": "reference"}), m, x, labels)
    rows = []
    for k in (k for k in bp if k.endswith("weight")):
        row = {"param": k}
        for name, g in (("J_0", j0), ("J_1", j1)):
            row[name] = (float(g[k].norm() / bp[k].norm()),
                         float((g[k] * bp[k]).sum() / (g[k].norm() * bp[k].norm()).clamp_min(1e-300)))
        rows.append(row)
    return rows


def solver_table(model, x, labels) -> list[tuple[str, list[float]]]:
    """Relative error of J_0's weight gradient per layer against the float64 reference solver."""
    ref = rule_gradients(make_rule("lifted-j0", {"gamma": GAMMA, "solver": "reference"}), copy.deepcopy(model).double(),
                         x.double(), labels)
    out = []
    for name, opts in (("block-pg tol 1e-4", {"tol": 1e-4}), ("block-pg tol 1e-5 (default)", {}),
                       ("block-pg tol 1e-7", {"tol": 1e-7, "max_iter": 2000}), ("cd, 15 sweeps (paper)", {"solver": "cd"})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = rule_gradients(make_rule("lifted-j0", {"gamma": GAMMA, **opts}), model, x, labels)
        out.append((name, [float((g[k].double() - ref[k]).norm() / ref[k].norm()) for k in ref if k.endswith("weight")]))
    return out


def rescale_table(model, s, scales=(1, 2, 4, 8)) -> list[tuple]:
    """J_0 value and forward accuracy after W_{L-1} × s, W_0, b_0..b_{L-2} / s (ReLU: same forward pass)."""
    rows = []
    for sc in scales:
        m = copy.deepcopy(model)
        with torch.no_grad():
            lin = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
            lin[0].weight /= sc
            for layer in lin[:-1]:
                layer.bias /= sc
            lin[-1].weight *= sc
        rows.append((sc, evaluate(m, s.test_x, s.test_y), j0_value(m, s.train_x[:1000], s.train_y[:1000])))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-train", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part", choices=["main", "scaling"], default="main",
                    help="main: sections 1-4; scaling: the global 1/γ^{L-1} scaling after a linearising warm-up "
                         "(section 1 only, into OUT_scaling.*)")
    ap.add_argument("--out", default=str(RESULTS / "j0_investigation"), help="writes OUT.md, OUT.png, OUT.json")
    args = ap.parse_args()
    if args.part == "scaling":
        args.out = args.out + "_scaling"
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    variants = [
        ("BP, deep linear network, 0.1 η", dict(rule="backprop", act="linear", schedule=(0, 1, 0.1))),
        ("linear regression (784-10, BP), 0.1 η", dict(rule="backprop", arch="784-10", schedule=(0, 1, 0.1))),
        ("J_0 default: 5 ep. 0.1 η, then 0.3 η", dict()),
        ("J_0 constant 0.1 η", dict(schedule=(0, 1, 0.1))),
        ("J_0 constant 0.3 η", dict(schedule=(0, 1, 0.3))),
        ("J_0 5 ep. 0.1 η, then η", dict(schedule=(5, 0.1, 1.0))),
        ("J_0 default, γ = 1", dict(opts={"gamma": 1.0})),
        ("J_0 default, linear units", dict(act="linear")),
        ("J_0 default, hard sigmoid", dict(act="hard-sigmoid")),
        ("J_0 global 1/γ^{L-1} scaling, 0.1 η", dict(opts={"scaling": "global"}, schedule=(0, 1, 0.1))),
        ("J_0 global scaling, 0.01 η", dict(opts={"scaling": "global"}, schedule=(0, 1, 0.01))),
        ("J_0 global scaling, 0.001 η", dict(opts={"scaling": "global"}, schedule=(0, 1, 0.001))),
    ]
    if args.part == "scaling":
        g = {"scaling": "global"}
        variants = [
            ("J_0 global, linear units, 0.1 η", dict(act="linear", opts=g, schedule=(0, 1, 0.1))),
            ("J_0 global, 5 ep. 0.001 η, then 0.1 η", dict(opts=g, schedule=(5, 0.001, 0.1))),
            ("J_0 global, 5 ep. 0.001 η, then 0.3 η", dict(opts=g, schedule=(5, 0.001, 0.3))),
            ("J_0 global, hard sigmoid, 5 ep. 0.001 η, then 0.1 η", dict(act="hard-sigmoid", opts=g,
                                                                         schedule=(5, 0.001, 0.1))),
            ("J_0 global, hard sigmoid, 10 ep. 0.001 η, then 0.1 η", dict(act="hard-sigmoid", opts=g,
                                                                          schedule=(10, 0.001, 0.1))),
            ("J_0 global, hard sigmoid, 10 ep. 0.001 η, then 0.03 η", dict(act="hard-sigmoid", opts=g,
                                                                           schedule=(10, 0.001, 0.03))),
        ]
    runs = {}
    for name, kw in variants:
        runs[name] = train_variant(name, args, **kw)
    s = next(r["setup"] for r in runs.values())
    # closed-form linear regression on the same training subset
    w, b = least_squares_fit(s.train_x, s.train_y, 10)
    lr_train_out = s.train_x.double() @ w.T + b
    lr_loss = float(0.5 * ((lr_train_out - one_hot(s.train_y, 10, torch.float64)) ** 2).sum(1).mean())
    lr_test = float(((s.test_x.double() @ w.T + b).argmax(1) == s.test_y).double().mean())
    lr_train = float((lr_train_out.argmax(1) == s.train_y).double().mean())
    init = build(TrainConfig(data="mnist", arch=ARCH, act="relu", rule="backprop", seed=args.seed,
                             limit_train=args.limit_train, out="/tmp/inferlearn-j0-investigation"))
    init_refit = refit_accuracy(init.model, init)
    if args.part == "scaling":
        write(args, runs, (lr_loss, lr_train, lr_test), None, None, None, init_refit, time.perf_counter() - t_start)
        return
    default = runs["J_0 default: 5 ep. 0.1 η, then 0.3 η"]
    xb, yb = s.train_x[:200], s.train_y[:200]
    grads = {"initial": grad_table(init.model, xb, yb), "J_0-trained": grad_table(default["model"], xb, yb)}
    solvers = {"initial": solver_table(init.model, xb, yb), "J_0-trained": solver_table(default["model"], xb, yb)}
    rescale = rescale_table(default["model"], s)
    write(args, runs, (lr_loss, lr_train, lr_test), grads, solvers, rescale, init_refit, time.perf_counter() - t_start)


def write(args, runs, lr, grads, solvers, rescale, init_refit, seconds):
    import matplotlib

    matplotlib.use("Agg")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = (f"OMP_NUM_THREADS=1 python benchmarks/investigations/j0_vs_linear_regression.py --limit-train "
           f"{args.limit_train} --epochs {args.epochs} --lr {args.lr} --seed {args.seed}"
           + (" --part scaling" if args.part == "scaling" else ""))
    title = "# Why standard lifted training (J_0) ends below linear regression"
    if args.part == "scaling":
        title += ": the global scaling after a linearising warm-up"
    L = [title, "", f"Command: `{cmd}`", "",
         f"MNIST, first {args.limit_train} training images, the whole test set, `{ARCH}`, γ = 1/8, SGD batch 50, "
         f"η = {args.lr}, {args.epochs} epochs, seed {args.seed} (same initial weights for every network). "
         "Schedules are factors of η. *J_0 / sample*: `min Ê / γ^{L-1}` on the first 1000 training images "
         "(float64); for a linear network it is never above the forward quadratic loss `½‖f(x) − y‖²`, while "
         "an inactive unit of layer k adds up to `½ γ^{k+1-L} a²` (512 a² / 2 in the first hidden layer). "
         "*Moved*: `‖W_k − W_k⁰‖ / ‖W_k⁰‖` per layer. *Refit*: test accuracy of a closed-form least-squares "
         "output layer on the network's forward last-hidden features.", "",
         f"Closed-form linear regression on the same images: train loss {lr[0]:.4f}, train {lr[1]:.4f}, "
         f"test **{lr[2]:.4f}**. Refit on the *initial* network's last hidden features: {init_refit:.4f}.", "",
         "## 1. Training variants", "",
         "| variant | train loss | train acc | test acc | active | J_0 / sample | moved W0 / W1 / W2 / W3 | refit |",
         "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        if not r["history"]:
            L.append(f"| {name} | {r['diverged']} | | | | | | |")
            continue
        h = r["history"][-1]
        moved = " / ".join(f"{m:.2f}" for m in r["moved"]) if "moved" in r else "—"
        note = f" ({r['diverged']})" if r["diverged"] else ""
        j0 = f"{r['j0']:.4f}" if "j0" in r else "—"
        refit = f"{r['refit']:.4f}" if "refit" in r else "—"
        L.append(f"| {name}{note} | {h['train_loss']:.4f} | {h['train_acc']:.4f} | {h['test_acc']:.4f} | "
                 f"{h['active_fraction']:.3f} | {j0} | {moved} | {refit} |")
    if solvers is None:
        L += ["", f"Wall time {seconds / 60:.0f} min. Test accuracy per epoch: `{out.with_suffix('.png').name}`.", ""]
        return _finish(out, L, runs, lr)
    L += ["", "## 2. Solver accuracy: relative error of J_0's weight gradient against the float64 reference", "",
          "First 200 training images.", "",
          "| weights | solver | W0 | W1 | W2 | W3 |", "|---|---|---|---|---|---|"]
    for state, rows in solvers.items():
        for name, errs in rows:
            L.append(f"| {state} | {name} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")
    L += ["", "## 3. Gradient scale: norm ratio / cosine to back-propagation's gradient, per layer", "",
          "First 200 training images, float64, reference solver; J_0 with its layer-wise 1/γ^k scaling, J_1 "
          "divided by γ^{L-1}. J_0-trained = the default J_0 run above.", "",
          "| weights | layer | J_0 ‖g‖/‖g_BP‖ | J_0 cos | J_1 ‖g‖/‖g_BP‖ | J_1 cos |", "|---|---|---|---|---|---|"]
    for state, rows in grads.items():
        for row in rows:
            L.append(f"| {state} | {row['param']} | {row['J_0'][0]:.3g} | {row['J_0'][1]:.3f} | {row['J_1'][0]:.3g} | "
                     f"{row['J_1'][1]:.3f} |")
    L += ["", "## 4. J_0 has no minimiser at a fit: rescaling the trained ReLU network", "",
          "W_3 × s, W_0 and b_0, b_1, b_2 divided by s: the forward pass (hence every accuracy) is unchanged, "
          "the J_0 value is not.", "", "| s | test acc | J_0 / sample |", "|---|---|---|"]
    for sc, acc, val in rescale:
        L.append(f"| {sc} | {acc:.4f} | {val:.4f} |")
    L += ["", f"Wall time {seconds / 60:.0f} min. Test accuracy per epoch: `{out.with_suffix('.png').name}`.", ""]
    return _finish(out, L, runs, lr)


def _finish(out, L, runs, lr):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.with_suffix(".md").write_text("\n".join(L))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, r in runs.items():
        if r["history"]:
            ax.plot([h["epoch"] for h in r["history"]], [h["test_acc"] for h in r["history"]], marker="o",
                    markersize=2, label=name)
    ax.axhline(lr[2], color="k", ls=":", label="closed-form linear regression")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.3, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    out.with_suffix(".json").write_text(json.dumps({n: {k: v for k, v in r.items() if k not in ("model", "setup")}
                                                    for n, r in runs.items()}, indent=1))
    print("\n".join(L))


if __name__ == "__main__":
    main()
