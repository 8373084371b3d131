"""Learning rules on a small conv net: Fashion-MNIST and grayscale CIFAR-10, same initial weights.

For every data set and rule, trains ``inferlearn.models.conv_net`` (Unflatten → per stage
Conv3×3 → ReLU clamp → AvgPool2, Flatten → Linear → ReLU → Linear) from the same seed with SGD,
batch 50 and the same seeded batch order, following the library's contract::

    opt.zero_grad(); info = rule.backward(model, x, labels); opt.step()

and reports, per rule: test accuracy on the whole test split after every epoch, the fraction of
active units (``diagnostics.active_fraction``) at the end, the median epoch time relative to
back-propagation's, and, at the initial weights, the per-layer cosine of the rule's gradient with
back-propagation's on one fixed batch of 200 training images (``diagnostics.gradient_alignment``).

A rule is given as ``NAME`` or ``NAME@LR`` (a learning rate for that entry only, e.g.
``lifted-j0@0.001``). Without ``@LR``, ``lifted-j0`` uses ``--lifted-lr`` (default 0.005, constant,
no warm-up scheduler) and every other rule ``--lr`` (0.05).

Results are written incrementally: ``OUT/<dataset>/<rule>.json`` after every epoch (``status``
``running``, then ``done`` or ``error``); a finished rule is skipped when the script is run again
(``--force`` reruns it). After each data set the report ``OUT/README.md`` and the learning curves
``OUT/<dataset>_curves.png`` are rebuilt from all JSON files under ``OUT`` (``--report-only`` just
rebuilds them).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_conv.py \\
        --datasets fashion-mnist,cifar10-gray --epochs 10 --limit-train 4000

The grayscale CIFAR-10 is read from an ``.npz`` (keys ``x_train``, ``y_train``, ``x_test``,
``y_test``, uint8 images (N, 32, 32)); see ``--cifar-npz``. Its test split is sorted by class, so it
is always evaluated whole.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import inferlearn  # noqa: E402
from inferlearn.data import load_dataset  # noqa: E402
from inferlearn.diagnostics import active_fraction, evaluate, gradient_alignment  # noqa: E402
from inferlearn.models import conv_net  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

DEFAULT_RULES = "backprop,fenchel-bp,contrastive,eqprop,pc,lifted-j0,lifted-j0@0.001"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "conv_rules"
CIFAR_NOTE = ("grayscale, lossy (JPEG-derived, ~30 dB PSNR) copy of CIFAR-10; accuracies are on this copy, "
              "not on the published data set")


# ----------------------------------------------------------------------------------------------- data
class Data:
    def __init__(self, name, train_x, train_y, test_x, test_y, image_shape, n_classes, source):
        self.name, self.train_x, self.train_y, self.test_x, self.test_y = name, train_x, train_y, test_x, test_y
        self.image_shape, self.n_classes, self.source = tuple(image_shape), int(n_classes), source


def load_cifar_gray_npz(path: str) -> Data:
    z = np.load(path)
    to_x = lambda a: torch.from_numpy(a.reshape(a.shape[0], -1).astype(np.float32) / 255.0)  # noqa: E731
    to_y = lambda a: torch.from_numpy(a.astype(np.int64))  # noqa: E731
    return Data("cifar10-gray", to_x(z["x_train"]), to_y(z["y_train"]), to_x(z["x_test"]), to_y(z["y_test"]),
                (1,) + tuple(z["x_train"].shape[1:]), 10, str(path))


def load(name: str, args) -> Data:
    if name == "cifar10-gray":
        return load_cifar_gray_npz(args.cifar_npz)
    d = load_dataset(name)
    return Data(d.name, d.train_x, d.train_y, d.test_x, d.test_y, d.image_shape, d.n_classes, d.source)


# ------------------------------------------------------------------------------------------- training
def parse_rule(spec: str, args) -> tuple[str, float]:
    name, _, lr = spec.partition("@")
    if lr:
        return name, float(lr)
    return name, (args.lifted_lr if name == "lifted-j0" else args.lr)


def layer_names(model: nn.Module) -> dict[str, str]:
    """``"1.weight"`` → ``"conv1.weight"`` etc. (conv stages, dense hidden layers, ``out``)."""
    convs = [n for n, m in model.named_children() if isinstance(m, nn.Conv2d)]
    lins = [n for n, m in model.named_children() if isinstance(m, nn.Linear)]
    names = {n: f"conv{i + 1}" for i, n in enumerate(convs)}
    names.update({n: f"fc{i + 1}" for i, n in enumerate(lins[:-1])})
    names[lins[-1]] = "out"
    return {f"{k}.{p}": f"{v}.{p}" for k, v in names.items() for p in ("weight", "bias")}


def finite_params(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def run_rule(data: Data, spec: str, args, path: Path) -> dict:
    name, lr = parse_rule(spec, args)
    n_train = data.train_x.shape[0] if args.limit_train is None else min(args.limit_train, data.train_x.shape[0])
    x_tr, y_tr = data.train_x[:n_train], data.train_y[:n_train]
    model = conv_net(data.image_shape, args.channels, args.hidden, data.n_classes, units="relu", seed=args.seed)
    names = layer_names(model)
    res = dict(dataset=data.name, rule=spec, rule_name=name, lr=lr, schedule="constant", optimizer="SGD",
               batch_size=args.batch_size, epochs=args.epochs, n_train=n_train, n_test=int(data.test_x.shape[0]),
               channels=args.channels, hidden=args.hidden, seed=args.seed, image_shape=list(data.image_shape),
               source=data.source, inferlearn=str(Path(inferlearn.__file__).parent), status="running", error=None, n_params=sum(p.numel() for p in model.parameters()),
               curve=[], epoch_times=[], train_loss=[], solver_warnings=[], alignment=None)

    def save():
        path.write_text(json.dumps(res, indent=1))

    try:
        rule = make_rule(name)
        res["rule_options"] = {k: repr(v) for k, v in vars(rule).items() if not k.startswith("_")}
        # gradient alignment with BP at the initial weights, on a fixed batch of 200 training images
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = gradient_alignment(rule, model, x_tr[:args.align_batch], y_tr[:args.align_batch])
        res["alignment"] = [dict(r, layer=names.get(r["param"], r["param"])) for r in rows]
        res["curve"].append(evaluate(model, data.test_x, data.test_y))   # epoch 0 = initial weights
        save()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        n_batches = math.ceil(n_train / args.batch_size)
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(n_train, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
            losses, n_warn, first_warn = [], 0, None
            t0 = time.perf_counter()
            for b in range(n_batches):
                idx = order[b * args.batch_size:(b + 1) * args.batch_size]
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    opt.zero_grad()
                    try:
                        info = rule.backward(model, x_tr[idx], y_tr[idx])
                    except Exception as e:
                        raise RuntimeError(f"epoch {epoch}, batch {b + 1}/{n_batches}: {type(e).__name__}: {e}") from e
                    opt.step()
                n_warn += len(caught)
                if caught and first_warn is None:
                    first_warn = str(caught[0].message)
                losses.append(info.loss)
            res["epoch_times"].append(time.perf_counter() - t0)
            res["train_loss"].append(float(np.mean(losses)))
            res["solver_warnings"].append({"count": n_warn, "first": first_warn})
            if not finite_params(model):
                raise RuntimeError(f"epoch {epoch}: non-finite weights after the SGD steps (diverged)")
            if not res["train_loss"][-1] < args.diverge_loss:
                raise RuntimeError(f"epoch {epoch}: diverged, mean train loss {res['train_loss'][-1]:.3g} "
                                   f"> {args.diverge_loss:g} (stopped)")
            res["curve"].append(evaluate(model, data.test_x, data.test_y))
            save()
            print(f"  [{data.name} {spec}] epoch {epoch}/{args.epochs}: test acc {res['curve'][-1]:.4f}, "
                  f"train loss {res['train_loss'][-1]:.4f}, {res['epoch_times'][-1]:.1f} s"
                  + (f", {n_warn} solver warnings" if n_warn else ""), flush=True)
        res["active_fraction"] = active_fraction(model, data.test_x)
        res["test_acc"] = res["curve"][-1]
        res["status"] = "done"
    except Exception as e:  # record, do not crash the benchmark
        res["status"] = "error"
        res["error"] = f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) or e.__cause__ is None else str(e)
        res["traceback"] = traceback.format_exc()
        try:
            res["active_fraction"] = active_fraction(model, data.test_x) if finite_params(model) else None
        except Exception:
            res["active_fraction"] = None
        print(f"  [{data.name} {spec}] ERROR {res['error']}", flush=True)
    save()
    return res


# --------------------------------------------------------------------------------------------- report
def load_results(out: Path) -> dict[str, list[dict]]:
    by_data: dict[str, list[dict]] = {}
    for f in sorted(out.glob("*/*.json")):
        r = json.loads(f.read_text())
        by_data.setdefault(r["dataset"], []).append(r)
    return by_data


def rule_order(rows: list[dict], rules: list[str]) -> list[dict]:
    key = {s: i for i, s in enumerate(rules)}
    return sorted(rows, key=lambda r: (key.get(r["rule"], len(key)), r["rule"]))


def plot_curves(dataset: str, rows: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if len(r["curve"]) < 1:
            continue
        label = f"{r['rule_name']} (lr {r['lr']:g})" + (" — error" if r["status"] == "error" else "")
        ax.plot(range(len(r["curve"])), r["curve"], marker="o", ms=3, label=label,
                ls="--" if r["status"] == "error" else "-")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (whole test split)")
    r0 = rows[0]
    ax.set_title(f"{dataset}: conv {'-'.join(map(str, r0['channels']))} / {'-'.join(map(str, r0['hidden']))}, "
                 f"{r0['n_train']} training images")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{dataset}_curves.png", dpi=110)
    plt.close(fig)


def fmt(v, spec=".3f"):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table(rows: list[dict]) -> str:
    bp = next((r for r in rows if r["rule"] == "backprop" and r["epoch_times"]), None)
    bp_time = statistics.median(bp["epoch_times"]) if bp else None
    layers = []
    for r in rows:
        for a in r["alignment"] or []:
            if a["layer"].endswith("weight") and a["layer"] not in layers:
                layers.append(a["layer"])
    head = ("| rule | lr | test acc | train loss | active | epoch time / BP | cos with BP at init ("
            + ", ".join(l.removesuffix(".weight") for l in layers) + ") | norm ratio at init |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        if r["status"] == "done":
            acc = f"{r['test_acc']:.4f}"
        elif r["status"] == "error":
            best = f"; last test acc {r['curve'][-1]:.4f} after {len(r['curve']) - 1} epochs" if r["curve"] else ""
            acc = f"**error**: `{r['error']}`{best}"
        else:
            acc = f"(running, {len(r['curve']) - 1} epochs)"
        ratio = (f"{statistics.median(r['epoch_times']) / bp_time:.2f}" if bp_time and r["epoch_times"] else "–")
        al = {a["layer"]: a for a in r["alignment"] or []}
        cos = " / ".join(fmt(al[l]["cosine"], ".3f") if l in al else "–" for l in layers)
        nr = " / ".join(fmt(al[l]["norm_ratio"], ".3g") if l in al else "–" for l in layers)
        lines.append(f"| {r['rule_name']} | {r['lr']:g} | {acc} | {fmt(r['train_loss'][-1] if r['train_loss'] else None, '.3g')} | {fmt(r.get('active_fraction'))} | {ratio} | {cos} | {nr} |")
    note = (f"\nBP median epoch time: {bp_time:.1f} s ({bp['n_train']} images, batch {bp['batch_size']})."
            if bp_time else "")
    return "\n".join(lines) + "\n" + note + "\n"


def write_report(out: Path, args, rules: list[str]) -> None:
    by_data = load_results(out)
    if not by_data:
        return
    parts = ["# Learning rules on a conv net: Fashion-MNIST and grayscale CIFAR-10\n",
             "Written by `benchmarks/bench_conv.py` (rebuilt from the JSON files under this folder).\n",
             f"Command: `{args.command_line}`\n"]
    if args.report_note:
        parts.append(args.report_note + "\n")
    any_r = next(iter(by_data.values()))[0]
    parts.append(
        "Setup:\n"
        f"- Architecture: `inferlearn.models.conv_net(image_shape, channels={any_r['channels']}, hidden={any_r['hidden']}, "
        "n_classes=10, units='relu', seed=0)`: Unflatten → [Conv3×3(pad 1) → ReLU clamp → AvgPool2] per stage → "
        "Flatten → Linear → ReLU → Linear. Same initial weights (seed 0) for every rule.\n"
        f"- Training: SGD (no momentum), batch {any_r['batch_size']}, {any_r['epochs']} epochs, the first "
        f"{any_r['n_train']} training images, the same seeded batch order for every rule; constant learning rate "
        "(column *lr*), no scheduler (the warm-up scheduler was not used). Each rule with its default options "
        "(`make_rule(name)`, the quadratic loss).\n"
        "- Test accuracy: after the last epoch, on the whole test split (10 000 images).\n"
        "- *train loss*: mean quadratic loss over the mini-batches of the last epoch run (forward pass).\n"
        "- *active*: `diagnostics.active_fraction(model, test_x)` at the end of training (fraction of hidden "
        "ReLU evaluations where the clamp is engaged, i.e. changes its input).\n"
        "- *epoch time / BP*: median training time per epoch (evaluation excluded) over the epochs, divided by "
        "back-propagation's, same process, `torch.set_num_threads(1)`, `OMP_NUM_THREADS=1`.\n"
        f"- *cos with BP at init*: `diagnostics.gradient_alignment(rule, model, x, labels)` at the initial weights on "
        f"the first {args.align_batch} training images, cosine per weight tensor (biases in the JSON files); "
        "*norm ratio* = ‖g_rule‖ / ‖g_BP‖ per weight tensor.\n"
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other work; "
        f"torch {torch.__version__}, Python {platform.python_version()}.\n")
    for dataset, rows in sorted(by_data.items()):
        rows = rule_order(rows, rules)
        plot_curves(dataset, rows, out)
        r0 = rows[0]
        parts.append(f"## {dataset}\n")
        parts.append(f"Data: `{r0['source']}`, image shape {tuple(r0['image_shape'])}, first {r0['n_train']} training "
                     f"images, {r0['n_test']} test images.\n")
        if dataset == "cifar10-gray":
            parts.append(f"Note: {CIFAR_NOTE}. Its test split is sorted by class; it is used whole.\n")
        parts.append(table(rows))
        warn = [(r["rule"], sum(w["count"] for w in r["solver_warnings"]), next((w["first"] for w in r["solver_warnings"] if w["first"]), None))
                for r in rows]
        warn = [w for w in warn if w[1]]
        if warn:
            parts.append("Solver warnings during training (count over all batches, first message):\n")
            parts += [f"- {w[0]}: {w[1]}, e.g. `{w[2]}`" for w in warn]
            parts.append("")
        parts.append("Test accuracy per epoch (epoch 0 = initial weights):\n")
        n = max(len(r["curve"]) for r in rows)
        parts.append("| rule | " + " | ".join(str(e) for e in range(n)) + " |")
        parts.append("|---|" + "---|" * n)
        for r in rows:
            parts.append(f"| {r['rule']} | " + " | ".join(f"{a:.3f}" for a in r["curve"]) + " |" * (n - len(r["curve"]) + 1))
        parts.append(f"\n![{dataset} learning curves]({dataset}_curves.png)\n")
    if args.notes_file and Path(args.notes_file).exists():
        parts.append(Path(args.notes_file).read_text())
    (out / "README.md").write_text("\n".join(parts))


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data_root = os.environ.get("INFERLEARN_DATA", "data")
    p.add_argument("--datasets", default="fashion-mnist,cifar10-gray")
    p.add_argument("--rules", default=DEFAULT_RULES, help="comma-separated NAME or NAME@LR (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--limit-train", type=int, default=4000, help="first N training images (default %(default)s)")
    p.add_argument("--channels", default="8-16", help="conv channels per stage, e.g. 8-16")
    p.add_argument("--hidden", default="64", help="dense hidden widths, e.g. 64 ('' for none)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lifted-lr", type=float, default=0.005, help="learning rate of plain 'lifted-j0'")
    p.add_argument("--diverge-loss", type=float, default=1e3,
                   help="stop a rule whose mean epoch train loss exceeds this (quadratic loss starts near 0.5)")
    p.add_argument("--align-batch", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--cifar-npz", default=os.path.join(data_root, "cifar10-gray", "cifar10_gray.npz"))
    p.add_argument("--force", action="store_true", help="rerun rules whose JSON says done")
    p.add_argument("--report-only", action="store_true", help="only rebuild README.md and the PNGs")
    p.add_argument("--report-command", default=None, help="command line to quote in the report (default: this one)")
    p.add_argument("--report-note", default="", help="extra paragraph for the report")
    p.add_argument("--notes-file", default=None, help="markdown appended to the report")
    args = p.parse_args(argv)
    args.channels = [int(c) for c in args.channels.split("-")]
    args.hidden = [int(h) for h in args.hidden.split("-")] if args.hidden else []
    args.command_line = args.report_command or ("python benchmarks/bench_conv.py " + " ".join(sys.argv[1:] if argv is None else argv))
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rules = [r for r in args.rules.split(",") if r]
    if "backprop" in rules:
        rules = ["backprop"] + [r for r in rules if r != "backprop"]
    if args.report_only:
        write_report(out, args, rules)
        return 0
    t_all = time.perf_counter()
    for dataset in [d for d in args.datasets.split(",") if d]:
        data = load(dataset, args)
        (out / data.name).mkdir(exist_ok=True)
        print(f"{data.name}: train {tuple(data.train_x.shape)}, test {tuple(data.test_x.shape)}, "
              f"image {data.image_shape}, from {data.source}", flush=True)
        for spec in rules:
            path = out / data.name / f"{spec.replace('@', '_lr')}.json"
            if path.exists() and not args.force and json.loads(path.read_text()).get("status") == "done":
                print(f"  [{data.name} {spec}] done already, skipped", flush=True)
                continue
            t0 = time.perf_counter()
            r = run_rule(data, spec, args, path)
            print(f"  [{data.name} {spec}] {r['status']} in {time.perf_counter() - t0:.0f} s", flush=True)
            write_report(out, args, rules)
    write_report(out, args, rules)
    print(f"total wall time {time.perf_counter() - t_all:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
