"""Epoch time by intra-op thread count, on a quiet machine and beside one busy core.

Why `--threads` defaults to 1: with PyTorch's default thread count (one per core) a small model's
every operation waits for all threads, so a single busy core elsewhere stalls it. For 1 and N threads
(N = the machine's cores, PyTorch's default), quiet and with a busy-looping process beside it, the
script times a fixed number of mini-batches of back-propagation and predictive coding on the MNIST
MLP 784-64-64-64-10 (batch 50; scikit-learn's digits with 64-64-64-64-10 when MNIST is not found),
interleaving the settings, and reports the median over repeats as a ratio to 1 thread, quiet.

Run:  python benchmarks/bench_threads.py [--batches 300] [--repeats 3]
Writes ``benchmarks/results/threads.md``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from inferlearn.data import load_dataset
from inferlearn.errors import DataError
from inferlearn.models import MLP
from inferlearn.rules import make_rule

RESULTS = Path(__file__).resolve().parent / "results"
BUSY = "while True:\n    pass\n"


def time_batches(rule_name: str, x, y, sizes, batches: int, threads: int) -> float:
    torch.set_num_threads(threads)
    model, rule = MLP(sizes, seed=0), make_rule(rule_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t0 = time.perf_counter()
    for i in range(batches):
        sl = slice((i * 50) % (len(y) - 50), (i * 50) % (len(y) - 50) + 50)
        opt.zero_grad()
        rule.backward(model, x[sl], y[sl])
        opt.step()
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    try:
        data, sizes = load_dataset("mnist"), "784-64-64-64-10"
    except DataError:
        data, sizes = load_dataset("digits"), "64-64-64-64-10"
    cores = os.cpu_count() or 1
    settings = [(t, busy) for busy in (False, True) for t in sorted({1, cores})]
    rows = {}
    for rule in ("backprop", "pc"):
        times = {s: [] for s in settings}
        for _ in range(args.repeats):
            for threads, busy in settings:
                hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
                try:
                    if hog is not None:
                        time.sleep(0.5)
                    times[(threads, busy)].append(time_batches(rule, data.train_x, data.train_y, sizes,
                                                               args.batches, threads))
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
        ref = statistics.median(times[(1, False)])
        rows[rule] = {s: statistics.median(v) / ref for s, v in times.items()}
    lines = ["# Epoch time by thread count, quiet and beside a busy core", "",
             f"Command: `python benchmarks/bench_threads.py --batches {args.batches} --repeats {args.repeats}`", "",
             f"{data.name} MLP {sizes}, batch 50, SGD; {args.batches} mini-batches per timing, median of "
             f"{args.repeats} interleaved repeats; {cores} cores; a busy core is one Python busy loop. "
             "Ratios to the same rule with 1 thread on the quiet machine.", "",
             "| rule | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}, {'busy core' if b else 'quiet'}"
                                     for t, b in settings) + " |",
             "|---|" + "---|" * len(settings)]
    for rule, r in rows.items():
        lines.append(f"| {rule} | " + " | ".join(f"{r[s]:.2f}" for s in settings) + " |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
