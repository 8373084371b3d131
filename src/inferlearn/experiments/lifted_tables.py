"""Reproduce Tables 1-4 of "Contrastive learning for lifted networks".

Each table trains four rows -- back-propagation, contrastive (J_1), standard lifted (J_0) and linear
regression -- from the same initial weights (same seed) for ReLU and for hard-sigmoid units, and
reports train accuracy, test accuracy and the fraction of active non-linearities (hidden units
whose projection is engaged, over the test set), plus training curves and first-layer filters.

Paper settings (defaults): γ = 1/8, SGD with η = 1/20, mini-batch 50, 100 epochs (CIFAR-10: 50).
Widths: the paper gives 784-64-64-64-10 for Table 1 only; Tables 2 and 3 ("four and five-layer
networks") use 4 and 5 hidden layers of 64 units (consistent with Table 1 calling its three
hidden layers a "3-layer network"); Table 4 uses 1024 grey pixels and Table 1's three hidden layers.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Sec. 5, Tables 1-4, Fig. 1.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import write_text
from ..training.config import TrainConfig
from ..errors import DivergenceError
from ..plots import plot_curves
from ..rules import make_rule
from ..training.loop import train
from .weight_pictures import plot_filters

ROWS = ("backprop", "contrastive", "lifted-j0", "linear-regression")
ROW_NAMES = {"backprop": "back-propagation", "contrastive": "contrastive (J_1)", "lifted-j0": "standard lifted (J_0)",
             "linear-regression": "linear regression"}
ACTS = ("relu", "hard-sigmoid")
GAMMA_RULES = ("contrastive", "lifted-j0")


@dataclass(frozen=True)
class TableSpec:
    """One table of the paper: data set, architecture and default epochs."""

    data: str
    arch: str
    epochs: int
    image_shape: tuple[int, int, int]


TABLES = {
    1: TableSpec("mnist", "784-64-64-64-10", 100, (1, 28, 28)),
    2: TableSpec("fashion-mnist", "784-64-64-64-64-10", 100, (1, 28, 28)),
    3: TableSpec("fashion-mnist", "784-64-64-64-64-64-10", 100, (1, 28, 28)),
    4: TableSpec("cifar10-gray", "1024-64-64-64-10", 50, (1, 32, 32)),
}


def table_spec(n: int) -> TableSpec:
    if n not in TABLES:
        raise ValueError(f"Unknown table {n}; the paper has tables {sorted(TABLES)}")
    return TABLES[n]


def reproduce_table(n: int, out: str | Path, epochs: int | None = None, acts=ACTS, rows=ROWS, gamma: float = 1 / 8,
                    lr: float = 0.05, batch_size: int = 50, seed: int = 0, data_dir: str | None = None,
                    limit_train: int | None = None, solver: str | None = None, allow_unverified: bool = False,
                    dtype: str = "float32", command: str = "",
                    progress: bool = False, log=print) -> str:
    """Train the table's rows (resuming finished runs) and write ``table{n}.md``; returns the Markdown.

    Runs live in ``out/table{n}/{act}/{rule}`` (each with config, metrics, checkpoint, curves), so an
    interrupted reproduction resumes where it stopped. Linear regression does not depend on the unit
    type and is trained once.
    """
    spec = table_spec(n)
    epochs = epochs or spec.epochs
    for r in rows:
        if r not in ROWS:
            raise ValueError(f"Unknown row {r!r}; choose from {list(ROWS)}")
    root = Path(out) / f"table{n}"
    results: dict[str, dict[str, list[dict]]] = {}
    t_start = time.time()
    configs = checked({(act, rule): row_config(spec, rule, act, root / ("any" if rule == "linear-regression" else act)
                                               / rule, epochs=epochs, gamma=gamma, lr=lr, batch_size=batch_size,
                                               seed=seed, data_dir=data_dir, limit_train=limit_train, solver=solver,
                                               allow_unverified=allow_unverified, dtype=dtype)
                       for act in acts for rule in rows})
    for act in acts:
        results[act] = {}
        for rule in rows:
            cfg = configs[act, rule]
            folder = cfg.out
            if log:
                log(f"table {n} {act} {rule}: {epochs} epochs -> {folder}")
            try:
                results[act][rule] = train(cfg, progress=progress, resume=True, log=log)
            except DivergenceError as exc:   # one diverging row must not lose the others
                if log:
                    log(f"table {n} {act} {rule}: {exc}")
                results[act][rule] = [{"diverged": str(exc)}]
        plot_curves({ROW_NAMES[r]: h for r, h in results[act].items() if "diverged" not in h[-1]}, root / f"curves_{act}.png",
                    title=f"Table {n}: {spec.data} {spec.arch} {act}")
        pics = {ROW_NAMES[r]: _first_layer(root / act / r) for r in ("backprop", "contrastive", "lifted-j0")
                if r in rows and "diverged" not in results[act][r][-1]}
        if pics:
            plot_filters(pics, spec.image_shape, root / f"filters_{act}.png",
                         title=f"First-layer filters, {spec.data} {spec.arch} {act}")
    md = _markdown(n, spec, epochs, results, gamma, lr, batch_size, seed, limit_train, command, time.time() - t_start)
    write_text(md, root / f"table{n}.md")
    return md


def checked(configs: dict) -> dict:
    """``configs`` (TrainConfig values), each rule's options validated: a bad option (``--solver nosuch``) is refused
    before the first row trains, not after the rows before it."""
    for cfg in configs.values():
        make_rule(cfg.rule, cfg.rule_options)
    return configs


def row_config(spec: TableSpec, rule: str, act: str, folder: str | Path, epochs: int, gamma: float = 1 / 8,
               lr: float = 0.05, batch_size: int = 50, seed: int = 0, data_dir: str | None = None,
               limit_train: int | None = None, solver: str | None = None,
               allow_unverified: bool = False, dtype: str = "float32") -> TrainConfig:
    """The training configuration of one row of a table (or of Fig. 1): rule, schedule and model.

    Back-propagation and contrastive learning use η throughout; standard lifted training the
    ``warmup`` schedule ("the first epochs utilized a smaller learning rate"); linear regression is
    back-propagation on the model without hidden layers at 0.1 × η (least squares on raw pixels:
    η = 1/20 is above its stability limit).
    """
    opts = {"gamma": gamma} if rule in GAMMA_RULES else {}
    if solver and rule in GAMMA_RULES:
        opts["solver"] = solver
    arch, schedule, train_rule = spec.arch, "constant", rule
    if rule == "linear-regression":
        sizes = spec.arch.split("-")
        arch, schedule, train_rule = f"{sizes[0]}-{sizes[-1]}", "scaled:0.1", "backprop"
    elif rule == "lifted-j0":
        schedule = "warmup"
    return TrainConfig(data=spec.data, arch=arch, act="relu" if rule == "linear-regression" else act,
                       rule=train_rule, rule_options=opts, epochs=epochs, batch_size=batch_size,
                       optimizer="sgd", lr=lr, lr_schedule=schedule, seed=seed, out=str(folder),
                       data_dir=data_dir, limit_train=limit_train, allow_unverified=allow_unverified, dtype=dtype)


# Fig. 1: "the first layer weights of a fully connected 784-64-64-10 ReLU network trained on MNIST";
# the paper gives no epoch count for the figure, so the default is its MNIST training length.
FIGURE1 = TableSpec("mnist", "784-64-64-10", 100, (1, 28, 28))
FIGURE1_ROWS = ("backprop", "contrastive", "lifted-j0")


def reproduce_figure1(out: str | Path, epochs: int | None = None, act: str = "relu", rows=FIGURE1_ROWS,
                      gamma: float = 1 / 8, lr: float = 0.05, batch_size: int = 50, seed: int = 0,
                      data_dir: str | None = None, limit_train: int | None = None, solver: str | None = None,
                      dtype: str = "float32", command: str = "", progress: bool = False, log=print) -> str:
    """Fig. 1: train BP, contrastive and standard lifted on MNIST 784-64-64-10 (ReLU) from the same
    weights and draw their first-layer filters side by side; returns (and writes) ``figure1.md``.

    Runs live in ``out/figure1/{act}/{rule}`` and resume like the tables'; the picture is
    ``out/figure1/filters_{act}.png`` (the first 64 filters of each rule, each on its own grey scale).
    """
    spec = FIGURE1
    epochs = epochs or spec.epochs
    for r in rows:
        if r not in FIGURE1_ROWS:
            raise ValueError(f"Unknown row {r!r} for Fig. 1; choose from {list(FIGURE1_ROWS)}")
    root = Path(out) / "figure1"
    results = {}
    configs = checked({rule: row_config(spec, rule, act, root / act / rule, epochs=epochs, gamma=gamma, lr=lr,
                                        batch_size=batch_size, seed=seed, data_dir=data_dir, limit_train=limit_train,
                                        solver=solver, dtype=dtype) for rule in rows})
    for rule in rows:
        cfg = configs[rule]
        folder = cfg.out
        if log:
            log(f"figure 1 {act} {rule}: {epochs} epochs -> {folder}")
        results[rule] = train(cfg, progress=progress, resume=True, log=log)
    png = root / f"filters_{act}.png"
    plot_filters({ROW_NAMES[r]: _first_layer(root / act / r) for r in rows}, spec.image_shape, png,
                 title=f"Fig. 1: first-layer filters, {spec.data} {spec.arch} {act}, {epochs} epochs")
    plot_curves({ROW_NAMES[r]: h for r, h in results.items()}, root / f"curves_{act}.png",
                title=f"Fig. 1: {spec.data} {spec.arch} {act}")
    lines = _heading(f"Fig. 1: first-layer filters, {spec.data} {spec.arch} ({act})", command)
    lines += [f"Settings: {epochs} epochs (the paper does not give the figure's; its MNIST runs use 100), SGD η = {lr}, "
              f"batch {batch_size}, γ = {gamma:g}, seed {seed} (same initial weights), "
              f"{'all' if limit_train is None else limit_train} training samples; learning rates as in Table 1. "
              f"Picture: `filters_{act}.png` (first 64 filters per rule, each on its own symmetric grey scale).", "",
              "| method | train | test | active |", "|---|---|---|---|"]
    for rule, h in results.items():
        last = h[-1]
        lines.append(f"| {ROW_NAMES[rule]} | {last['train_acc']:.4f} | {last['test_acc']:.4f} | "
                     f"{last['active_fraction']:.3f} |")
    lines.append("")
    md = "\n".join(lines)
    write_text(md, root / "figure1.md")
    return md


def _heading(title: str, command: str) -> list[str]:
    """A results file's title and the command that made it."""
    return [f"# {title}", ""] + (["Produced by:", "", "```", command, "```", ""] if command else [])


def _first_layer(folder: Path) -> torch.Tensor:
    ckpt = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=False)
    return ckpt["model"]["layers.0.weight"]


def _markdown(n, spec, epochs, results, gamma, lr, batch_size, seed, limit_train, command, seconds) -> str:
    lines = _heading(f"Table {n}: {spec.data}, {spec.arch}", command)
    lines += [f"Settings: {epochs} epochs (paper: {spec.epochs}), SGD η = {lr}, batch {batch_size}, γ = {gamma:g}, "
              f"seed {seed} (all rows start from the same weights), "
              f"{'all' if limit_train is None else limit_train} training samples. "
              f"Active = fraction of hidden units whose non-linearity is engaged on the test set "
              f"(forward pass). Wall time {seconds / 60:.1f} min.", ""]
    acts = list(results)
    head = "| method | " + " | ".join(f"{a} train | {a} test | {a} active" for a in acts) + " |"
    lines += [head, "|" + "---|" * (1 + 3 * len(acts))]
    rules = list(next(iter(results.values())))
    for rule in rules:
        cells = []
        for a in acts:
            last = results[a][rule][-1] if results[a].get(rule) else None
            if last is None:
                cells += ["", "", ""]
            elif "diverged" in last:
                cells += ["diverged", "diverged", "—"]
            else:
                active = "—" if rule == "linear-regression" else f"{last['active_fraction']:.3f}"
                cells += [f"{last['train_acc']:.4f}", f"{last['test_acc']:.4f}", active]
        lines.append(f"| {ROW_NAMES[rule]} | " + " | ".join(cells) + " |")
    lines += ["", "Per-epoch seconds (median): " + ", ".join(
        f"{a}/{r} {sorted(h['epoch_seconds'] for h in results[a][r])[len(results[a][r]) // 2]:.1f}"
        for a in acts for r in results[a] if "diverged" not in results[a][r][-1]), ""]
    for a in acts:
        for r in results[a]:
            if "diverged" in results[a][r][-1]:
                lines += [f"- {a} / {r}: {results[a][r][-1]['diverged']}"]
    lines += ["", "Learning rates: back-propagation and contrastive η; standard lifted η × 1/10 for 5 epochs, "
              "then η × 0.3 (LiftedJ0 defaults); linear regression η × 0.1 (least squares on raw pixels is "
              "unstable at η = 1/20).", ""]
    lines += ["Curves: `curves_<act>.png`; first-layer filters: `filters_<act>.png`; per-run metrics: "
              "`<act>/<rule>/metrics.jsonl`.", ""]
    return "\n".join(lines)


def summary_json(results: dict) -> str:
    """Final metrics of every run as JSON (for scripts)."""
    return json.dumps({a: {r: h[-1] for r, h in rs.items()} for a, rs in results.items()}, indent=1, sort_keys=True)


def alignment_report(data: str = "mnist", arch: str = "784-64-64-64-10", acts=("relu", "hard-sigmoid"),
                     gammas=(1.0, 1 / 2, 1 / 8, 1 / 32, 1 / 128), batch: int = 100, seed: int = 0,
                     bp_epochs: int = 1, limit_train: int | None = 10000, data_dir: str | None = None,
                     rules=("contrastive",), png: str | Path | None = None, command: str = "") -> str:
    """Markdown: cosine and relative error of the lifted rules' gradients vs BackProp's, swept over γ.

    For each unit type the network is evaluated at its initial weights and after ``bp_epochs``
    epochs of back-propagation (a briefly trained network), on the first ``batch`` training samples,
    in float64 with the reference solver (:func:`inferlearn.experiments.alignment.gamma_sweep`), for
    each of ``rules`` (``contrastive``, ``lifted-j0``). ``png``: also draw cosine vs γ per setting.
    """
    from .alignment import gamma_sweep, plot_sweeps, sweep_markdown
    from ..training.loop import build, run_epoch

    names = {"contrastive": "contrastive (J_1)", "lifted-j0": "standard lifted (J_0)"}
    lines = ["# Gradient alignment of " + " and ".join(names[r] for r in rules) + " with back-propagation, swept over γ",
             ""]
    if command:
        lines += ["Produced by:", "", "```", command, "```", ""]
    lines += [f"Data `{data}`, `{arch}`, first {batch} training samples, float64, reference solver. Each cell: cosine "
              "similarity / relative error ‖g − g_BP‖/‖g_BP‖ of the weight gradient of layer k "
              "(contrastive gradient divided by γ^{L-1}). docs/maths.md §A predicts an O(γ) difference, smaller for "
              "earlier layers."]
    if "lifted-j0" in rules:
        lines += ["Standard lifted (J_0): its gradient of layer k is divided by γ^k (the rule's default "
                  "scaling); the cosine does not depend on that per-layer scale, so only the cosine is given. "
                  "The paper: \"standard lifted networks do not approximate back-propagation even in the small "
                  "feedback setting\"."]
    lines.append("")
    panels = {}
    for act in acts:
        cfg = TrainConfig(data=data, arch=arch, act=act, rule="backprop", epochs=bp_epochs, batch_size=50, lr=0.05,
                          seed=seed, out="/tmp/inferlearn-alignment", data_dir=data_dir, limit_train=limit_train)
        s = build(cfg)
        x, labels = s.train_x[:batch], s.train_y[:batch]
        for state in ("initial", "trained"):
            if state == "initial":
                head = f"{act}: initial weights"
            else:
                for epoch in range(1, bp_epochs + 1):
                    run_epoch(s, cfg, epoch, progress=False)
                head = f"{act}: after {bp_epochs} epoch(s) of back-propagation on {limit_train or 'all'} samples"
            lines += [f"## {head}", ""]
            panel = []
            for rule in rules:
                rows = gamma_sweep(s.model, x, labels, gammas, rule=rule)
                panel += rows
                if len(rules) > 1:
                    lines += [f"{names[rule]}:", ""]
                lines += [sweep_markdown(rows, cosine_only=rule == "lifted-j0"), ""]
            panels[f"{act}, {'initial' if state == 'initial' else f'after {bp_epochs} BP epoch(s)'}"] = panel
    if png is not None:
        plot_sweeps(panels, png)
        lines += [f"Picture: `{Path(png).name}` (cosine vs γ; solid J_1, dashed J_0; one colour per layer).", ""]
    return "\n".join(lines)


def duality_report(data: str = "mnist", arch: str = "784-64-64-64-10", acts=("linear", "relu", "hard-sigmoid", "hard-tanh"),
                   gamma: float = 1 / 8, batch: int = 100, seed: int = 0, bp_epochs: int = 1, limit_train: int = 10000,
                   data_dir: str | None = None, command: str = "") -> str:
    """Markdown: strong duality and energy-based scoring on real data, per unit type.

    For each unit type a network is trained for ``bp_epochs`` epochs by back-propagation (on
    ``limit_train`` samples; linear and hard-tanh units at η/10: at η = 1/20 their output weights blow
    up to ~1e16 within an epoch), then on the first
    ``batch`` test images (float64, reference solver): the largest primal-dual gap of the free and
    clamped problems relative to the primal minimum; the free energy ``min_z E(z; x)`` of test images
    against uniform-noise images of the same mean intensity; and how often the class with the smallest
    contrastive energy ``min Ê − min E`` equals the forward pass's arg-max.
    """
    import copy

    from ..engine.duals import class_energies, duality_gap, free_energy
    from ..engine.problems import LiftedEnergy, contrastive_problem
    from ..losses import one_hot
    from ..engine.solvers import ReferenceSolver
    from ..training.loop import build, run_epoch

    lines = ["# Dual energies and energy-based scoring of a lifted network", ""]
    if command:
        lines += ["Produced by:", "", "```", command, "```", ""]
    lines += [f"Data `{data}`, `{arch}`, γ = {gamma:g}, networks after {bp_epochs} epoch(s) of back-propagation on "
              f"{limit_train} samples; first {batch} test images; float64, reference solver.", "",
              "| units | max rel. duality gap (free & clamped) | free energy: test images (mean) | free energy: noise "
              "images (mean) | arg-min class energy = forward arg-max |", "|---|---|---|---|---|"]
    for act in acts:
        cfg = TrainConfig(data=data, arch=arch, act=act, rule="backprop", epochs=bp_epochs, batch_size=50,
                          lr=0.005 if act in ("linear", "hard-tanh") else 0.05, seed=seed, out="/tmp/inferlearn-duality",
                          data_dir=data_dir, limit_train=limit_train)
        s = build(cfg)
        for epoch in range(1, bp_epochs + 1):
            run_epoch(s, cfg, epoch, progress=False)
        model = copy.deepcopy(s.model).double()
        x, labels = s.test_x[:batch].double(), s.test_y[:batch]
        energy = LiftedEnergy.from_model(model, gamma)
        p = contrastive_problem(energy, x, one_hot(labels, energy.sizes[-1], torch.float64))
        hidden, _ = ReferenceSolver().solve(p)
        primal = p.value(hidden)
        gap = float((duality_gap(p, hidden).abs() / primal.abs().clamp_min(1e-12)).max())
        noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        noise = noise * (x.mean() / noise.mean())
        fe_x, fe_noise = free_energy(model, x, gamma), free_energy(model, noise, gamma)
        agree = float((class_energies(model, x, gamma).argmin(1) == model(x).argmax(1)).double().mean())
        lines.append(f"| {act} | {gap:.1e} | {float(fe_x.mean()):.4g} | {float(fe_noise.mean()):.4g} | {agree:.3f} |")
    lines += ["", "The free energy of a linear network is 0 for every input (its forward pass is exact), so it cannot "
              "score inputs; for constrained units it measures how much the feedback has to bend the forward pass.", ""]
    return "\n".join(lines)
