"""This tree against an earlier revision, in one process: is a path slower than it was?

Loads the package of a git revision (``--base``, default the last commit before the graph engine) as a
second package, ``inferlearn_base``, beside this tree's ``inferlearn``, and times the same training steps
with both, interleaved round-robin within each repeat (direction alternating), from the same initial
weights on the same batches: ``opt.zero_grad(); rule.backward(model, x, labels); opt.step()``, SGD at each
rule's recommended rate.

Variants: each energy rule on the MNIST MLP ``784-64-64-64-10`` (batch 50) with ``engine="auto"`` (the
fused dense path) and ``engine="generic"``, back-propagation, and the rules on a small conv chain
(``conv:8-16/64`` shape: two conv + average-pooling layers, one hidden dense layer; the generic engine).
Both trees run the same rule options. ``--rules`` chooses the rules (default: contrastive, eqprop,
lifted-j0, pc); rules without an ``engine`` option (``mac``, ``lpom``; MAC without sample indices, i.e.
every Z-step from the forward pass) run once on the MLP.

Timing: CPU time of the process (``time.process_time``, one thread), which a busy machine disturbs less
than wall time; the table shows, per variant, the median over ``--repeats`` of the two trees' times and
their ratio (this tree / base), and the ratio of the two trees' best (smallest) times, which interference from
other work on a shared machine can only lengthen. Ratios within a few per cent of 1 are noise there.

Usage::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_revision.py --repeats 7

Writes ``benchmarks/results/revision_<BASE>.md`` (``--out`` names another file under ``benchmarks/results/``).
"""
from __future__ import annotations

import argparse
import importlib
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import inferlearn  # noqa: E402
from inferlearn.data import load_dataset  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE = "1447aa4"
RULES = ("contrastive", "eqprop", "lifted-j0", "pc")


def load_revision(rev: str):
    """The package ``src/inferlearn`` of git revision ``rev``, imported as ``inferlearn_base``."""
    tmp = Path(tempfile.mkdtemp(prefix="inferlearn_base_"))
    archive = tmp / "src.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/inferlearn"], stdout=f, check=True)
    with tarfile.open(archive) as t:
        t.extractall(tmp, filter="data")
    shutil.move(str(tmp / "src" / "inferlearn"), str(tmp / "inferlearn_base"))
    sys.path.insert(0, str(tmp))
    return importlib.import_module("inferlearn_base"), tmp


def mlp(pkg, seed: int = 0) -> nn.Module:
    return importlib.import_module(f"{pkg.__name__}.models").MLP("784-64-64-64-10", "relu", seed=seed)


def conv(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


NO_ENGINE = ("mac", "lpom")   # rules without an ``engine`` option: one MLP variant


def variants(rules=RULES) -> list[tuple[str, str, dict, str]]:
    out = [("backprop (MLP)", "backprop", {}, "mlp")]
    for r in rules:
        if r in NO_ENGINE:
            out.append((f"{r} (MLP)", r, {}, "mlp"))
            continue
        out.append((f"{r} fused (MLP)", r, {"engine": "auto"}, "mlp"))
        out.append((f"{r} generic (MLP)", r, {"engine": "generic"}, "mlp"))
    for r in rules:
        if r != "lifted-j0" and r not in NO_ENGINE:   # J0 diverges on this conv net at its recommended rate (in both trees)
            out.append((f"{r} (conv chain)", r, {}, "conv"))
    return out


def run(pkg, rule_name: str, opts: dict, kind: str, batches) -> float:
    rules = importlib.import_module(f"{pkg.__name__}.rules")
    model = mlp(pkg) if kind == "mlp" else conv()
    rule = rules.make_rule(rule_name, dict(opts))
    opt = torch.optim.SGD(model.parameters(), lr=rules.recommended_lr(rule_name, "sgd"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (x, y) in enumerate(batches):
            if i == 1:
                t0 = time.process_time()
            opt.zero_grad()
            rule.backward(model, x, y)
            opt.step()
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default=BASE, help="git revision to compare against")
    p.add_argument("--batches", type=int, default=60, help="timed mini-batches per run (MLP; conv: a third)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rules", default=",".join(RULES), help="comma-separated rules (default: %(default)s)")
    p.add_argument("--out", default=None, help="results file name under benchmarks/results/ (default revision_<BASE>.md)")
    args = p.parse_args()
    rules = tuple(r for r in args.rules.split(",") if r)
    torch.set_num_threads(1)
    start = time.time()
    base, tmp = load_revision(args.base)
    data = load_dataset("mnist")
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(data.train_x.shape[0], generator=g)[:50 * (args.batches + 1)].view(-1, 50)
    batches = [(data.train_x[i], data.train_y[i]) for i in idx]
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        order = variants(rules) if r % 2 == 0 else variants(rules)[::-1]
        for label, name, opts, kind in order:
            use = batches if kind == "mlp" else batches[:max(2, args.batches // 3 + 1)]
            pair = [(inferlearn, "head"), (base, "base")]
            for pkg, tag in (pair if r % 2 == 0 else pair[::-1]):
                times.setdefault((label, tag), []).append(run(pkg, name, opts, kind, use))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    rows = []
    for label, *_ in variants(rules):
        h, b = statistics.median(times[(label, "head")]), statistics.median(times[(label, "base")])
        ratios = [a / c for a, c in zip(times[(label, "head")], times[(label, "base")])]
        best = min(times[(label, "head")]) / min(times[(label, "base")])
        rows.append(f"| {label} | {b:.3f} | {h:.3f} | **{h / b:.2f}** | {best:.2f} | {min(ratios):.2f}–{max(ratios):.2f} |")
    text = f"""# This tree against revision `{args.base}`

Command:

```
OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_revision.py --base {args.base} --repeats {args.repeats} --rules {','.join(rules)}{f' --out {args.out}' if args.out else ''}
```

This tree: `{rev}` (plus uncommitted changes, if any). MNIST, batch 50, SGD at each rule's recommended rate, default rule options except
`engine`; {args.batches} timed mini-batches per MLP run, {max(1, args.batches // 3)} per conv run; CPU seconds of the
process (`time.process_time`), median over {args.repeats} repeats, the two trees interleaved. torch
{torch.__version__}, 1 thread, Python {platform.python_version()}, {platform.machine()}. Total wall time:
{(time.time() - start) / 60:.1f} min.

| variant | base CPU s | this tree CPU s | this / base | best / best | range over repeats |
|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / (args.out or f"revision_{args.base}.md")).write_text(text)
    print(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
