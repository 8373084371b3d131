"""Epoch time of Fenchel back-propagation, predictive coding (T = 15) and equilibrium propagation
relative to back-propagation, in one process (interleaved repeats, medians).

Targets (issue 4): Fenchel BP ≤ 1.3× BackProp, PC at T = 15 ≤ 2× BackProp. The peer is PCX (JAX,
jit): PC at T = 15 costs 2.2–3.3× a jit-compiled BP epoch on 784-64-64-64-10, batch 50.

Usage::

    python benchmarks/bench_pc.py --repeats 3

Writes ``benchmarks/results/bench_pc.md``.
"""
from __future__ import annotations

import argparse
import sys


import torch  # noqa: E402
from epoch_timing import RESULTS, environment, markdown_table, time_rules  # noqa: E402

from inferlearn.training.config import TrainConfig  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mnist")
    p.add_argument("--arch", default="784-64-64-64-10")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = TrainConfig(data=args.data, arch=args.arch, act="relu", batch_size=args.batch_size, lr=0.05,
                       limit_train=args.limit_train, out="/tmp/inferlearn-bench-pc")
    variants = [("backprop", "backprop", {}),
                ("backprop (autograd)", "backprop", {"fused": False}),
                ("fenchel-bp β=0.1", "fenchel-bp", {"beta": 0.1}),
                ("pc T=15", "pc", {"steps": 15, "step_size": 0.1}),
                ("pc T=5", "pc", {"steps": 5, "step_size": 0.1}),
                ("pc T=30", "pc", {"steps": 30, "step_size": 0.1}),
                ("pc T=15 η=0.2", "pc", {"steps": 15, "step_size": 0.2}),
                ("eqprop symmetric β=0.1", "eqprop", {}),
                ("lifted-fenchel T=15", "lifted-fenchel", {})]
    rows = time_rules(base, variants, repeats=args.repeats)
    RESULTS.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/bench_pc.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ratio = {r["label"]: r["ratio"] for r in rows}
    verdict = (f"\nTargets: Fenchel BP ≤ 1.3× → {ratio['fenchel-bp β=0.1']:.2f}× "
               f"({'met' if ratio['fenchel-bp β=0.1'] <= 1.3 else 'missed'}); "
               f"PC T=15 ≤ 2× → {ratio['pc T=15']:.2f}× ({'met' if ratio['pc T=15'] <= 2 else 'missed'}).\n")
    text = (f"# Epoch time relative to back-propagation: Fenchel BP, PC, EqProp\n\nCommand: `{cmd}`\n\n"
            f"Data `{args.data}`{f' (first {args.limit_train} samples)' if args.limit_train else ''}, `{args.arch}`, "
            f"ReLU, batch {args.batch_size}, SGD lr 0.05; median of {args.repeats} interleaved repeats; "
            f"{environment()}. Test accuracy after one epoch from the same initial weights.\n\n"
            + markdown_table(rows) + verdict)
    (RESULTS / "bench_pc.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
