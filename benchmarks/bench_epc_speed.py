"""Epoch time of error-optimised PC against back-propagation's, eager and compiled, beside the multiply-add floor.

One training epoch of each rule on the same batches from the same initial weights, interleaved repeats in one
process after an untimed first epoch (which compiles), pinned to one core with one thread, on

* ``mlp``     PCX's MLP (``pcx-mlp``), MNIST, batch 64 (the first 12 800 training images: 200 batches);
* ``resmlp``  the 64-layer μPC residual MLP, MNIST, batch 64 (the first 3200 images: 50 batches);
* ``vgg5``    VGG-5 at the benchmark's CPU width (``vgg5:width=0.0625``), colour CIFAR-10 (the lossy development
  copy), batch 128, standardised (the first 3840 images: 30 batches);

with ``--compile off`` and ``on``. The acceptance: an ePC epoch costs at most ``1.2 (K + 1)`` BP epochs (7.2 at
K = 5). The floor is the multiply-add count: BP's step is a forward and a backward pass (the backward two products
per layer: inputs and weights), 3 units; ePC's is K iterations of a forward pass and an input-only backward pass
(2 units each), the states' forward pass and the weight gradient's forward and weight-only backward pass (3 more):
``(2K + 3) / 3`` = 4.33 at K = 5.

Run:  OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_epc_speed.py --cifar-dir DIR   → results/epc_speed.md, .png
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings

import torch

from epoch_timing import RESULTS
from inferlearn.engine.compiled import compiling
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import build, run_epoch

K = 5
CASES = {
    "mlp": dict(data="mnist", arch="pcx-mlp", batch_size=64, limit_train=12_800),
    "resmlp": dict(data="mnist", arch="resmlp:depth=64,width=128,param=mupc", batch_size=64, limit_train=3200),
    "vgg5": dict(data="cifar10", arch="vgg5:width=0.0625", batch_size=128, limit_train=3840, allow_unverified=True),
}


def time_epochs(base: TrainConfig, rules: list[str], repeats: int) -> dict[str, list[float]]:
    """Epoch times of each rule, interleaved: one session (model object) per rule, built once and reset to its
    initial weights before every epoch, so that compiled steps are compiled in an untimed first epoch and reused (a
    new model is a new graph to compile); ``repeats`` timed epochs each."""
    sessions = {r: build(base.replace(rule=r)) for r in rules}
    start = {r: copy.deepcopy(s.model.state_dict()) for r, s in sessions.items()}
    times: dict[str, list[float]] = {r: [] for r in rules}
    for rep in range(repeats + 1):
        for r, s in sessions.items():
            s.model.load_state_dict(start[r])
            t0 = time.perf_counter()
            run_epoch(s, base.replace(rule=r), 1, progress=False)
            if rep:
                times[r].append(time.perf_counter() - t0)
    return times


def floor(k: int = K) -> float:
    return (2 * k + 3) / 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cifar-dir", help="colour CIFAR-10 folder (read with --allow-unverified)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default="off,on")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for case in args.cases.split(","):
        spec = dict(CASES[case])
        if spec["data"] == "cifar10":
            spec["data_dir"] = args.cifar_dir
        for mode in args.modes.split(","):
            base = TrainConfig(rule="backprop", act="relu", epochs=1, optimizer="adam", lr=1e-3, seed=0,
                               compile=mode, out="/tmp/inferlearn-epc-speed", **spec)
            with warnings.catch_warnings(), compiling(mode):   # run_epoch alone does not apply config.compile
                warnings.simplefilter("ignore")
                times = time_epochs(base, ["backprop", "epc"], args.repeats)
            bp_s, epc_s = statistics.median(times["backprop"]), statistics.median(times["epc"])
            rows.append(dict(case=case, compile=mode, bp_s=bp_s, epc_s=epc_s, ratio=epc_s / bp_s,
                             bp_times=times["backprop"], epc_times=times["epc"]))
            print(rows[-1], flush=True)
    lines = ["# ePC's epoch time against back-propagation's", "",
             "Command: `OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_epc_speed.py --cifar-dir DIR` "
             "(`benchmarks/bench_epc_speed.py`: the models, data and floor are in its docstring).", "",
             f"Median over {args.repeats} interleaved repeats of one epoch each (one pinned core, one thread, Adam); "
             f"limit: 1.2 (K + 1) = {1.2 * (K + 1):.1f}; multiply-add floor (2K + 3)/3 = {floor():.2f}.", "",
             "| model | compile | BP epoch (s) | ePC epoch (s) | ePC / BP | floor | within 1.2 (K + 1) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ok = "yes" if r["ratio"] <= 1.2 * (K + 1) else "**no**"
        lines.append(f"| {r['case']} | {r['compile']} | {r['bp_s']:.2f} | {r['epc_s']:.2f} | {r['ratio']:.2f} | "
                     f"{floor():.2f} | {ok} |")
    lines += ["", "With `--compile on` ePC's error step is one compiled call per shape (`EPC_GRAPH_STEP`), and BP's "
              "training step compiled (the MLP's whole fused step; a graph's forward and backward); the untimed first "
              "epoch compiles and is not timed."]
    (RESULTS / "epc_speed.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "epc_speed.json").write_text(json.dumps(rows, indent=1))
    plot(rows)
    print(f"wrote {RESULTS / 'epc_speed.md'}")
    return 0


def plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = [f"{r['case']}\n{'compiled' if r['compile'] == 'on' else 'eager'}" for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] for r in rows], color="tab:blue")
    ax.axhline(1.2 * (K + 1), color="tab:red", ls="--", label=f"limit 1.2 (K + 1) = {1.2 * (K + 1):.1f}")
    ax.axhline(floor(), color="gray", ls=":", label=f"multiply-add floor {floor():.2f}")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("ePC epoch / BP epoch")
    ax.set_title(f"ePC (K = {K}) epoch time over BP's, one pinned core", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "epc_speed.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
