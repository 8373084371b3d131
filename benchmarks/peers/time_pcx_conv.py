"""Step time of inferlearn and PCX 0.6.3 on PCX's VGG-5 recipes, on one pinned core, one library after the other.

The benchmark's epoch times (``inferlearn benchmark vgg5-cifar10`` and ``bench_pcx_conv.py``) come from runs that
shared the machine with other work. This script times the two libraries on the *same* core, taking turns: for each
recipe (PCX's PC-CE, value nodes at its code's 1/B rate, and BP-CE; the benchmark's rows ``pcx-pc-ce-b`` and
``pcx-bp-ce`` at ``--budget``) and each repeat, ``--steps`` training steps of inferlearn, eager (``--compile off``)
and compiled (``--compile on``: ``torch.compile`` of the inference step, after one warm-up batch that compiles it),
then ``--steps`` of PCX in its own virtual environment (its jitted step; the first step, which compiles, is left
out). Both train on the benchmark's standardised, cropped and flipped colour CIFAR-10 (inferlearn on the first
``steps × 128`` images of its training split, PCX on the first ``steps`` batches of the epoch that
``bench_pcx_conv.export`` writes): other images of the same shape, which the time does not depend on. The
Markdown table gives the median over the repeats of the seconds per step, times 390 steps (one epoch), and the
ratio PCX / inferlearn for each inferlearn mode.

    taskset -c 0 python benchmarks/peers/time_pcx_conv.py --steps 60 --repeats 3 --data-dir DIR --allow-unverified \\
        --out benchmarks/results/pcx_conv_time.md

The PCX venv is ``bench_pcx.py``'s (``--venv``, created there on first use).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from inferlearn.benchmark import PROTOCOLS, parse_budget
from inferlearn.benchmark.pcx_recipes import PCX_VGG5
from inferlearn.benchmark.runner import run_config
from inferlearn.benchmark.settings import Settings
from inferlearn.engine.compiled import compiled_calls, compiling
from inferlearn.training import build
from inferlearn.training.loop import run_epoch

from bench_pcx import _same_model
from bench_pcx_conv import DEFAULT_VENV, HERE, export, worker_args

EPOCH_STEPS = 390   # 50,000 images in batches of 128, PCX's loader (the last partial batch dropped)
ROWS = (("pc-ce", "pcx-pc-ce-b"), ("bp-ce", "pcx-bp-ce"))   # PCX's recipe, the benchmark's row of it


def inferlearn_seconds(config, steps: int, mode: str, row: str) -> float:
    """Seconds per step of ``steps`` training steps of ``config``, after one warm-up batch in the same mode; compiled,
    both train the row's first model object (``bench_pcx._same_model``), so the timed steps compile nothing."""
    times = []
    for n in (1, steps):   # the warm-up batch, then the timed steps
        cfg = dataclasses.replace(config, limit_train=128 * n)
        s = build(cfg)
        if mode == "on":
            s = _same_model(s, cfg, ("vgg5", row, 128))
        with compiling(mode):
            t0 = time.perf_counter()
            run_epoch(s, cfg, 1, progress=False)
            times.append(time.perf_counter() - t0)
    return times[1] / steps


def pcx_seconds(python: Path, data: Path, recipe, width: float, steps: int, cpu: str) -> float:
    """Seconds per step of PCX's jitted step over ``steps`` steps (the first, compiling, step left out)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(python), str(HERE / "pcx_conv_worker.py"), "--data", str(data), "--out", str(out),
               "--steps", str(steps), *worker_args(recipe, "vgg5", width, 1, 0)]
        subprocess.run(["taskset", "-c", cpu, *cmd], env=env, check=True, stderr=subprocess.DEVNULL)
        result = json.loads(out.read_text())
    return result["epoch_seconds"][0] / (steps - 1)


def table(times: dict, steps: int, repeats: int, command: str, calls: dict) -> str:
    lines = ["# inferlearn and PCX on one pinned core: VGG-5 step time", "",
             f"`{command}`", "",
             f"PCX's VGG-5 recipes at the CPU budget (`vgg5:width=0.125`, batch 128, colour CIFAR-10), one core and one "
             f"thread for each library, taking turns on that core; median over {repeats} repeats of {steps} steps, "
             f"as seconds per epoch of {EPOCH_STEPS} steps. Read the ratios: absolute times move with the load on the "
             "machine's other cores, which falls on both libraries alike.", "",
             "| recipe (benchmark row) | inferlearn eager | inferlearn compiled | PCX 0.6.3 | PCX / eager | PCX / compiled |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in ROWS:
        t = {k: statistics.median(v) * EPOCH_STEPS for k, v in times[name].items()}
        compiled = f"{t['compiled']:.1f} s" if calls[name] else "no compiled step"
        lines.append(f"| {name} (`{row}`) | {t['eager']:.1f} s | {compiled} | {t['pcx']:.1f} s | "
                     f"{t['pcx'] / t['eager']:.2f}× | " + (f"{t['pcx'] / t['compiled']:.2f}× |" if calls[name] else "— |"))
    lines += ["", "Every repeat (seconds per step): " + "; ".join(
        f"{name} {k} " + ", ".join(f"{x:.4f}" for x in v) for name, _ in ROWS for k, v in times[name].items()), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="training steps timed per library, recipe and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", default="cpu")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-unverified", action="store_true")
    p.add_argument("--venv", default=DEFAULT_VENV)
    p.add_argument("--out", default=None, help="the Markdown table (default: printed only)")
    a = p.parse_args(argv)
    if a.steps < 2 or a.repeats < 1:
        raise SystemExit(f"time_pcx_conv.py: --steps {a.steps} / --repeats {a.repeats}: give --steps ≥ 2, --repeats ≥ 1")
    python = Path(os.path.expanduser(a.venv)) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"time_pcx_conv.py: no PCX venv at {a.venv}; create it with benchmarks/peers/bench_pcx.py")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) != 1:
        raise SystemExit(f"time_pcx_conv.py: runs on one core, and has {len(cores)}; start it with taskset -c N")
    torch.set_num_threads(1)
    protocol = PROTOCOLS["vgg5-cifar10"]
    budget = parse_budget(a.budget, protocol)
    recipes = {r.name: r for r in PCX_VGG5}
    variants = {v.name: v for v in protocol.variants}
    command = "taskset -c N python benchmarks/peers/time_pcx_conv.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(out=tmp, budget=budget, seeds=1, data_dir=a.data_dir, allow_unverified=a.allow_unverified)
        configs = {name: run_config(protocol, variants[row], {}, 0, False, settings) for name, row in ROWS}
        data = Path(tmp) / "seed0.npz"
        export(data, 0, configs["pc-ce"].arch, 1, 128, a.data_dir, a.allow_unverified)
        times = {name: {"eager": [], "compiled": [], "pcx": []} for name, _ in ROWS}
        calls = {}
        for r in range(a.repeats):
            for name, _ in ROWS:
                times[name]["eager"].append(inferlearn_seconds(configs[name], a.steps, "off", name))
                before = compiled_calls()
                times[name]["compiled"].append(inferlearn_seconds(configs[name], a.steps, "on", name))
                calls[name] = compiled_calls() > before
                times[name]["pcx"].append(pcx_seconds(python, data, recipes[name], budget.width, a.steps, str(cores[0])))
                print(f"repeat {r + 1}/{a.repeats} {name}: " + ", ".join(f"{k} {v[-1]:.4f} s/step"
                                                                       for k, v in times[name].items()), flush=True)
    text = table(times, a.steps, a.repeats, command, calls)
    print(text)
    if a.out:
        tmp_out = Path(a.out + ".tmp")
        tmp_out.write_text(text)
        os.replace(tmp_out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
