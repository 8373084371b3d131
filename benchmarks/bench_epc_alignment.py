"""Which regime ePC runs in: its weight gradient against back-propagation's and against the equilibrium's, per layer.

For three models at initialisation (float32, the squared-error output for every rule, one batch of real data):

* ``mlp``     PCX's MLP ``pcx-mlp`` (784-128-128-128-10, ReLU) on 64 MNIST training images;
* ``resmlp``  the 64-layer residual MLP in μPC's parameterisation (``resmlp:depth=64,width=128,param=mupc``), 64
  MNIST images;
* ``vgg5``    the benchmark's VGG-5 at its CPU budget width (``vgg5:width=0.0625``, ReLU, max pooling) on the first
  128 colour CIFAR-10 training images, standardised per channel (the lossy JPEG-derived development copy);

each weight layer's gradient (its weight and bias together) under

* state PC at its defaults (T = 20, η = 0.1) and at the benchmark's conv setting (T = 7);
* ePC at its defaults (K = 5, η = 1e-4);
* ePC near its equilibrium (K = 200, η = 0.3 for the MLP and VGG-5; η = 0.5, K = 200 for the residual MLP):
  state PC's equilibrium, reached in error coordinates,

as the cosine with back-propagation's gradient of the quadratic loss and the norm ratio ``‖g‖ / ‖g_BP‖``, and the
defaults' cosine with the equilibrium's. The acceptance on VGG-5: every conv layer's ePC gradient at the defaults has
cosine ≥ 0.9 with BP's and the largest over the smallest norm ratio across the conv layers is ≤ 3.

``--trajectory`` adds how long ePC's gradient stays on back-propagation's while VGG-5 trains at AdamW 3e-3, for
η = 1e-3 and 1e-4 (the small-step regime needs η λ_max(1 + JᵀJ) ≪ 1, and the curvature grows with the weights).

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_epc_alignment.py --cifar-dir DIR --trajectory   → results/epc_alignment.md
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch

from inferlearn.data import load_dataset
from inferlearn.data.transforms import channel_stats, standardize
from inferlearn.models import build_model
from inferlearn.rules import make_rule

RESULTS = Path(__file__).resolve().parent / "results"

MODELS = {
    "mlp": ("pcx-mlp", "mnist", 64, 0.3),
    "resmlp": ("resmlp:depth=64,width=128,param=mupc", "mnist", 64, 0.5),
    "vgg5": ("vgg5:width=0.0625", "cifar10", 128, 0.3),
}


def variants(eq_eta: float) -> list[tuple[str, str, dict]]:
    return [("state PC, defaults (T = 20, η = 0.1)", "pc", {}),
            ("state PC, T = 7", "pc", {"steps": 7}),
            ("ePC, defaults (K = 5, η = 1e-4)", "epc", {}),
            (f"ePC near equilibrium (K = 200, η = {eq_eta:g})", "epc", {"steps": 200, "step_size": eq_eta})]


def layer_grads(rule, model, x, y) -> list[torch.Tensor]:
    """One flat gradient per weight layer (a module's weight and bias together), in the model's order."""
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, y)
    out = []
    for m in model.modules():
        ps = [p for p in m.parameters(recurse=False) if p.grad is not None]
        if ps:
            out.append(torch.cat([p.grad.detach().flatten().double() for p in ps]))
    return out


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    d = float(a.norm() * b.norm())
    return float(a @ b) / d if d > 0 else float("nan")


def batch(data_name: str, n: int, data_dir: str | None, allow_unverified: bool):
    data = load_dataset(data_name, data_dir, allow_unverified=allow_unverified)
    x = data.train_x[:n].float()
    if data_name == "cifar10":
        mean, std = channel_stats(data.train_x, data.image_shape)
        x = standardize(x, mean, std, data.image_shape)
    return data, x, data.train_y[:n]


def measure(name: str, args) -> list[dict]:
    arch, data_name, n, eq_eta = MODELS[name]
    data, x, y = batch(data_name, n, args.cifar_dir if data_name == "cifar10" else None, data_name == "cifar10")
    model = build_model(arch, "relu", data.n_features, data.n_classes, data.image_shape, seed=0)
    bp = layer_grads(make_rule("backprop"), model, x, y)
    rows, grads = [], {}
    for label, rule, opts in variants(eq_eta):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # state PC's far-from-equilibrium warning on deep models is the point
            g = layer_grads(make_rule(rule, opts), model, x, y)
        grads[label] = g
        rows.append(dict(model=name, variant=label, seconds=time.perf_counter() - t0,
                         cos=[cos(a, b) for a, b in zip(g, bp)],
                         ratio=[float(a.norm() / b.norm()) for a, b in zip(g, bp)]))
    eq = grads[rows[-1]["variant"]]
    rows[2]["cos_eq"] = [cos(a, b) for a, b in zip(grads[rows[2]["variant"]], eq)]
    rows[0]["cos_eq"] = [cos(a, b) for a, b in zip(grads[rows[0]["variant"]], eq)]
    return rows


def trajectory(args, etas=(1e-3, 1e-4), steps: int = 400, every: int = 25) -> list[str]:
    """Train VGG-5 (CPU width) by ePC with AdamW 3e-3 (BP's best rate on the benchmark) and read, every ``every``
    steps, the per-layer cosine of ePC's gradient with back-propagation's at the same weights and batch: how long the
    small-step regime lasts as the network's gain grows, for each error step ``η``."""
    arch, data_name, n, _ = MODELS["vgg5"]
    data = load_dataset(data_name, args.cifar_dir, allow_unverified=True)
    mean, std = channel_stats(data.train_x, data.image_shape)
    lines = ["", "## How long the small-step regime lasts (VGG-5, AdamW 3e-3)", "",
             f"`--trajectory`: VGG-5 (`{arch}`) trained by ePC (K = 5) with AdamW (lr 3e-3, weight decay 5e-4) on "
             f"random batches of {n} of the first 45 000 training images (standardised, seed 0); every {every} steps, "
             "the loss and the cosine of ePC's gradient with back-propagation's per weight layer (conv 1-4, head) at "
             "the same weights and batch.", "",
             "| η | step | BP loss | cos conv 1 | cos conv 2 | cos conv 3 | cos conv 4 | cos head |", "|---|---|---|---|---|---|---|---|"]
    for eta in etas:
        model = build_model(arch, "relu", data.n_features, data.n_classes, data.image_shape, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
        epc, bp = make_rule("epc", {"step_size": eta}), make_rule("backprop")
        g = torch.Generator().manual_seed(0)
        for step in range(steps):
            idx = torch.randint(0, 45_000, (n,), generator=g)
            x = standardize(data.train_x[idx].float(), mean, std, data.image_shape)
            y = data.train_y[idx]
            if step % every == 0:
                model.zero_grad(set_to_none=True)
                loss = bp.backward(model, x, y).loss
                gb = layer_grads(bp, model, x, y)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ge = layer_grads(epc, model, x, y)
                lines.append(f"| {eta:g} | {step} | {loss:.3f} | " + " | ".join(f"{cos(a, b):.2f}" for a, b in zip(ge, gb))
                             + " |")
                print(lines[-1], flush=True)
            model.zero_grad(set_to_none=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                epc.backward(model, x, y)
            opt.step()
    return lines


def fmt_layers(v: list[float], fmt: str = ".3f") -> str:
    if len(v) <= 6:
        return " ".join(format(a, fmt) for a in v)
    mid = len(v) // 2
    return f"{format(v[0], fmt)} {format(v[1], fmt)} … {format(v[mid], fmt)} … {format(v[-2], fmt)} {format(v[-1], fmt)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cifar-dir", help="folder with colour CIFAR-10 (read with --allow-unverified)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--trajectory", action="store_true", help="also train VGG-5 by ePC at AdamW 3e-3 and follow its "
                    "alignment with BP (η = 1e-3 and 1e-4)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    extra = trajectory(args) if args.trajectory else []
    for name in args.models.split(","):
        rows += measure(name, args)
        print(name, "done", flush=True)
    lines = ["# ePC's regime: its gradient against back-propagation's and the equilibrium's", "",
             "Command: `OMP_NUM_THREADS=1 python benchmarks/bench_epc_alignment.py --cifar-dir DIR` "
             "(`benchmarks/bench_epc_alignment.py`; its docstring lists the models, data and variants).", "",
             "Per weight layer, bottom to top (first two, middle, last two for the deep model): cosine with "
             "back-propagation's gradient of the quadratic loss, the norm ratio ‖g‖ / ‖g_BP‖, and for state PC at its "
             "defaults and ePC at its defaults the cosine with ePC near equilibrium's gradient. At initialisation, "
             "float32, squared-error output.", "",
             "| model | variant | cos to BP per layer | ‖g‖/‖g_BP‖ per layer | cos to equilibrium | s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        eq = fmt_layers(r["cos_eq"]) if "cos_eq" in r else ""
        lines.append(f"| {r['model']} | {r['variant']} | {fmt_layers(r['cos'])} | {fmt_layers(r['ratio'], '.2g')} | "
                     f"{eq} | {r['seconds']:.2f} |")
    vgg = [r for r in rows if r["model"] == "vgg5"]
    if vgg:
        lines += ["", "**VGG-5 conv layers** (the first four weight layers; the fifth is the linear head):", ""]
        for r in vgg:
            c, q = r["cos"][:4], r["ratio"][:4]
            lines.append(f"- {r['variant']}: lowest conv cosine {min(c):.3f}, largest / smallest conv norm ratio "
                         f"{max(q) / min(q):.3g} (first conv {q[0]:.3g}, last conv {q[3]:.3g})")
        d = vgg[2]
        ok = min(d["cos"][:4]) >= 0.9 and max(d["ratio"][:4]) / min(d["ratio"][:4]) <= 3
        lines += ["", f"Acceptance (ePC at its defaults: conv cosine ≥ 0.9, norm-ratio spread ≤ 3): "
                  f"{'met' if ok else '**not met**'}."]
    (RESULTS / "epc_alignment.md").write_text("\n".join(lines + extra) + "\n")
    print(f"wrote {RESULTS / 'epc_alignment.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
