"""Predictive coding on deep residual MLPs (μPC): test accuracy against depth, PC vs BP vs the plain chain.

μPC (Innocenti, Achour, Buckley, NeurIPS 2025, arXiv:2505.13124) trains residual MLPs of 100+ layers with
predictive coding by putting the value nodes on the residual stream and scaling every branch
(``a_l = 1/√(N L)``, input ``1/√D``, readout ``1/N``, ``W ~ N(0, 1)``, no biases): the zoo model
``resmlp:depth=H,width=128,param=mupc`` (``plain=true``: the same chain without skips). We train, on MNIST,
width 128 with H = 8, 32 and 64 hidden layers:

* ``bp``       back-propagation on ``resmlp mupc`` (quadratic loss, as predictive coding's output term);
* ``pc``       predictive coding (``--rule pc``, T = H + 1 inference steps of size η) on ``resmlp mupc``;
* ``pc-plain`` predictive coding on the plain chain (``plain=true``, T = H + 1 too);

all with Adam, batch 64, seed 0, the **same hyper-parameters at every depth** (μPC's claim is that they
transfer across depth). They are chosen first by a small seeded search on a validation split
(``--val 2000``: the last 2000 of the used training images held out; the test split is not used to choose):
PC over η × Adam lr, BP over Adam lr, at depth 8 (3 epochs); with ``--search-depths 8,32`` the best few PC
settings and every BP rate are checked again at depth 32 (2 epochs) and the setting with the best mean
validation accuracy over the depths where it ran wins.

Deviation from the issue's protocol: one PC batch at depth 64 (T = 65) costs ~90 BP batches on one core,
so every run uses the **first 10 000 training images** (``--limit-train 10000``; the full 10 000-image test
split) for 5 epochs, not the full 60 000 (``--epochs-at 64=E`` gives all depth-64 runs fewer epochs).

Every run is one ``inferlearn train`` command (pinned to one core, ``--threads 1``) writing its own folder
``benchmarks/results/depth/<stage>/<name>`` (``metrics.jsonl``, ``config.json``); an interrupted run is
continued with ``--resume`` and a finished one is skipped, so ``--run`` can be repeated. Without ``--run``
the script only reads the folders and writes ``benchmarks/results/depth.md`` (tables, commands, search)
and ``benchmarks/results/depth.png`` (test accuracy against depth, one line per method).

Usage::

    export INFERLEARN_DATA=/work/shared/data OMP_NUM_THREADS=1
    python benchmarks/bench_depth.py --run --jobs 2 --epochs-at 64=3   # search, final runs, summary (~50 min, 2 cores)
    python benchmarks/bench_depth.py --run --stage search    # only the validation search
    python benchmarks/bench_depth.py --run --stage final --eta 0.1 --lr-pc 0.01 --lr-bp 0.01   # fixed settings
    python benchmarks/bench_depth.py --run --stage investigate --investigate "64:pc:steps=130,step_size=0.1"
    python benchmarks/bench_depth.py --alignment --epochs-at 64=3      # PC's gradient vs BP's (a few minutes)
    python benchmarks/bench_depth.py --epochs-at 64=3        # summarise the existing folders only
    python benchmarks/bench_depth.py --epc --run --jobs 1 --cores 1   # ePC, full MNIST, depth 8-128 (depth_epc.py)

The committed results: depth 64 at 3 epochs (``--epochs-at 64=3``, every method), depth 8 and 32 at 5; the
final runs were spread over the two cores with ``--cores``, ``--depths`` and ``--methods``.
``--alignment`` measures, at initialisation and at the final PC runs' checkpoints, the cosine of PC's weight
gradient with back-propagation's and how many layers get any PC gradient at all.

``--investigate DEPTH:METHOD:KEY=VAL,...`` trains extra variants (``steps``, ``step_size``, ``lr``,
``epochs``, ``seed``) at the final settings otherwise; they are listed in their own table.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "depth"
CLI = [sys.executable, "-m", "inferlearn"]

DEPTHS = (8, 32, 64)
WIDTH = 128
BATCH = 64
LIMIT_TRAIN = 10_000
EPOCHS = 5
METHODS = ("bp", "pc", "pc-plain")
LABELS = {"bp": "BP (resmlp μPC)", "pc": "PC (resmlp μPC)", "pc-plain": "PC, plain chain (no skips)"}

# the validation search
SEARCH_VAL = 2000
SEARCH_ETAS = (0.5 / BATCH, 0.05, 0.1, 0.2)   # 0.5/64: μPC's SGD rate 0.5 on the batch-mean energy, per sample
SEARCH_PC_LRS = (0.003, 0.01, 0.03)
SEARCH_BP_LRS = (0.001, 0.01, 0.1)
SEARCH_EPOCHS = {8: 3, 32: 2}
SEARCH_TOP = 3                                # PC settings of depth 8 rechecked at depth 32


# ---------------------------------------------------------------------------------------------- runs
def arch(depth: int, plain: bool = False) -> str:
    return f"resmlp:depth={depth},width={WIDTH},param=mupc" + (",plain=true" if plain else "")


def fmt(x: float) -> str:
    return f"{x:.6g}"


def run_spec(stage: str, depth: int, method: str, *, lr: float, eta: float | None = None,
             steps: int | None = None, epochs: int, seed: int = 0, val: int = 0, tag: str = "") -> dict:
    """One training run: its folder name and its ``inferlearn train`` arguments."""
    pc = method != "bp"
    steps = steps if steps is not None else depth + 1
    name = f"d{depth}-{method}" + (f"-eta{fmt(eta)}-T{steps}" if pc else "") + f"-lr{fmt(lr)}-s{seed}" + tag
    args = ["train", "--data", "mnist", "--arch", arch(depth, method == "pc-plain"),
            "--rule", "pc" if pc else "backprop"]
    if pc:
        args += ["--rule-opt", f"steps={steps}", "--rule-opt", f"step_size={fmt(eta)}"]
    args += ["--optimizer", "adam", "--lr", fmt(lr), "--batch-size", str(BATCH), "--epochs", str(epochs),
             "--limit-train", str(LIMIT_TRAIN), "--seed", str(seed), "--threads", "1", "--quiet"]
    if val:
        args += ["--val", str(val)]
    out = OUT / stage / name
    args += ["--out", str(out.relative_to(ROOT))]
    return dict(stage=stage, name=name, depth=depth, method=method, lr=lr, eta=eta if pc else None,
                steps=steps if pc else None, epochs=epochs, seed=seed, val=val, out=out, args=args)


def command(spec: dict) -> str:
    return "inferlearn " + " ".join(shlex.quote(a) for a in spec["args"])


def metrics(out: Path) -> list[dict]:
    f = out / "metrics.jsonl"
    if not f.exists():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def cost(spec: dict) -> float:
    """Rough relative cost, to start the longest runs first."""
    L = spec["depth"] + 1
    return spec["epochs"] * L * ((spec["steps"] or 0) + 2)


def execute(spec: dict, core: int | None) -> str:
    """Run (or resume, or skip) one spec on one core; returns a status line."""
    out, done = spec["out"], metrics(spec["out"])
    if len(done) >= spec["epochs"]:
        return f"skip  {spec['name']} ({len(done)} epochs there)"
    if failed(spec):
        return f"skip  {spec['name']} (failed before: {log_path(spec).name}; delete it to retry)"
    if done and (out / "checkpoint.pt").exists():
        args = ["train", "--resume", str(out.relative_to(ROOT)), "--epochs", str(spec["epochs"]), "--quiet"]
    else:
        args = spec["args"] + (["--overwrite"] if out.exists() else [])
    pin = ["taskset", "-c", str(core)] if core is not None else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = log_path(spec)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as fh:
        rc = subprocess.call(pin + CLI + args, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        fh.write(f"\nexit status {rc}\n")
    tail = log.read_text().strip().splitlines()[-2:-1] or [""]
    return f"rc={rc} {spec['name']} {time.time() - t0:.0f}s  {tail[0][:140]}"


def log_path(spec: dict) -> Path:
    return OUT / "logs" / f"{spec['stage']}-{spec['name']}.log"


def failed(spec: dict) -> bool:
    """The run's last attempt exited non-zero (e.g. diverged): not retried, reported as it is."""
    log = log_path(spec)
    return log.exists() and "exit status 0" not in log.read_text() and "exit status" in log.read_text()


def run_all(specs: list[dict], cores: list[int]) -> None:
    """Run specs, longest first, one worker per core of ``cores``, each run pinned to its worker's core."""
    q: queue.Queue = queue.Queue()
    for s in sorted(specs, key=cost, reverse=True):
        q.put(s)

    def worker(core: int) -> None:
        while True:
            try:
                s = q.get_nowait()
            except queue.Empty:
                return
            print(f"[core {core}] {execute(s, core)}", flush=True)

    threads = [threading.Thread(target=worker, args=(c,)) for c in cores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -------------------------------------------------------------------------------------------- search
def search_specs(stage_depth: int, pc_settings=None, bp_lrs=SEARCH_BP_LRS) -> list[dict]:
    ep = SEARCH_EPOCHS[stage_depth]
    pcs = pc_settings if pc_settings is not None else [(e, lr) for e in SEARCH_ETAS for lr in SEARCH_PC_LRS]
    return ([run_spec("search", stage_depth, "pc", lr=lr, eta=e, epochs=ep, val=SEARCH_VAL) for e, lr in pcs]
            + [run_spec("search", stage_depth, "bp", lr=lr, epochs=ep, val=SEARCH_VAL) for lr in bp_lrs])


def search_rows() -> list[dict]:
    rows = []
    for d in sorted(SEARCH_EPOCHS):
        for spec in search_specs(d):
            m = metrics(spec["out"])
            bad = failed(spec)
            if m and len(m) >= spec["epochs"] and not bad:
                rows.append(dict(spec, val_acc=m[-1].get("val_acc", float("nan")), n=len(m), diverged=False))
            elif bad:                       # failed (diverged): scores 0
                rows.append(dict(spec, val_acc=0.0, n=len(m), diverged=True))
    return rows


def top_pc(rows: list[dict], depth: int, k: int) -> list[tuple[float, float]]:
    pcs = sorted((r for r in rows if r["depth"] == depth and r["method"] == "pc"), key=lambda r: -r["val_acc"])
    return [(r["eta"], r["lr"]) for r in pcs[:k]]


def choose(rows: list[dict]) -> dict:
    """Best mean validation accuracy over the search depths where a setting ran at every depth."""
    def best(method: str, key) -> tuple | None:
        by: dict = {}
        for r in rows:
            if r["method"] == method:
                by.setdefault(key(r), {})[r["depth"]] = r["val_acc"]
        if not by:
            return None
        deepest = max(len(v) for v in by.values())
        cands = {k: statistics.mean(v.values()) for k, v in by.items() if len(v) == deepest}
        return max(cands, key=cands.get)
    pc = best("pc", lambda r: (r["eta"], r["lr"]))
    bp = best("bp", lambda r: r["lr"])
    return dict(eta=pc[0] if pc else None, lr_pc=pc[1] if pc else None, lr_bp=bp)


# --------------------------------------------------------------------------------------------- final
def final_specs(ch: dict, epochs_at: dict[int, int], seeds: list[int], depths=DEPTHS) -> list[dict]:
    specs = []
    for d in depths:
        ep = epochs_at.get(d, EPOCHS)
        for s in seeds:
            specs.append(run_spec("final", d, "bp", lr=ch["lr_bp"], epochs=ep, seed=s))
            specs.append(run_spec("final", d, "pc", lr=ch["lr_pc"], eta=ch["eta"], epochs=ep, seed=s))
            specs.append(run_spec("final", d, "pc-plain", lr=ch["lr_pc"], eta=ch["eta"], epochs=ep, seed=s))
    return specs


def investigate_specs(items: list[str], ch: dict, epochs_at: dict[int, int]) -> list[dict]:
    specs = []
    for item in items:
        d, method, opts = (item.split(":", 2) + [""])[:3]
        d = int(d)
        kv = dict(o.split("=", 1) for o in opts.split(",") if o)
        pc = method != "bp"
        steps = int(kv["steps"]) if "steps" in kv else None
        eta = float(kv.get("step_size", ch["eta"])) if pc else None
        lr = float(kv.get("lr", ch["lr_pc"] if pc else ch["lr_bp"]))
        specs.append(run_spec("investigate", d, method, lr=lr, eta=eta, steps=steps,
                              epochs=int(kv.get("epochs", epochs_at.get(d, EPOCHS))), seed=int(kv.get("seed", 0))))
    return specs


def summarise_run(out: Path) -> dict | None:
    m = metrics(out)
    if not m:
        return None
    cfg = json.loads((out / "config.json").read_text()) if (out / "config.json").exists() else {}
    secs = [r["epoch_seconds"] for r in m if "epoch_seconds" in r]
    return dict(final=m[-1]["test_acc"], best=max(r["test_acc"] for r in m), epochs=len(m),
                epoch_s=statistics.median(secs) if secs else float("nan"), curve=[r["test_acc"] for r in m],
                train=m[-1].get("train_acc"), cfg=cfg)


# ----------------------------------------------------------------------------------------- alignment
ALIGN = OUT / "alignment.json"


def alignment(ch: dict, batches: int = 2, mults=(1, 2, 4)) -> None:
    """Cosine between PC's weight gradient (T = m (H + 1) steps of the chosen η) and back-propagation's.

    For each depth, skip and plain, at initialisation and, where a final PC run's checkpoint is there, at its
    trained weights: the cosine of the whole gradient and of the first, middle and last layer's, averaged over
    ``batches`` mini-batches of 64 training images. Saved to ``results/depth/alignment.json``.
    """
    import torch

    from inferlearn.data import load_dataset
    from inferlearn.models.residual_mlp import ResidualMLP
    from inferlearn.rules.base import make_rule

    torch.set_num_threads(1)
    ds = load_dataset("mnist")
    gen = torch.Generator().manual_seed(0)
    idx = torch.randperm(LIMIT_TRAIN, generator=gen)[:batches * BATCH].view(batches, BATCH)

    def grads(model, rule, x, y):
        model.zero_grad()
        rule.backward(model, x, y)
        return [p.grad.detach().clone() for p in model.parameters()]

    def cos(a, b):
        return float(torch.dot(a.flatten(), b.flatten()) / (a.norm() * b.norm() + 1e-30))

    rows = []
    for d in DEPTHS:
        for plain in (False, True):
            method = "pc-plain" if plain else "pc"
            states = [("init", None)]
            ck = run_spec("final", d, method, lr=ch["lr_pc"], eta=ch["eta"], epochs=1)["out"] / "checkpoint.pt"
            if ck.exists():
                states.append((f"trained ({len(metrics(ck.parent))} epochs)", ck))
            if not plain:    # float64 at T = H + 1: are the zero gradients of float32 round-off (absorption)?
                states.append(("init, float64", None))
            for state, path in states:
                dtype = torch.float64 if "float64" in state else torch.float32
                model = ResidualMLP(784, 10, depth=d, width=WIDTH, param="mupc", plain=plain, seed=0).to(dtype)
                if path is not None:
                    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"])
                bp = make_rule("backprop")
                for m in (mults[:1] if dtype == torch.float64 else mults):
                    pc = make_rule("pc", {"steps": str(m * (d + 1)), "step_size": str(ch["eta"])})
                    acc = {k: [] for k in ("all", "first", "middle", "last", "r_first", "r_middle", "r_last",
                                           "reached")}
                    t0 = time.time()
                    for b in range(batches):
                        x, y = ds.train_x[idx[b]].to(dtype), ds.train_y[idx[b]]
                        gb, gp = grads(model, bp, x, y), grads(model, pc, x, y)
                        acc["all"].append(cos(torch.cat([g.flatten() for g in gb]), torch.cat([g.flatten() for g in gp])))
                        for k, i in (("first", 0), ("middle", len(gb) // 2), ("last", len(gb) - 1)):
                            acc[k].append(cos(gb[i], gp[i]))
                            acc["r_" + k].append(float(gp[i].norm() / (gb[i].norm() + 1e-30)))
                        acc["reached"].append(sum(bool(g.abs().max() > 0) for g in gp))
                    rows.append(dict(depth=d, method=method, state=state, steps=m * (d + 1), eta=ch["eta"],
                                     seconds=(time.time() - t0) / batches,
                                     **{k: (statistics.mean(v) if k[0] != "r" else statistics.median(v))
                                        for k, v in acc.items()}))
                    print(rows[-1], flush=True)
    ALIGN.write_text(json.dumps(rows, indent=1))


def alignment_lines() -> list[str]:
    if not ALIGN.exists():
        return []
    rows = json.loads(ALIGN.read_text())
    lines = ["", "## PC's weight gradient against back-propagation's", "",
             "Cosine between the PC gradient (η as chosen, T inference steps from the forward pass, output clamped "
             "to the one-hot label) and the back-propagated gradient of the quadratic loss, on the same mini-batch "
             f"(mean over {2} batches of {BATCH} training images), whole gradient and the first / middle / last "
             "weight layer, and the norm ratio ‖g_PC‖ / ‖g_BP‖ of those layers (median over the batches; with Adam "
             "the direction per parameter matters more than the scale); at initialisation and at the final PC run's "
             "trained weights (its checkpoint); `reached` = how many of the L = H + 1 weight layers get a non-zero "
             "PC gradient at all (the rest are exactly 0 and Adam leaves them at their initial values). "
             "`python benchmarks/bench_depth.py --alignment` makes it (`results/depth/alignment.json`). "
             "A trained model whose units all died (the plain chain at H = 8 collapsed to chance in epoch 3-4) "
             "gets no gradient from either rule (cosines shown as 0).", ""]
    reach = {r["depth"]: r for r in rows if r["method"] == "pc" and r["state"] == "init" and r["steps"] == r["depth"] + 1}
    reach64 = {r["depth"]: r for r in rows if r["method"] == "pc" and r["state"] == "init, float64"}
    if reach:
        lines += ["**Reading.** The value nodes start at the forward pass, where every hidden error is 0; each "
                  "simultaneous gradient step carries the output error one node further down, so after T steps "
                  "node H − k has moved by about C(T, k) η^k times the output error. For the bottom nodes of a deep "
                  "chain that is far below float32 resolution of O(1) activities: `z − f(z)` is exactly 0 there, the "
                  "layer's weight gradient is exactly 0, and Adam leaves it at its initial value. At T = H + 1 and "
                  "the chosen η the number of weight layers with a non-zero PC gradient at initialisation is "
                  + ", ".join(f"{r['reached']:g} of {d + 1} at H = {d}" + (
                      f" ({reach64[d]['reached']:g} in float64)" if d in reach64 else "")
                      for d, r in sorted(reach.items()))
                  + "; the input projection `W_1` gets no gradient at H = 32 below 4(H + 1) steps, and none at H = 64 "
                  "even at 4(H + 1) = 260 steps. So PC at depth 64 trains its top layers on a frozen random bottom "
                  "(input projection and lower residual blocks). Where a layer does get a gradient its direction "
                  "is close to BP's (cosine ≈ 0.95–1 at initialisation), but its scale falls geometrically with "
                  "distance from the output (ratio columns); the whole-gradient cosine is dominated by the readout.",
                  ""]
    lines += ["| depth | model | weights | T | cos (all) | cos first | cos middle | cos last | "
              "ratio first | ratio middle | ratio last | reached | s / batch |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['depth']} | {'plain' if r['method'] == 'pc-plain' else 'residual'} | {r['state']} | "
                     f"{r['steps']} | {r['all']:.3f} | {r['first']:.3f} | {r['middle']:.3f} | {r['last']:.3f} | "
                     f"{r['r_first']:.2g} | {r['r_middle']:.2g} | {r['r_last']:.2g} | "
                     f"{r['reached']:g} / {r['depth'] + 1} | {r['seconds']:.2f} |")
    return lines


# ------------------------------------------------------------------------------------------- writing
def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def write_summary(ch: dict, epochs_at: dict[int, int], seeds: list[int], cmdline: str) -> None:
    rows = search_rows()
    lines = ["# Predictive coding on deep residual MLPs (μPC): accuracy against depth", "",
             f"Made by `{cmdline}` (`benchmarks/bench_depth.py`; run folders under `benchmarks/results/depth/`).", "",
             f"MNIST, residual MLP of width {WIDTH} with H hidden layers in μPC's parameterisation "
             f"(`--arch {arch(0).replace('depth=0', 'depth=H')}`; `,plain=true` for the chain without skips), "
             f"Adam, batch {BATCH}, quadratic loss (BP) / clamped one-hot output (PC), PC with T = H + 1 "
             "inference steps, the same hyper-parameters at every depth.", "",
             f"**Deviation from the protocol:** every run trains on the **first {LIMIT_TRAIN:,} MNIST training "
             "images** (`--limit-train 10000`), not the full 60 000: at depth 64 one PC batch (T = 65) costs "
             "about 90 BP batches on one core, so full-data epochs were out of reach on the shared 2-core "
             "machine. Test accuracy is on the full 10 000-image test split."]
    short = {d: e for d, e in epochs_at.items() if e != EPOCHS}
    lines += [""] + ([f"Epochs: {EPOCHS}, except depth {', '.join(f'{d}: {e}' for d, e in short.items())} "
                      "(all methods at that depth equally), to fit the time budget."] if short else
                     [f"Epochs: {EPOCHS} at every depth."])
    lines += ["", "Chosen hyper-parameters (validation search below): "
              f"PC η = {fmt(ch['eta']) if ch['eta'] else '—'}, Adam lr {fmt(ch['lr_pc']) if ch['lr_pc'] else '—'}; "
              f"BP Adam lr {fmt(ch['lr_bp']) if ch['lr_bp'] else '—'}. Seeds: {', '.join(map(str, seeds))}.", ""]

    # final table
    res: dict = {}
    if ch["eta"] is not None and ch["lr_bp"] is not None:
        for spec in final_specs(ch, epochs_at, seeds):
            r = summarise_run(spec["out"])
            if r:
                res.setdefault((spec["depth"], spec["method"]), []).append((spec, r))
    lines += ["## Test accuracy (%) by depth", "",
              "Final = after the last epoch, best = the best epoch's test accuracy (reported, not used to choose); "
              "epoch time = median seconds of a training epoch on one pinned core (the machine was shared with "
              "other work, so times are indicative); PC/BP = the PC epoch time over BP's at the same depth.", "",
              "| depth H | method | epochs | final test | best test | final train | epoch time (s) | time / BP | PC − BP (final) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for d in DEPTHS:
        bp = res.get((d, "bp"))
        bp_final = statistics.mean(r["final"] for _, r in bp) if bp else None
        bp_t = statistics.mean(r["epoch_s"] for _, r in bp) if bp else None
        for meth in METHODS:
            got = res.get((d, meth))
            if not got:
                lines.append(f"| {d} | {LABELS[meth]} | — | not run | | | | | |")
                continue
            fin = statistics.mean(r["final"] for _, r in got)
            best = statistics.mean(r["best"] for _, r in got)
            tr = statistics.mean(r["train"] for _, r in got)
            t = statistics.mean(r["epoch_s"] for _, r in got)
            sd = f" ± {100 * statistics.stdev([r['final'] for _, r in got]):.2f}" if len(got) > 1 else ""
            ratio = f"{t / bp_t:.0f}×" if bp_t and meth != "bp" else ("1×" if meth == "bp" else "—")
            diff = f"{100 * (fin - bp_final):+.2f}" if bp_final is not None and meth != "bp" else ""
            lines.append(f"| {d} | {LABELS[meth]} | {got[0][1]['epochs']} | {pct(fin)}{sd} | {pct(best)} | "
                         f"{pct(tr)} | {t:.1f} | {ratio} | {diff} |")
    deep = max((d for d in DEPTHS if (d, "pc") in res and (d, "bp") in res), default=None)
    if deep is not None:
        pc_d = statistics.mean(r["final"] for _, r in res[(deep, "pc")])
        bp_d = statistics.mean(r["final"] for _, r in res[(deep, "bp")])
        gaps = ", ".join(f"H = {d}: {100 * (statistics.mean(r['final'] for _, r in res[(d, 'pc')]) - statistics.mean(r['final'] for _, r in res[(d, 'bp')])):+.2f}"
                         for d in DEPTHS if (d, "pc") in res and (d, "bp") in res)
        verdict = "met" if bp_d - pc_d <= 0.01 else "**not met**"
        lines += ["", f"**Acceptance** (PC within 1 point of BP's final test accuracy at H = {deep}, same epochs): "
                  f"{verdict}: PC {pct(pc_d)} vs BP {pct(bp_d)} ({100 * (pc_d - bp_d):+.2f} points). "
                  f"PC − BP by depth: {gaps}."]
    lines += ["", "Test accuracy per epoch:", "", "| depth | method | seed | test accuracy after each epoch |",
              "|---|---|---|---|"]
    stopped = []
    for (d, meth), got in sorted(res.items(), key=lambda kv: (kv[0][0], METHODS.index(kv[0][1]))):
        for spec, r in got:
            lines.append(f"| {d} | {meth} | {spec['seed']} | {' '.join(pct(a) for a in r['curve'])} |")
            if r["cfg"].get("epochs", r["epochs"]) > r["epochs"]:
                stopped.append(f"`{spec['name']}` (launched for {r['cfg']['epochs']}, stopped after {r['epochs']})")
    if stopped:
        lines += ["", "Runs stopped (killed after the epoch's checkpoint and metrics line were written) when their "
                  "depth's epochs were cut to fit the time budget; their `config.json` still names the launched "
                  "epochs: " + ", ".join(stopped) + "."]

    # investigations
    inv = sorted((OUT / "investigate").glob("*/metrics.jsonl")) if (OUT / "investigate").exists() else []
    if inv:
        lines += ["", "## Investigation runs", "",
                  "| run | arch | rule options | lr | epochs | final test | best test | epoch time (s) |",
                  "|---|---|---|---|---|---|---|---|"]
        for f in inv:
            r = summarise_run(f.parent)
            c = r["cfg"]
            opts = ", ".join(f"{k}={v}" for k, v in sorted(c.get("rule_options", {}).items())) or "—"
            lines.append(f"| `{f.parent.name}` | `{c.get('arch')}` | {c.get('rule')}: {opts} | {c.get('lr')} | "
                         f"{r['epochs']} | {pct(r['final'])} | {pct(r['best'])} | {r['epoch_s']:.1f} |")

    lines += alignment_lines()

    # search
    ds = sorted({r["depth"] for r in rows}) or [8]
    again = (f", the best {SEARCH_TOP} again at depth 32" if 32 in ds else
             " (depth 32 not searched: not cheap on the shared machine; `--search-depths 8,32` adds it)")
    lines += ["", "## Validation search", "",
              f"Seed 0, the first {LIMIT_TRAIN:,} training images of which the last {SEARCH_VAL} are held out "
              f"(`--val {SEARCH_VAL}`); {', '.join(f'depth {d}: {SEARCH_EPOCHS[d]} epochs' for d in ds)}. "
              f"PC (T = H + 1) over η ∈ {{{', '.join(fmt(e) for e in SEARCH_ETAS)}}} × Adam lr ∈ "
              f"{{{', '.join(fmt(x) for x in SEARCH_PC_LRS)}}} at depth 8{again}; "
              f"BP over Adam lr ∈ {{{', '.join(fmt(x) for x in SEARCH_BP_LRS)}}}. "
              "η = 0.0078125 = 0.5/64 is μPC's recipe (SGD 0.5 on the batch-mean energy). The winner is the best "
              "mean validation accuracy over the depths where a setting ran at all of them.", ""]
    table: dict = {}
    for r in rows:
        key = (r["method"], r["eta"], r["lr"])
        table.setdefault(key, {})[r["depth"]] = r
    lines += ["| method | η | Adam lr | " + " | ".join(f"val acc, depth {d}" for d in ds) + " |",
              "|---|---|---|" + "---|" * len(ds)]
    for (meth, eta, lr), byd in sorted(table.items(), key=lambda kv: (kv[0][0] != "pc", kv[0][1] or 0, kv[0][2])):
        cells = []
        for d in ds:
            r = byd.get(d)
            cells.append("" if r is None else (f"diverged (epoch {r['n'] + 1})" if r["diverged"] else pct(r["val_acc"])))
        mark = " **(chosen)**" if ((meth == "pc" and (eta, lr) == (ch["eta"], ch["lr_pc"]))
                                   or (meth == "bp" and lr == ch["lr_bp"])) else ""
        lines.append(f"| {meth}{mark} | {fmt(eta) if eta else '—'} | {fmt(lr)} | " + " | ".join(cells) + " |")

    # commands
    lines += ["", "## Commands", "",
              "Each run is one CLI call, pinned to one core (`taskset -c 0|1`, `OMP_NUM_THREADS=1`), "
              "`INFERLEARN_DATA` pointing at the MNIST files; the final runs:", "", "```bash"]
    if ch["eta"] is not None and ch["lr_bp"] is not None:
        lines += [command(s) for s in final_specs(ch, epochs_at, seeds)]
    lines += ["```", "", "The search runs have the same form with `--val 2000` and their η / lr / epochs "
              "(folder names under `benchmarks/results/depth/search/` spell the settings); the investigation runs "
              "likewise under `investigate/`."]
    (RESULTS / "depth.md").write_text("\n".join(lines) + "\n")
    plot(res, short)


def plot(res: dict, short: dict[int, int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for meth, style in zip(METHODS, ("o-", "s-", "^--")):
        pts = [(d, statistics.mean(r["final"] for _, r in res[(d, meth)])) for d in DEPTHS if (d, meth) in res]
        if pts:
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], style, label=LABELS[meth])
    ax.set_xscale("log", base=2)
    ax.set_xticks(DEPTHS, [str(d) for d in DEPTHS])
    ax.set_xlabel("hidden layers H (width 128)")
    ax.set_ylabel("final test accuracy (%)")
    ep = f"{EPOCHS} epochs" + "".join(f", H = {d}: {e}" for d, e in sorted(short.items()))
    ax.set_title(f"MNIST ({LIMIT_TRAIN // 1000}k training images, {ep}), Adam, same settings at every depth",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "depth.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="train the missing runs (else only summarise)")
    ap.add_argument("--stage", choices=("all", "search", "final", "investigate"), default="all")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, each pinned to its own core (0, 1, ...)")
    ap.add_argument("--cores", help="the cores to run on, comma-separated (overrides --jobs), e.g. 1")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="final runs: only these depths")
    ap.add_argument("--methods", default=",".join(METHODS), help="final runs: only these methods")
    ap.add_argument("--search-depths", default="8", help="depths of the search: 8, or 8,32 (the best PC "
                    f"settings of depth 8 and every BP rate again at 32, {SEARCH_EPOCHS[32]} epochs)")
    ap.add_argument("--eta", type=float, help="PC step size (default: the search's choice)")
    ap.add_argument("--lr-pc", type=float, help="PC Adam lr (default: the search's choice)")
    ap.add_argument("--lr-bp", type=float, help="BP Adam lr (default: the search's choice)")
    ap.add_argument("--seeds", default="0", help="final-run seeds, comma-separated")
    ap.add_argument("--epochs-at", action="append", default=[], metavar="DEPTH=E",
                    help="fewer epochs for every run at one depth (e.g. 64=3)")
    ap.add_argument("--alignment", action="store_true",
                    help="measure PC's gradient against BP's (init and trained checkpoints) -> results/depth/alignment.json")
    ap.add_argument("--investigate", action="append", default=[], metavar="DEPTH:METHOD:KEY=VAL,...")
    ap.add_argument("--epc", action="store_true", help="the error-optimised PC study instead (full MNIST, depth up to "
                    "128: benchmarks/depth_epc.py) -> results/depth_epc.md, .png")
    ap.add_argument("--epc-search-depths", default="8", help="with --epc: the search depths (8, or 8,32)")
    args = ap.parse_args()
    if args.epc:
        import depth_epc
        depth_epc.main(args, sys.argv[1:])
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    epochs_at = {int(k): int(v) for k, v in (e.split("=") for e in args.epochs_at)}
    cores = [int(c) for c in args.cores.split(",")] if args.cores else list(range(args.jobs))

    if args.run and args.stage in ("all", "search"):
        run_all(search_specs(8), cores)
        if "32" in args.search_depths.split(","):
            run_all(search_specs(32, top_pc(search_rows(), 8, SEARCH_TOP)), cores)
    ch = choose(search_rows())
    for k in ("eta", "lr_pc", "lr_bp"):
        if getattr(args, k) is not None:
            ch[k] = getattr(args, k)
    print(f"settings: {ch}", flush=True)
    if args.run and args.stage in ("all", "final"):
        depths, methods = {int(d) for d in args.depths.split(",")}, set(args.methods.split(","))
        run_all([s for s in final_specs(ch, epochs_at, seeds) if s["depth"] in depths and s["method"] in methods],
                cores)
    if args.run and args.stage in ("all", "investigate") and args.investigate:
        run_all(investigate_specs(args.investigate, ch, epochs_at), cores)
    if args.alignment:
        alignment(ch)
    cmd = " ".join(["python benchmarks/bench_depth.py"] + [shlex.quote(a) for a in sys.argv[1:]])
    write_summary(ch, epochs_at, seeds, cmd)
    print(f"wrote {RESULTS / 'depth.md'} and {RESULTS / 'depth.png'}")


if __name__ == "__main__":
    main()
