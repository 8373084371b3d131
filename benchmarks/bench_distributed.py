"""Data-parallel and block-parallel training: measured speed-up of 2 processes, and a scaling model.

1. **Speed-up.** Times one epoch of ``inferlearn train --nproc P`` (P = 1, 2) for contrastive and
   predictive coding on the MNIST MLP 784-64-64-64-10 at global batch 100, and of
   ``inferlearn admm --nproc P --z-schedule jacobi`` (block-parallel, MLP 784-256-256-10, 3 blocks),
   each run a fresh process pinned to the same cores, one thread per process, runs interleaved,
   median of repeats. The epoch time is the run's own ``epoch_seconds`` (start-up excluded). It
   also reports each P's test accuracy (the same global batches, so they must agree).
2. **Loopback all-reduce.** Times gloo all-reduce between 2 processes for message sizes from 4 KiB
   to 64 MiB: the latency α is the median time of the messages up to 64 KiB, the bandwidth that of the
   largest message once α is taken off (``t = α + bytes / bandwidth``).
3. **Scaling model.** A ring all-reduce of ``n`` bytes over P processes moves ``2(P−1)/P · n`` bytes per
   process in ``2(P−1)`` latency steps. A data-parallel step of a rule on an MLP costs
   ``c · 6 · (B/P) · Σ_l n_l n_{l+1}`` flops (``c`` = the rule's cost relative to back-propagation's floor,
   measured here from the 1-process epoch) at the measured matmul rate, and communicates the weights'
   size. The predicted speed-up ``t(1) / (t(1)/P + t_comm(P))`` is tabulated over width, batch and P;
   where it flattens, adding processes (or machines, with their bandwidth instead of loopback's)
   stops paying. For block-parallel ADMM the exchange per outer iteration is two boundary
   activations per sample and boundary (``2 · N · d · 4`` bytes) against the blocks' compute.

Run:  OMP_NUM_THREADS=1 python benchmarks/bench_distributed.py [--repeats 3] [--cores 0,1] [--quick]
Writes ``benchmarks/results/distributed.md`` and ``distributed.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"
ARCH = "784-64-64-64-10"


def run_cli(args: list[str], cores: str) -> dict:
    """Run an ``inferlearn`` command pinned to ``cores``; the last metrics line of its run folder."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = ["taskset", "-c", cores, sys.executable, "-m", "inferlearn", *args, "--out", str(out), "--quiet"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])


def speedups(repeats: int, cores: str, limit: int | None) -> list[dict]:
    extra = ["--limit-train", str(limit)] if limit else []
    cases = {
        "data-parallel contrastive": ["train", "--data", "mnist", "--arch", ARCH, "--rule", "contrastive",
                                      "--batch-size", "100", "--epochs", "1", *extra],
        "data-parallel PC": ["train", "--data", "mnist", "--arch", ARCH, "--rule", "pc", "--batch-size", "100",
                             "--epochs", "1", *extra],
        "data-parallel contrastive, batch 1000": ["train", "--data", "mnist", "--arch", ARCH, "--rule", "contrastive",
                                                  "--batch-size", "1000", "--epochs", "1", *extra],
        "data-parallel PC, batch 1000": ["train", "--data", "mnist", "--arch", ARCH, "--rule", "pc",
                                         "--batch-size", "1000", "--epochs", "1", *extra],
        "block-parallel ADMM": ["admm", "--data", "mnist", "--arch", "784-256-256-10", "--epochs", "1",
                                "--z-schedule", "jacobi", *extra],
    }
    times = {(c, p): [] for c in cases for p in (1, 2)}
    accs = {}
    for _ in range(repeats):
        for case, args in cases.items():
            for p in (1, 2):
                m = run_cli(args + ["--nproc", str(p)], cores)
                times[(case, p)].append(m["epoch_seconds"])
                accs[(case, p)] = m["test_acc"]
    rows = []
    for case in cases:
        t1, t2 = statistics.median(times[(case, 1)]), statistics.median(times[(case, 2)])
        rows.append({"case": case, "t1": t1, "t2": t2, "speedup": t1 / t2, "acc1": accs[(case, 1)],
                     "acc2": accs[(case, 2)]})
    return rows


ALLREDUCE_WORKER = r"""
import datetime, json, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
out = {}
for n in [1024 * 4 ** k for k in range(8)]:          # 4 KiB ... 64 MiB of float32
    t = torch.ones(n)
    reps = 20 if n < 2 ** 20 else 5
    dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(t)
    out[n * 4] = (time.perf_counter() - t0) / reps
if dist.get_rank() == 0:
    json.dump(out, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def allreduce_curve(cores: str) -> dict[int, float]:
    from inferlearn.distributed.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        script, out = Path(tmp) / "w.py", Path(tmp) / "out.json"
        script.write_text(ALLREDUCE_WORKER)
        subprocess.run(["taskset", "-c", cores, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script), str(out)],
                       env=dict(os.environ, OMP_NUM_THREADS="1"), check=True, capture_output=True, timeout=600)
        return {int(k): v for k, v in json.loads(out.read_text()).items()}


def matmul_rate() -> float:
    """Flops per second of a 1024² float32 matmul on one thread (median of 5)."""
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * 1024 ** 3 / statistics.median(ts)


def mlp_macs(sizes: list[int]) -> int:
    return sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def model_speedup(rule_cost: float, sizes: list[int], batch: int, procs: int, alpha: float, bandwidth: float,
                  rate: float) -> float:
    compute = rule_cost * 6 * batch * mlp_macs(sizes) / rate
    nbytes = 4 * (mlp_macs(sizes) + sum(sizes[1:]))
    comm = 0.0 if procs == 1 else 2 * (procs - 1) * alpha + 2 * (procs - 1) / procs * nbytes / bandwidth
    return compute / (compute / procs + comm)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cores", default="0,1", help="cores every run is pinned to (taskset list; default %(default)s)")
    p.add_argument("--pause-pid", type=int, default=None,
                   help="a background process (e.g. a long reproduction) to stop while timing, and resume after")
    p.add_argument("--quick", action="store_true", help="5000 training images, one repeat (a smoke test)")
    args = p.parse_args()
    repeats = 1 if args.quick else args.repeats
    if args.pause_pid:
        os.kill(args.pause_pid, signal.SIGSTOP)
    try:
        rows = speedups(repeats, args.cores, 5000 if args.quick else None)
        curve = allreduce_curve(args.cores)
    finally:
        if args.pause_pid:
            os.kill(args.pause_pid, signal.SIGCONT)
    # latency from the small messages (median), bandwidth from the largest one: a least-squares line
    # through all sizes lets the large messages' noise set the intercept
    small = [curve[k] for k in sorted(curve) if k <= 64 * 2 ** 10]
    alpha = float(np.median(small))
    largest = max(curve)
    bandwidth = largest / max(curve[largest] - alpha, 1e-9)
    rate = matmul_rate()
    steps = 60000 // 100 if not args.quick else 50
    mlp = [int(v) for v in ARCH.split("-")]
    costs = {r["case"]: r["t1"] / steps / (6 * 100 * mlp_macs(mlp) / rate) for r in rows
             if "data" in r["case"] and "batch 1000" not in r["case"]}
    cmd = "OMP_NUM_THREADS=1 python benchmarks/bench_distributed.py" + (" --quick" if args.quick else
                                                                        f" --repeats {repeats}") + f" --cores {args.cores}"
    lines = ["# Data- and block-parallel training: speed-up and scaling model", "",
             f"Produced by `{cmd}` ({'5000 training images' if args.quick else 'one full MNIST epoch'} per run; every "
             f"run a fresh process group on loopback, pinned to cores {args.cores}, one thread per process, "
             f"interleaved, median of {repeats}; epoch time from the run's own metrics, start-up excluded).", "",
             "## Speed-up of 2 processes over 1", "",
             "| case | epoch s, 1 process | epoch s, 2 processes | speed-up | test acc 1 / 2 |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['t1']:.2f} | {r['t2']:.2f} | {r['speedup']:.2f}× | "
                     f"{r['acc1']:.4f} / {r['acc2']:.4f} |")
    lines += ["", "Data-parallel: MNIST MLP 784-64-64-64-10, global batch 100 (50 per process with 2) unless "
              "stated. "
              "Block-parallel ADMM: MLP 784-256-256-10 in 3 blocks (2 processes, balanced by parameter count: block 1 and blocks 2–3), batch mode, "
              "Jacobi Z schedule in both.", "",
             "## Loopback all-reduce (gloo, 2 processes)", "",
             "| message | seconds | effective GB/s |", "|---|---|---|"]
    for s in sorted(curve):
        lines.append(f"| {s / 2 ** 10:.0f} KiB | {curve[s]:.2e} | {s / curve[s] / 1e9:.2f} |")
    lines += ["", f"Model `t = α + bytes / bandwidth`: α = {alpha * 1e6:.0f} µs (median of the messages ≤ 64 KiB), "
              f"bandwidth = {bandwidth / 1e9:.2f} GB/s (the largest message). "
              f"Matmul rate (1024², one thread): {rate / 1e9:.0f} GFLOP/s.", "",
              "## Scaling model (data-parallel, ring all-reduce)", "",
              "Rule cost c (1-process step time ÷ back-propagation's flop floor, measured above): "
              + ", ".join(f"{k.split()[-1]} {v:.1f}" for k, v in costs.items()) + ". "
              "Predicted speed-up over 1 process at the loopback α and bandwidth; for machines on a network, "
              "put its bandwidth into the formula in this script's docstring.", ""]
    widths, batches, procs = (64, 256, 1024), (50, 100, 1000), (2, 4, 8, 16)
    c = costs.get("data-parallel contrastive", 3.0)
    lines += ["| contrastive, hidden width | global batch | " + " | ".join(f"P = {q}" for q in procs) + " |",
              "|---|---|" + "---|" * len(procs)]
    for w in widths:
        sizes = [784, w, w, w, 10]
        for b in batches:
            cells = [f"{model_speedup(c, sizes, b, q, alpha, bandwidth, rate):.1f}×" for q in procs]
            lines.append(f"| {w} | {b} | " + " | ".join(cells) + " |")
    lines += ["", "Where a row stops growing with P, communication per step (the weights' size, fixed) has caught "
              "up with compute per process (proportional to B/P): wider layers raise both, larger batches only "
              "compute, so data-parallel training pays at large batches.", "",
              "Block-parallel ADMM exchanges, per outer iteration and boundary, one gradient and one activation of "
              "the boundary width per sample (2 · N · d · 4 bytes: 131 MB for N = 60000, d = 256) against the "
              "blocks' Θ passes and Z updates; its speed-up is bounded by the largest block's share of the work "
              "(block 1, 784×256, holds 75 % of the parameters here).", ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distributed.md").write_text("\n".join(lines))
    plot(rows, curve, c, alpha, bandwidth, rate, RESULTS / "distributed.png")
    print("\n".join(lines))
    return 0


def plot(rows, curve, cost, alpha, bandwidth, rate, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    ax.bar([r["case"].replace(" ", "\n", 1) for r in rows], [r["speedup"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.axhline(2.0, color="gray", lw=0.8, ls="--")
    ax.set_ylabel("speed-up, 2 processes / 1")
    ax.set_title("measured (2 cores)")
    ax = axes[1]
    s = sorted(curve)
    ax.loglog([v / 2 ** 10 for v in s], [curve[v] for v in s], "o-")
    ax.set_xlabel("message KiB")
    ax.set_ylabel("all-reduce seconds")
    ax.set_title(f"gloo loopback: α {alpha * 1e6:.0f} µs, {bandwidth / 1e9:.1f} GB/s")
    ax = axes[2]
    procs = [1, 2, 4, 8, 16, 32]
    for w, b in ((64, 100), (64, 1000), (256, 100), (1024, 100), (1024, 1000)):
        sizes = [784, w, w, w, 10]
        ax.plot(procs, [model_speedup(cost, sizes, b, q, alpha, bandwidth, rate) for q in procs], "o-",
                label=f"width {w}, batch {b}")
    ax.plot(procs, procs, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("processes")
    ax.set_ylabel("predicted speed-up")
    ax.set_title("model: contrastive, ring all-reduce")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
