"""Convergence checks: how far each fixed-step inference is from its equilibrium, what the checks say, and their cost.

Every solver run for a fixed number of steps judges its last residual against the residual at its start
(``SolveInfo.converged``: below :data:`~inferlearn.engine.solvers.CONVERGED_RTOL` = 1e-3 of it) and warns once
per run when it is *far* from equilibrium (``SolveInfo.far``). This script measures the quantities those
criteria and their docstrings rest on:

1. ``cd`` (15 sweeps) and ``block-pg`` (15 sweeps, no tolerance) on the lifted energies
   (``LiftedEnergy.from_model``, free and clamped rows stacked), and the lifted-Fenchel rule's 15 block sweeps:
   residual / starting residual and the largest activation error against the float64 reference solver, on
   MNIST ``784-64-64-64-10`` and digits ``64-32-32-10`` MLPs (ReLU and hard-sigmoid, γ = 1/16 … 1/2, float32,
   at initialisation and after 100 steps of back-propagation); and issue 19's case, MLP ``20-16-16-5`` with
   weights × 2, γ = 0.5, free phase (seeds 0-4, float64 and float32).
2. Predictive coding: ``r_T / r_0`` and ``max_k q_k`` (``q_k = ‖∂F/∂z_k‖ / ‖ε_k‖`` at the last step) as the
   rule's own check measures them, at the defaults (T = 20, η = 0.1) and other settings, on MLPs (at
   initialisation and the largest value over 100 steps of PC training), a conv net and zoo models; and the
   default gradient's distance from the gradient after many steps.
3. MAC: the digits demo (``64-32-32-10``, ReLU, SGD 0.05, batch 50, 30 epochs) with stored coordinates and
   with ``warm_start=False``: per epoch the Z-step's ``r_T / r_0``, ``far``, and test accuracy; and at
   μ = 1e4 from the forward pass the W-step gradient's distance from back-propagation's by Z-steps.
4. LPOM: last / first sweep move and the gradient error against 2000 sweeps, by sweeps.
5. Cost: CPU time per batch of the checked paths, this tree against revision ``d2ac5b9`` (before the
   checks), loaded side by side as in ``benchmarks/bench_revision.py``.

Run (about 5 minutes on one thread)::

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/investigations/convergence_checks.py [--cifar-dir DIR]

Writes ``benchmarks/results/convergence_checks.md``.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from inferlearn.data import load_dataset  # noqa: E402
from inferlearn.engine.problems import LiftedEnergy, contrastive_problem  # noqa: E402
from inferlearn.engine.solvers import (CONVERGED_RTOL, BlockProjectedGradient, CoordinateDescent,  # noqa: E402
                                       ReferenceSolver)
from inferlearn.errors import ConvergenceWarning  # noqa: E402
from inferlearn.losses import one_hot  # noqa: E402
from inferlearn.models import MLP, build_model  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "convergence_checks.md"
BASE = "d2ac5b9"
CIFAR_DIR = sys.argv[sys.argv.index("--cifar-dir") + 1] if "--cifar-dir" in sys.argv else None
GAMMAS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)


# -- helpers ---------------------------------------------------------------------------------------------------
def caught(fn):
    """``fn()`` with every warning recorded: ``(result, True if a far-from-equilibrium ConvergenceWarning fired)``."""
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        out = fn()
    return out, any(issubclass(w.category, ConvergenceWarning) and "far from" in str(w.message) for w in ws)


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def rng(lo: float, hi: float, fmt: str = ".2g") -> str:
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} – {hi:{fmt}}"


def bp_train(model, x, labels, steps=100, lr=0.1, batch=50):
    """``steps`` SGD steps of back-propagation on the quadratic loss (weights grow and align)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for i in range(steps):
        j = (i * batch) % (x.shape[0] - batch)
        opt.zero_grad()
        out = model(x[j:j + batch])
        (0.5 * (out - one_hot(labels[j:j + batch], out.shape[1], out.dtype)).pow(2).sum(1).mean()).backward()
        opt.step()
    return model


def recorder(solver):
    """Wrap ``solver.report`` (GradientSteps: the generic loop, the fused PC loop and MAC's Z-step all call it)
    to keep ``r_T / r_0`` and ``max_k q_k`` as the check computes them, whichever criterion decides."""
    log = []
    orig = solver.report

    def report(iterations, residual, initial, layers, floor):
        info = orig(iterations, residual, initial, layers, floor)
        q = math.nan
        if layers:
            negligible = max(CONVERGED_RTOL * initial, floor) if initial else floor
            q = max(0.0 if big <= negligible else (g / e if e > 0 else math.inf) for big, g, e in layers)
        log.append({"ratio": residual / initial if initial else math.nan, "q": q, "far": info.far,
                    "converged": info.converged})
        return info

    solver.report = report
    return log


# -- 1. cd and block-pg on the lifted energies --------------------------------------------------------------------
def lifted_section(mnist, digits) -> str:
    rows = []
    summary = {"cd": [], "block-pg": [], "lifted-fenchel": []}
    for dname, data, arch in (("MNIST", mnist, "784-64-64-64-10"), ("digits", digits, "64-32-32-10")):
        x, labels = data.train_x[:64], data.train_y[:64]
        y = one_hot(labels, data.n_classes)
        for units in ("relu", "hard-sigmoid"):
            for state in ("init", "trained"):
                model = MLP(arch, units, seed=0)
                if state == "trained":
                    bp_train(model, data.train_x[64:], data.train_y[64:])
                for gamma in GAMMAS:
                    p = contrastive_problem(LiftedEnergy.from_model(model, gamma=gamma), x, y)
                    ref = ReferenceSolver().solve(p.to(torch.float64))[0]
                    cells = []
                    for name, solver in (("cd", CoordinateDescent()),
                                         ("block-pg", BlockProjectedGradient(max_iter=15, tol=None))):
                        (hidden, info), warned = caught(lambda: solver.solve(p))
                        err = max(float((h.double() - r).abs().max()) for h, r in zip(hidden, ref))
                        ratio = info.residual / info.initial_residual
                        summary[name].append((ratio, err, warned))
                        cells.append(f"{ratio:.1e} | {err:.1e} | {'**warns**' if warned else ''}")
                    rule = make_rule("lifted-fenchel", {"gamma": gamma})
                    infos = []
                    orig = rule._solver.solve

                    def solve(prob, init=None, orig=orig, infos=infos):
                        hidden, info = orig(prob, init)
                        infos.append(info)
                        return hidden, info

                    rule._solver.solve = solve
                    model.zero_grad()
                    _, warned = caught(lambda: rule.backward(model, x, labels))
                    lf = infos[0].residual / infos[0].initial_residual
                    summary["lifted-fenchel"].append((lf, math.nan, warned))
                    rows.append(f"| {dname} | {units} | {state} | 1/{round(1 / gamma)} | " + " | ".join(cells)
                                + f" | {lf:.1e}{' **warns**' if warned else ''} |")
    # issue 19's case
    issue = []
    ranges = {}
    for dtype in (torch.float64, torch.float32):
        for seed in range(5):
            model = MLP("20-16-16-5", "relu", seed=seed, dtype=dtype)
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, torch.nn.Linear):
                        m.weight.mul_(2)
            x = torch.randn(32, 20, generator=torch.Generator().manual_seed(seed), dtype=dtype)
            p = LiftedEnergy.from_model(model, gamma=0.5).problem(x)   # the free phase
            ref = ReferenceSolver().solve(p.to(torch.float64))[0]
            cells = []
            for name, solver in (("cd", CoordinateDescent()), ("block-pg", BlockProjectedGradient(max_iter=15, tol=None))):
                (hidden, info), warned = caught(lambda: solver.solve(p))
                err = max(float((h.double() - r).abs().max()) for h, r in zip(hidden, ref))
                ratio = info.residual / info.initial_residual
                ranges.setdefault((name, str(dtype)[6:]), []).append((ratio, err, warned, info.converged))
                cells.append(f"{ratio:.1e} | {err:.2f} | {info.converged} | {'**warns**' if warned else ''}")
            issue.append(f"| {str(dtype)[6:]} | {seed} | " + " | ".join(cells) + " |")
    lines = ["## 1. `cd` and `block-pg` on the lifted energies", "",
             "Free and clamped rows stacked (`contrastive_problem`), the first 64 training images, float32, seed 0;",
             "\"trained\": after 100 SGD steps (lr 0.1, batch 50) of back-propagation. Ratio = residual at the end /",
             "residual at the start (`SolveInfo.residual / initial_residual`); act. error = largest |z − z*| against",
             "the float64 reference solver; **warns** = the far-from-equilibrium `ConvergenceWarning` fired.",
             "`cd`: `CoordinateDescent()` (15 sweeps); `block-pg`: `BlockProjectedGradient(max_iter=15, tol=None)`;",
             "lifted-fenchel: the rule's own 15 block sweeps (`make_rule(\"lifted-fenchel\", {\"gamma\": γ})`), its ratio.", "",
             "| data | units | weights | γ | cd ratio | cd act. error | cd | block-pg ratio | block-pg act. error | block-pg "
             "| lifted-fenchel ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    for name, vals in summary.items():
        r = [v[0] for v in vals]
        e = [v[1] for v in vals if not math.isnan(v[1])]
        lines.append(f"- {name}: ratio {rng(min(r), max(r), '.1e')}"
                     + (f", act. error {rng(min(e), max(e), '.1e')}" if e else "")
                     + f"; warned in {sum(v[2] for v in vals)} of {len(vals)}.")
    lines += ["", "Issue 19's case: MLP 20-16-16-5 (ReLU, seed s, weights × 2), γ = 0.5, free phase, 32 inputs",
              "`randn` (seed s); act. error against the float64 reference solver.", "",
              "| dtype | seed | cd ratio | cd act. error | cd converged | cd | block-pg ratio | block-pg act. error | "
              "block-pg converged | block-pg |", "|---|---|---|---|---|---|---|---|---|---|", *issue, ""]
    for (name, dt), vals in ranges.items():
        r, e = [v[0] for v in vals], [v[1] for v in vals]
        lines.append(f"- {name}, {dt}: ratio {rng(min(r), max(r), '.1e')}, act. error {rng(min(e), max(e), '.2f')}, "
                     f"warned in {sum(v[2] for v in vals)} of {len(vals)}, converged in {sum(v[3] for v in vals)}.")
    return "\n".join(lines) + "\n"


# -- 2. predictive coding --------------------------------------------------------------------------------------
def pc_stats(model, x, labels, opts) -> tuple[dict, bool]:
    rule = make_rule("pc", opts)
    log = recorder(rule._solver)
    model.zero_grad()
    _, warned = caught(lambda: rule.backward(model, x, labels))
    return log[-1], warned


def pc_training(model, data, opts, batches=100, batch=50):
    """PC training (SGD at the rule's recommended rate): the largest ``r_T/r_0`` and ``q`` over ``batches``."""
    rule = make_rule("pc", opts)
    log = recorder(rule._solver)
    opt = torch.optim.SGD(model.parameters(), lr=0.4)
    warned = False
    n = data.train_x.shape[0] // batch
    for i in range(batches):
        j = (i % n) * batch   # digits: 28 batches, then again
        opt.zero_grad()
        _, w = caught(lambda: rule.backward(model, data.train_x[j:j + batch], data.train_y[j:j + batch]))
        warned |= w
        opt.step()
    return max(r["ratio"] for r in log), max(r["q"] for r in log), warned


def cifar_gray(n: int):
    """The first ``n`` training images of grayscale CIFAR-10 (``None`` where it is not found; ``--cifar-dir DIR``
    names a folder with ``cifar-10-batches-py/``, e.g. a lossy JPEG-derived copy read unverified)."""
    from inferlearn.errors import DataError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = load_dataset("cifar10-gray", data_dir=CIFAR_DIR, allow_unverified=True)
    except DataError:
        return None
    return d.train_x[:n].reshape(n, -1).float(), d.train_y[:n]


def pc_section(mnist, digits) -> str:
    rows = []
    settings = [("T=20, η=0.1 (default)", {}), ("T=15, η=0.3 (PCX)", {"steps": 15, "step_size": 0.3}),
                ("T=5, η=0.1", {"steps": 5}), ("T=20, η=0.02", {"step_size": 0.02}),
                ("T=20, η=0.01", {"step_size": 0.01})]
    for dname, data, arch in (("MNIST", mnist, "784-64-64-64-10"), ("digits", digits, "64-32-32-10")):
        for label, opts in settings:
            model = MLP(arch, "relu", seed=0)
            s, w0 = pc_stats(model, data.train_x[:50], data.train_y[:50], opts)
            tr, tq, w1 = pc_training(MLP(arch, "relu", seed=0), data, opts)
            rows.append(f"| {dname} MLP {arch}, batch 50 | {label} | {s['ratio']:.2f} | {s['q']:.2f} | {tr:.2f} | {tq:.2f} | "
                        f"{'**warns**' if (w0 or w1) else ''} |")
    nets = [("MNIST `conv:8-16/64`, batch 16", mnist, "conv:8-16/64", (1, 28, 28), 16)]
    cifar = cifar_gray(8)
    if cifar is not None:
        nets += [("gray CIFAR `vgg5:width=0.25`, batch 8", None, "vgg5:width=0.25", (1, 32, 32), 8),
                 ("gray CIFAR `vgg7`, batch 8", None, "vgg7", (1, 32, 32), 8),
                 ("gray CIFAR `resnet20`, batch 8", None, "resnet20", (1, 32, 32), 8)]
    for dname, data, arch, shape, B in nets:
        x, labels = (data.train_x[:B], data.train_y[:B]) if data is not None else cifar
        for label, opts in settings[:3]:
            model = build_model(arch, "relu", int(np.prod(shape)), 10, shape, seed=0)
            s, w = pc_stats(model, x, labels, opts)
            rows.append(f"| {dname} | {label} | {s['ratio']:.2f} | {s['q']:.2f} | | | {'**warns**' if w else ''} |")
    # the default gradient against the gradient after many steps (MNIST MLP, at initialisation)
    grad_rows = []
    for seed in range(3):
        model = MLP("784-64-64-64-10", "relu", seed=seed)
        x, labels = mnist.train_x[50 * seed:50 * seed + 50], mnist.train_y[50 * seed:50 * seed + 50]
        grads, ratios = {}, {}
        for T, eta in ((20, 0.1), (200, 0.1), (2000, 0.1), (4000, 0.1), (10000, 0.02), (20000, 0.02)):
            s, _ = pc_stats(model, x, labels, {"steps": T, "step_size": eta})
            grads[(T, eta)], ratios[(T, eta)] = flat_grad(model), s["ratio"]
        ref = grads[(20000, 0.02)]
        grad_rows.append(f"| {seed} | " + " | ".join(f"{rel(g, ref):.3f} ({ratios[k]:.2f})" for k, g in grads.items()
                                                      if k != (20000, 0.02)) + f" | ({ratios[(20000, 0.02)]:.2f}) |")
    lines = ["## 2. Predictive coding", "",
             "`r_T/r_0`: the last step's largest move over the first's; `q`: `max_k ‖∂F/∂z_k‖ / ‖ε_k‖` over the hidden",
             "layers at the last step (the check's own numbers; far when `r_T/r_0 > 1` or `q > 2`). MLPs: at",
             "initialisation (seed 0, first batch) and the largest value over 100 batches of PC training (SGD 0.4,",
             "the rule's recommended rate). Conv and zoo models: at initialisation, ReLU, seed 0; gray CIFAR: the first",
             "8 training images of `cifar10-gray` (read with `--cifar-dir`: here the lossy JPEG-derived copy, converted to",
             "gray by the reader). **warns**: the far warning fired.", "",
             "| model | setting | r_T/r_0 (init) | q (init) | r_T/r_0 (train, max) | q (train, max) | warns |",
             "|---|---|---|---|---|---|---|", *rows, "",
             "The default gradient (T = 20, η = 0.1) and longer runs against T = 20000 steps of η = 0.02, MNIST MLP",
             "784-64-64-64-10 at initialisation, batch 50 (relative distance of all parameters' gradient; in",
             "parentheses `r_T/r_0` at the end: with ReLU units the steps do not settle).", "",
             "| seed | T=20, η=0.1 | T=200, η=0.1 | T=2000, η=0.1 | T=4000, η=0.1 | T=10000, η=0.02 | T=20000, η=0.02 |",
             "|---|---|---|---|---|---|---|", *grad_rows]
    return "\n".join(lines) + "\n"


# -- 3. MAC ----------------------------------------------------------------------------------------------------
def mac_run(digits, opts, epochs=30, batch=50, lr=0.05):
    rule = make_rule("mac", opts)
    log = recorder(rule._solver)
    model = MLP("64-32-32-10", "relu", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = digits.train_x.shape[0]
    per_epoch, first_warn = [], None
    for epoch in range(1, epochs + 1):
        rule.begin_epoch(epoch, n)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        start = len(log)
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            _, w = caught(lambda: rule.backward(model, digits.train_x[idx], digits.train_y[idx], index=idx))
            if w and first_warn is None:
                first_warn = epoch
            opt.step()
        with torch.no_grad():
            acc = float((model(digits.test_x).argmax(1) == digits.test_y).float().mean())
        ep = log[start:]
        per_epoch.append((epoch, rule.mu, statistics.median(r["ratio"] for r in ep), max(r["ratio"] for r in ep),
                          sum(r["far"] for r in ep) / len(ep), acc))
    return per_epoch, first_warn


def mac_section(mnist, digits) -> str:
    runs = {"stored coordinates (default)": {}, "warm_start=false": {"warm_start": False}}
    res = {k: mac_run(digits, v) for k, v in runs.items()}
    rows = []
    for e in range(30):
        cells = []
        for k in runs:
            ep, mu, med, mx, far, acc = res[k][0][e]
            cells.append(f"{med:.2f} | {mx:.2f} | {far:.2f} | {acc:.3f}")
        rows.append(f"| {e + 1} | {res[next(iter(runs))][0][e][1]:.3g} | " + " | ".join(cells) + " |")
    firsts = ", ".join(f"{k}: {'epoch ' + str(v[1]) if v[1] else 'never'}" for k, v in res.items())
    # W-step against back-propagation at mu = 1e4, from the forward pass
    bp_rows = []
    for dname, data, arch in (("digits", digits, "64-32-32-10"), ("MNIST", mnist, "784-64-64-64-10")):
        for dtype in (torch.float32, torch.float64):
            model = MLP(arch, "relu", seed=0, dtype=dtype)
            x, labels = data.train_x[:50].to(dtype), data.train_y[:50]
            model.zero_grad()
            out = model(x)
            (0.5 * (out - one_hot(labels, out.shape[1], dtype)).pow(2).sum(1).mean()).backward()
            bp = flat_grad(model)
            cells = []
            for steps in (30, 100, 300, 1000):
                rule = make_rule("mac", {"mu0": 1e4, "mu_max": 1e4, "steps": steps})
                model.zero_grad()
                caught(lambda: rule.backward(model, x, labels))
                cells.append(f"{rel(flat_grad(model), bp):.1e}")
            bp_rows.append(f"| {dname} {arch} | {str(dtype)[6:]} | " + " | ".join(cells) + " |")
    lines = ["## 3. MAC", "",
             "The digits demo (`64-32-32-10`, ReLU, seed 0, SGD 0.05, batch 50, 30 epochs, μ = 1.5^(e−1) up to 1e4,",
             "Z-step: 30 steps of η = 0.2, with sample indices as the training loop passes them). Per epoch: the median",
             "and largest Z-step `r_T/r_0` (`r_0` at the forward pass), the share of batches judged far, test accuracy.",
             f"First far warning: {firsts}.", "",
             "| epoch | μ | stored: median r_T/r_0 | stored: max | stored: far share | stored: test acc | "
             "warm_start=false: median r_T/r_0 | max | far share | test acc |",
             "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
             "At μ = 1e4 from the forward pass (no sample indices), relative distance of the W-step gradient from",
             "back-propagation's (the μ → ∞ limit), by Z-steps (η = 0.2), first 50 training images, seed 0, at",
             "initialisation:", "",
             "| net | dtype | 30 steps (default) | 100 | 300 | 1000 |", "|---|---|---|---|---|---|", *bp_rows]
    return "\n".join(lines) + "\n"


# -- 4. LPOM ---------------------------------------------------------------------------------------------------
def lpom_section(mnist) -> str:
    rows = []
    x, labels = mnist.train_x[:256], mnist.train_y[:256]
    sweeps = (1, 2, 3, 5, 10, 20)
    for arch in ("784-64-64-10", "784-64-64-64-10"):
        for mu in (1.0, 10.0):
            model = MLP(arch, "relu", seed=0)

            def run(n):
                rule = make_rule("lpom", {"mu": mu, "sweeps": n})
                got = {}
                orig = rule.verdict

                def verdict(hidden, iterations, move, first):
                    got.update(ratio=move / first if first else math.nan)
                    return orig(hidden, iterations, move, first)

                rule.verdict = verdict
                model.zero_grad()
                _, warned = caught(lambda: rule.backward(model, x, labels))
                return flat_grad(model), got["ratio"], warned

            ref = run(2000)[0]
            cells = []
            for n in sweeps:
                g, ratio, warned = run(n)
                cells.append(f"{ratio:.3f} / {100 * rel(g, ref):.1f} %{' **w**' if warned else ''}")
            rows.append(f"| {arch} | {mu:g} | " + " | ".join(cells) + " |")
    lines = ["## 4. LPOM", "",
             "Last / first sweep's largest move and the weight gradient's relative error against 2000 sweeps, by",
             "sweeps; MNIST, the first 256 training images, ReLU, seed 0, at initialisation; `inner` = 3 (default).",
             "**w**: the far warning (ratio > 0.2) fired.", "",
             "| net | μ | " + " | ".join(f"{n} sweeps" for n in sweeps) + " |", "|---|---|" + "---|" * len(sweeps), *rows]
    return "\n".join(lines) + "\n"


# -- 5. cost ---------------------------------------------------------------------------------------------------
def cost_section(mnist, repeats: int = 9, batches: int = 10) -> str:
    from bench_revision import load_revision
    import shutil

    base, tmp = load_revision(BASE)
    pkgs = {"this tree": sys.modules["inferlearn"], BASE: base}
    x, labels = mnist.train_x[:50 * batches], mnist.train_y[:50 * batches]

    def imp(pkg, mod):
        """``pkg.mod``; ``mod`` a tuple: the first that imports (a module moved between the revisions)."""
        for name in (mod,) if isinstance(mod, str) else mod:
            try:
                return __import__(f"{pkg.__name__}.{name}", fromlist=["_"])
            except ImportError:
                continue
        raise ImportError(f"none of {mod} in {pkg.__name__}")

    def rule_case(name, opts):
        def run(pkg):
            model = imp(pkg, "models").MLP("784-64-64-64-10", "relu", seed=0)
            rule = imp(pkg, "rules").make_rule(name, dict(opts))
            rule.backward(model, x[:50], labels[:50])   # compile / warm up
            t = time.process_time()
            for i in range(batches):
                rule.backward(model, x[50 * i:50 * i + 50], labels[50 * i:50 * i + 50])
            return (time.process_time() - t) / batches
        return run

    def solver_case(name):
        def run(pkg):
            dense, solvers = imp(pkg, ("engine.problems", "engine.dense")), imp(pkg, "engine.solvers")   # today's home, or a revision's before the engine split
            model = imp(pkg, "models").MLP("784-64-64-64-10", "relu", seed=0)
            e = dense.LiftedEnergy.from_model(model, gamma=1 / 8)
            probs = [dense.contrastive_problem(e, x[50 * i:50 * i + 50], imp(pkg, "losses").one_hot(labels[50 * i:50 * i + 50], 10))
                     for i in range(batches)]
            make = (lambda: solvers.CoordinateDescent()) if name == "cd" else \
                (lambda: solvers.BlockProjectedGradient(max_iter=15, tol=None))
            make().solve(probs[0])
            t = time.process_time()
            for p in probs:
                make().solve(p)
            return (time.process_time() - t) / batches
        return run

    cases = [("pc, fused (T = 20)", rule_case("pc", {})), ("pc, generic (T = 20)", rule_case("pc", {"engine": "generic"})),
             ("mac (30 Z-steps, no index)", rule_case("mac", {})), ("lpom (10 sweeps)", rule_case("lpom", {})),
             ("lifted-fenchel (15 block sweeps)", rule_case("lifted-fenchel", {})),
             ("cd solver alone (15 sweeps, γ = 1/8)", solver_case("cd")),
             ("block-pg solver alone (15 sweeps, no tol)", solver_case("block-pg"))]
    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in range(repeats):
            for label, fn in (cases if r % 2 == 0 else cases[::-1]):
                for tag, pkg in (pkgs.items() if r % 2 == 0 else list(pkgs.items())[::-1]):
                    times.setdefault((label, tag), []).append(fn(pkg))
    shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for label, _ in cases:
        b, h = (statistics.median(times[(label, t)]) for t in (BASE, "this tree"))
        ratios = [a / c for a, c in zip(times[(label, "this tree")], times[(label, BASE)])]
        rows.append(f"| {label} | {1e3 * b:.2f} | {1e3 * h:.2f} | **{h / b:.3f}** | {min(ratios):.2f} – {max(ratios):.2f} |")
    lines = ["## 5. Cost of the checks", "",
             "CPU ms per batch (`time.process_time`, one thread), MNIST MLP 784-64-64-64-10, ReLU, batch 50, default",
             f"options, `rule.backward` only (no optimiser step), median of {repeats} repeats × {batches} batches, this tree",
             f"against revision `{BASE}` (before the checks) loaded side by side, interleaved. The solvers alone: on",
             "`contrastive_problem` (free + clamped rows), γ = 1/8.", "",
             "| path | before (ms) | this tree (ms) | ratio | range over repeats |", "|---|---|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.time()
    mnist, digits = load_dataset("mnist"), load_dataset("digits")
    parts = []
    for fn, args in ((lifted_section, (mnist, digits)), (pc_section, (mnist, digits)), (mac_section, (mnist, digits)),
                     (lpom_section, (mnist,)), (cost_section, (mnist,))):
        t = time.time()
        parts.append(fn(*args))
        print(parts[-1], f"[{fn.__name__}: {time.time() - t:.0f} s]", flush=True)
    text = (f"# Convergence checks: fixed-step inference against its equilibrium\n\nMade by "
            f"`OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/investigations/convergence_checks.py"
            f"{' --cifar-dir DIR' if CIFAR_DIR else ''}` "
            f"({(time.time() - start) / 60:.1f} min; torch {torch.__version__}, one thread).\n\n" + "\n".join(parts))
    OUT.write_text(text)


if __name__ == "__main__":
    main()
