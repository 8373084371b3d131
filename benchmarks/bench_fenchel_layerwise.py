"""Fenchel back-propagation with one global β vs layer-wise β_k: gradient alignment with back-propagation.

On the MNIST MLP 784-64-64-64-10 (ReLU, seed 0, float64), for each variant the gradient on the first
``--samples`` training samples is compared with back-propagation's, layer by layer (cosine and relative
error ``‖g − g_BP‖ / ‖g_BP‖``), at the initial weights and after ``--bp-epochs`` epochs of back-propagation
(SGD lr 0.05, batch 50, on the first ``--limit-train`` samples), where more units sit near their kink.

Variants: global β (``beta``) and layer-wise β_k (``betas``, listed from the input side: β_1 acts on
the first hidden layer). The nudge of layer ``k`` is ``β_k · B · g_k`` with ``g_k`` the per-sample loss
gradient arriving at that layer.

Usage::

    python benchmarks/bench_fenchel_layerwise.py --samples 500

Writes ``benchmarks/results/fenchel_layerwise.md``.
"""
from __future__ import annotations

import argparse
import sys


import torch  # noqa: E402
from epoch_timing import RESULTS, environment  # noqa: E402

from inferlearn.diagnostics import rule_gradients  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402
from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.training.loop import build, run_epoch  # noqa: E402

VARIANTS = [
    ("global β = 1", {"beta": 1.0}),
    ("global β = 0.1", {"beta": 0.1}),
    ("global β = 0.01", {"beta": 0.01}),
    ("β_k = 1, 0.1, 0.01 (small at the top)", {"betas": "1,0.1,0.01"}),
    ("β_k = 0.01, 0.1, 1 (small at the bottom)", {"betas": "0.01,0.1,1"}),
    ("β_k = 1, 1, 0.01", {"betas": "1,1,0.01"}),
    ("β_k = 0.01, 1, 1", {"betas": "0.01,1,1"}),
    ("β_k = 0.1 · 10^{-(k-1)} (beta_ratio = 0.1)", {"beta": 0.1, "beta_ratio": 0.1}),
]


def compare(model, x, y) -> list[tuple[str, list[float], list[float]]]:
    ref = rule_gradients(make_rule("backprop"), model, x, y)
    names = [n for n in ref if n.endswith("weight")]
    rows = []
    for label, opts in VARIANTS:
        g = rule_gradients(make_rule("fenchel-bp", opts), model, x, y)
        cos = [float(g[n].flatten() @ ref[n].flatten() / (g[n].norm() * ref[n].norm())) for n in names]
        err = [float((g[n] - ref[n]).norm() / ref[n].norm()) for n in names]
        rows.append((label, cos, err))
    return rows


def table(rows) -> str:
    nl = len(rows[0][1])
    head = ("| variant | " + " | ".join(f"cos W{k}" for k in range(nl)) + " | mean cos | "
            + " | ".join(f"rel. err W{k}" for k in range(nl)) + " | mean rel. err |")
    lines = [head, "|" + "---|" * (2 * nl + 3)]
    for label, cos, err in rows:
        lines.append(f"| {label} | " + " | ".join(f"{c:.4f}" for c in cos) + f" | **{sum(cos) / nl:.4f}** | "
                     + " | ".join(f"{e:.4f}" for e in err) + f" | **{sum(err) / nl:.4f}** |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mnist")
    p.add_argument("--arch", default="784-64-64-64-10")
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--bp-epochs", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=10000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = TrainConfig(data=args.data, arch=args.arch, act="relu", rule="backprop", batch_size=50, lr=0.05,
                      epochs=args.bp_epochs, limit_train=args.limit_train, out="/tmp/inferlearn-bench-fenchel-lw")
    s = build(cfg)
    x, y = s.train_x[:args.samples].double(), s.train_y[:args.samples]
    at_init = compare(s.model.double(), x, y)
    s.model.float()
    for ep in range(1, args.bp_epochs + 1):
        run_epoch(s, cfg, ep, progress=False)
    trained = compare(s.model.double(), x, y)
    cmd = "python benchmarks/bench_fenchel_layerwise.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"# Fenchel back-propagation: global β vs layer-wise β_k on {args.data}\n\nCommand: `{cmd}`\n\n"
            f"`{args.arch}` ReLU (seed 0), float64; gradients of each weight matrix on the first {args.samples} "
            "training samples compared with back-propagation's (cosine, relative error). β_k are listed from "
            f"the input side. {environment()}.\n\n"
            f"## At the initial weights\n\n{table(at_init)}\n\n"
            f"## After {args.bp_epochs} epoch(s) of back-propagation (SGD lr 0.05, batch 50, first "
            f"{args.limit_train} samples)\n\n{table(trained)}\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fenchel_layerwise.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
