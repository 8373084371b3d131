"""PCX itself beside inferlearn's conv benchmark: PCX's VGG-5 / VGG-7 recipes run in PCX 0.6.3, at the benchmark's budget.

For each seed the driver builds the final run's data exactly as ``inferlearn benchmark`` does
(:func:`inferlearn.training.build`: colour CIFAR-10, standardised per channel with the training split's statistics,
the crop/flip generator of that seed) and exports, for every epoch, inferlearn's batch order and its crop/flip
draws; ``pcx_conv_worker.py`` then trains PCX's own network (PCX's initialisation) on those images in that order,
with PCX's training step and the recipe's hyper-parameters (``inferlearn.benchmark.pcx_recipes.PCX_VGG5`` /
``PCX_VGG7``, the files of PCX's benchmark), in PCX's own virtual environment pinned to one core with one XLA
thread. The results go into the benchmark folder as ``pcx.json``, which the benchmark's table shows as the column
"PCX, this budget" beside the row of the same recipe (the next ``inferlearn benchmark`` run into that folder, which
skips its finished runs, rewrites the table).

Rows: a PC recipe is PCX's code, so its value-node rate acts per sample as rate/B: it stands beside inferlearn's
``pcx-NAME-b`` row; a BP recipe beside ``pcx-NAME``.

    python benchmarks/peers/bench_pcx_conv.py --protocol vgg5-cifar10 --methods bp-ce,pc-ce --seeds 3 \
        --out runs/benchmark/vgg5-cifar10-cpu --data-dir DIR --allow-unverified --cpu 0

Every run's result is kept under ``OUT/pcx/NAME/seedK.json`` and skipped when present (an interrupted study resumes);
the seeds that an earlier ``OUT/pcx.json`` records and whose files are gone stay in their rows (:func:`merged_row`):
copy a committed ``pcx.json`` into ``OUT`` and ``--seeds 3`` trains only the seeds it lacks.
The PCX virtual environment is ``bench_pcx.py``'s (``--venv``, created there on first use).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from inferlearn.benchmark import PROTOCOLS, parse_budget
from inferlearn.benchmark.pcx_recipes import PCX_VGG5, PCX_VGG7
from inferlearn.benchmark.protocols import scaled_epochs
from inferlearn.training import build
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import batch_order

HERE = Path(__file__).resolve().parent
DEFAULT_VENV = "~/.cache/inferlearn/peers/pcx-venv"
RECIPES = {"vgg5-cifar10": ("vgg5", PCX_VGG5), "vgg7-cifar10": ("vgg7", PCX_VGG7)}


def export(path: Path, seed: int, arch: str, epochs: int, batch: int, data_dir: str | None, unverified: bool) -> None:
    """The final run's arrays of ``seed`` as inferlearn's benchmark builds them, with each epoch's order and draws."""
    cfg = TrainConfig(data="cifar10", arch=arch, seed=seed, val_size=0, standardize="on", augment="crop-flip",
                      batch_size=batch, data_dir=data_dir, allow_unverified=unverified, out=str(path.parent / "unused"))
    s = build(cfg.resolved())
    n = s.train_x.shape[0]
    arrays = {"train_x": s.train_x.reshape(n, 3, 32, 32).numpy(), "train_y": s.train_y.numpy(),
              "test_x": s.test_x.reshape(-1, 3, 32, 32).numpy(), "test_y": s.test_y.numpy(),
              "fill": s.augment.fill.numpy().astype(np.float32)}
    for epoch in range(1, epochs + 1):   # the training loop's order of draws: one draw per batch, in batch order
        order = batch_order(n, seed, epoch).numpy()
        draws = [s.augment.draw(len(order[i:i + batch])) for i in range(0, n, batch)]
        arrays[f"order_{epoch}"] = order
        for k, name in enumerate(("dy", "dx", "flip")):
            arrays[f"{name}_{epoch}"] = np.concatenate([d[k].numpy() for d in draws])
    np.savez(path, **arrays)


def worker_args(recipe, model: str, width: float, epochs: int, seed: int) -> list[str]:
    args = ["--model", model, "--width", f"{width:g}", "--epochs", str(epochs), "--seed", str(seed),
            "--w-lr", repr(recipe.w_lr), "--wd", repr(recipe.wd), "--act", recipe.act]
    if recipe.steps:
        args += ["--method", "pc", "--T", str(recipe.steps), "--x-lr", repr(recipe.x_lr),
                 "--x-momentum", repr(recipe.x_momentum)]
        if recipe.betas:   # the nudged recipes: β per epoch, the weight gradient × 1/β
            args += ["--betas", ",".join(repr(b) for b in recipe.betas[:epochs])]
    else:
        args += ["--method", "bp"]
    return args + (["--ce"] if recipe.ce else [])


def merged_row(runs: list[dict], earlier: dict | None, epochs: int) -> dict:
    """A recipe's row of ``pcx.json`` from its per-seed result files, in seed order; a seed the files lack but the
    earlier ``pcx.json`` row records (its folder gone, its table kept) is taken from that row, so that a study is
    continued from the committed file alone (as ``inferlearn benchmark --reuse``)."""
    seeds = {r["args"]["seed"]: {"test_acc": r["test_acc"][-1], "best_test_acc": max(r["test_acc"]),
                                 "epoch_seconds": list(r["epoch_seconds"]), "compile_s": r["compile_s"]} for r in runs}
    for i, seed in enumerate((earlier or {}).get("seeds", [])):
        if seed not in seeds:
            seeds[seed] = {"test_acc": earlier["test_acc"][i], "best_test_acc": earlier["best_test_acc"][i],
                           "epoch_seconds": earlier["epoch_seconds"][i * epochs:(i + 1) * epochs],
                           "compile_s": earlier["compile_s"][i]}
    order = sorted(seeds)
    return {"test_acc": [seeds[k]["test_acc"] for k in order], "best_test_acc": [seeds[k]["best_test_acc"] for k in order],
            "epoch_seconds": [t for k in order for t in seeds[k]["epoch_seconds"]],
            "compile_s": [seeds[k]["compile_s"] for k in order], "seeds": order}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--protocol", choices=sorted(RECIPES), default="vgg5-cifar10")
    p.add_argument("--budget", default="cpu", help="the benchmark's budget (its width and epochs)")
    p.add_argument("--methods", default="bp-ce,pc-ce", help="PCX recipes by name (bp-se, bp-ce, pc-se, pc-ce, pc-pn, pc-nn, "
                   "pc-cn)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", required=True, help="the benchmark's folder (pcx.json and pcx/ go there)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-unverified", action="store_true")
    p.add_argument("--venv", default=DEFAULT_VENV)
    p.add_argument("--cpu", type=int, default=0, help="the core PCX is pinned to")
    a = p.parse_args(argv)
    protocol = PROTOCOLS[a.protocol]
    budget = parse_budget(a.budget, protocol)
    model, recipes = RECIPES[a.protocol]
    by_name = {r.name: r for r in recipes}
    unknown = [m for m in a.methods.split(",") if m not in by_name]
    if unknown:
        raise SystemExit(f"bench_pcx_conv.py: unknown --methods {unknown}; choose from {sorted(by_name)}")
    python = Path(os.path.expanduser(a.venv)) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"bench_pcx_conv.py: no PCX venv at {a.venv}; create it with benchmarks/peers/bench_pcx.py "
                         "(it installs pcx==0.6.3 there on first use)")
    epochs = scaled_epochs(int(protocol.train["epochs"]), budget.epochs)
    width = budget.width
    arch = f"{model}:width={width:g}"
    out = Path(a.out)
    env = dict(os.environ, OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    earlier = json.loads((out / "pcx.json").read_text()) if (out / "pcx.json").exists() else {}

    def key(name: str) -> str:
        return f"pcx-{name}-b" if by_name[name].steps else f"pcx-{name}"

    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            data = Path(tmp) / f"seed{seed}.npz"
            for name in a.methods.split(","):
                result = out / "pcx" / name / f"seed{seed}.json"
                if result.exists() or seed in earlier.get("variants", {}).get(key(name), {}).get("seeds", []):
                    print(f"pcx {name} seed {seed}: finished earlier ({'its file' if result.exists() else 'pcx.json'}), "
                          "skipped")
                    continue
                if not data.exists():
                    export(data, seed, arch, epochs, 128, a.data_dir, a.allow_unverified)
                result.parent.mkdir(parents=True, exist_ok=True)
                cmd = [str(python), str(HERE / "pcx_conv_worker.py"), "--data", str(data), "--out", str(result) + ".tmp",
                       *worker_args(by_name[name], model, width, epochs, seed)]
                print(f"pcx {name} seed {seed}: {' '.join(cmd[2:])}", flush=True)
                subprocess.run(["taskset", "-c", str(a.cpu), *cmd], env=env, check=True)
                os.replace(str(result) + ".tmp", result)
    rows = {}
    for name in a.methods.split(","):
        runs = [json.loads(f.read_text()) for f in sorted((out / "pcx" / name).glob("seed*.json"))]
        rows[key(name)] = merged_row(runs, earlier.get("variants", {}).get(key(name)), epochs)
    command = "python benchmarks/peers/bench_pcx_conv.py " + " ".join(sys.argv[1:] if argv is None else argv)
    commands = earlier.get("commands", [earlier["command"]] if "command" in earlier else [])   # every run's, in order
    versions = next((json.loads(f.read_text())["versions"] for f in (out / "pcx").glob("*/seed*.json")), {})
    tmp = out / "pcx.json.tmp"
    tmp.write_text(json.dumps({"variants": {**earlier.get("variants", {}), **rows}, "versions": versions,
                               "width": width, "epochs": epochs,
                               "commands": commands + [command] if command not in commands else commands}, indent=1))
    os.replace(tmp, out / "pcx.json")
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
