"""Fenchel back-propagation over β: test accuracy and per-layer gradient alignment with BackProp.

For β ∈ {1, 0.1, 0.01, 0.001} and back-propagation, trains 784-64-64-64-10 ReLU networks on MNIST
from the same initial weights (SGD, lr 0.05, batch 50, a few epochs: a short run), and measures the
cosine between each weight matrix's Fenchel-BP gradient and BackProp's on 1000 training samples,
at the initial weights and at the trained weights.

Usage::

    python benchmarks/bench_fenchel.py --epochs 2

Writes ``benchmarks/results/bench_fenchel.md``.
"""
from __future__ import annotations

import argparse
import sys
import time


import torch  # noqa: E402
from epoch_timing import RESULTS, environment  # noqa: E402

from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.diagnostics import gradient_alignment  # noqa: E402
from inferlearn.training.loop import build, epoch_metrics, run_epoch  # noqa: E402


def alignment(rule, model, x, y) -> list[float]:
    return [r["cosine"] for r in gradient_alignment(rule, model, x, y) if r["param"].endswith("weight")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mnist")
    p.add_argument("--arch", default="784-64-64-64-10")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--betas", default="1,0.1,0.01,0.001")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = TrainConfig(data=args.data, arch=args.arch, act="relu", batch_size=50, lr=0.05, epochs=args.epochs,
                       limit_train=args.limit_train, out="/tmp/inferlearn-bench-fenchel")
    variants = [("backprop", "backprop", {})] + [(f"fenchel-bp β={b}", "fenchel-bp", {"beta": float(b)})
                                                 for b in args.betas.split(",")]
    rows = []
    for label, rule, opts in variants:
        cfg = base.replace(rule=rule, rule_options=opts)
        s = build(cfg)
        xa, ya = s.train_x[:1000], s.train_y[:1000]
        cos0 = alignment(s.rule, s.model, xa, ya)
        t0 = time.perf_counter()
        for ep in range(1, args.epochs + 1):
            run_epoch(s, cfg, ep, progress=False)
        secs = time.perf_counter() - t0
        m = epoch_metrics(s, args.epochs, 0.0, secs)
        cos1 = alignment(s.rule, s.model, xa, ya)
        rows.append((label, m["train_acc"], m["test_acc"], cos0, cos1, secs))
        print(label, f"test {m['test_acc']:.4f}", [round(c, 4) for c in cos0], [round(c, 4) for c in cos1], f"{secs:.1f}s",
              flush=True)
    cmd = "python benchmarks/bench_fenchel.py " + " ".join(argv if argv is not None else sys.argv[1:])
    nl = len(rows[0][3])
    head = ("| variant | train acc | test acc | " + " | ".join(f"cos W{k} (init)" for k in range(nl)) + " | "
            + " | ".join(f"cos W{k} (trained)" for k in range(nl)) + " | train time (s) |")
    lines = [head, "|" + "---|" * (4 + 2 * nl)]
    for label, tr, te, c0, c1, secs in rows:
        lines.append(f"| {label} | {tr:.4f} | {te:.4f} | " + " | ".join(f"{c:.4f}" for c in c0) + " | "
                     + " | ".join(f"{c:.4f}" for c in c1) + f" | {secs:.1f} |")
    text = (f"# Fenchel back-propagation over β on {args.data}\n\nCommand: `{cmd}`\n\n"
            f"`{args.arch}` ReLU, SGD lr 0.05, batch 50, {args.epochs} epoch(s)"
            f"{f' on the first {args.limit_train} samples' if args.limit_train else ''}, same initial weights (seed 0); "
            "cosine of each weight matrix's gradient with BackProp's on the first 1000 training samples, at the "
            f"initial and at the rule's trained weights; {environment()}.\n\n" + "\n".join(lines) + "\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_fenchel.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
