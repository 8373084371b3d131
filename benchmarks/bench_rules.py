"""Epoch time of every registered rule relative to back-propagation, in one process.

Usage::

    python benchmarks/bench_rules.py --data mnist --arch 784-64-64-64-10 --repeats 3

Writes ``benchmarks/results/rules_epoch_time.md`` (and ``.png``). Beside each ratio, the rule's **multiply-add
floor**: its multiply-adds per sample over back-propagation's, from the sweep and step counts it took in the timed
epoch (``epoch_timing.multiply_add_floor``); a ratio near its floor is limited by arithmetic, one far above
it by overhead. ``--compile`` runs every rule in that mode (``auto``: what ``inferlearn train`` does on a run
of this length).
"""
from __future__ import annotations

import argparse
import sys


import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from epoch_timing import RESULTS, environment, markdown_table, multiply_add_floor, time_rules  # noqa: E402

from inferlearn.engine.compiled import compiling, planned_batches  # noqa: E402
from inferlearn.training.config import TrainConfig  # noqa: E402
from inferlearn.rules import RULES  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mnist")
    p.add_argument("--arch", default="784-64-64-64-10")
    p.add_argument("--act", default="relu")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--limit-train", type=int, default=None, help="samples per epoch (default: all)")
    p.add_argument("--rules", default="all")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--name", default="rules_epoch_time")
    p.add_argument("--compile", default="auto", choices=["auto", "off", "on"],
                   help="compile mode for every rule (default %(default)s)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rules = sorted(RULES) if args.rules == "all" else args.rules.split(",")
    rules = ["backprop"] + [r for r in rules if r != "backprop"]
    base = TrainConfig(data=args.data, arch=args.arch, act=args.act, batch_size=args.batch_size,
                       limit_train=args.limit_train, out="/tmp/inferlearn-bench", compile=args.compile)
    with compiling(args.compile), planned_batches(base.epochs * ((args.limit_train or 60000) // args.batch_size)):
        rows = time_rules(base, [(r, r, {}) for r in rules], repeats=args.repeats)
        sizes = [int(n) for n in args.arch.split("-")]
        for row in rows:
            extras = row["extras"]
            floor = multiply_add_floor(row["rule"], row["options"], sizes, extras)
            row["floor"] = "—" if floor is None else f"{floor:.2f}"
            counts = [f"{k.replace('_', ' ')} {v:.1f}" for k, v in extras.items()
                      if k in ("solver_iterations", "free_solver_iterations", "inference_steps")]
            row["counts"] = ", ".join(counts) or "—"
    RESULTS.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/bench_rules.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"# Epoch time of each rule relative to back-propagation\n\nCommand: `{cmd}`\n\n"
            f"Data `{args.data}`{f' (first {args.limit_train} samples)' if args.limit_train else ''}, architecture "
            f"`{args.arch}`, units `{args.act}`, batch {args.batch_size}, SGD at each rule's recommended rate, default "
            f"rule options, compile `{args.compile}`; median of "
            f"{args.repeats} interleaved repeats; {environment()}.\n\n" + markdown_table(rows, extra=("multiply-add floor", "floor"))
            + "\nSweeps and steps per batch (the floors' counts, the first repeat's epoch): "
            + "; ".join(f"{r['label']}: {r['counts']}" for r in rows if r["counts"] != "—") + ".\n")
    (RESULTS / f"{args.name}.md").write_text(text)
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    ax.barh([r["label"] for r in rows][::-1], [r["ratio"] for r in rows][::-1])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("epoch time / back-propagation (median)")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=110)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
