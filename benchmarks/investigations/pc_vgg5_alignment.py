"""Why predictive coding trails back-propagation on VGG-5 at the CPU budget: its gradient's alignment with BP's.

The ``vgg5-cifar10`` benchmark at ``--budget cpu`` (``vgg5:width=0.0625``, 3 epochs, colour CIFAR-10) trains PC at
T = 7 inference steps of rate η = 0.1 (the rule's defaults, PCX's T) far below back-propagation. PC's weight
gradient equals BP's only at the inference's equilibrium, in the limit of small output errors; with few steps
the error reaches the first layers attenuated (one layer per step). This script measures, on one batch of the
benchmark's data (the first 128 training images, standardised per channel), the cosine between PC's gradient
and BP's for every weight of the network, at the benchmark's initialisation and after 100 steps of
back-propagation (AdamW, lr 3e-3, the benchmark's BP choice), for

* the output term: squared error (BP reference: quadratic loss) and cross-entropy (BP reference: cross-entropy);
* T ∈ {7, 20, 100} and η ∈ {0.1, 0.3, 0.5, 0.9} with plain steps (a row says *diverged* where the value nodes do), and value-node momentum (μ = 0.9) at T = 7.

With ``--runs OUT ...`` (folders of ``inferlearn benchmark`` runs: ``OUT/search``, ``OUT/final``) it also reads every
predictive-coding run's last checkpoint and reports the stability bound of its plain inference steps: along the
value node ``z_k`` the energy's curvature is at most ``λ_k = w_k + w_{k+1} ‖A_{k+1}‖²`` (the own term, and the child's
prediction through the next conv or linear map ``A_{k+1}``, max pooling and ReLU having slopes ≤ 1; ``w_L = π``), so gradient
steps of rate ``η`` are stable on every node when ``η < 2 / max_k λ_k``; the table gives ``η · max_k λ_k / 2``
(above 1: steps that can diverge) beside the run's accuracy.

Run (about 3 minutes on one thread)::

    OMP_NUM_THREADS=1 python benchmarks/investigations/pc_vgg5_alignment.py --data-dir DIR [--allow-unverified] [--runs OUT ...]

``DIR`` holds colour CIFAR-10 (``cifar-10-batches-py``); the lossy development copy needs ``--allow-unverified``,
and the output says which copy ran. Writes ``benchmarks/results/pc_vgg5_alignment.md``.
"""
from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path


import torch  # noqa: E402

from inferlearn.data import load_dataset  # noqa: E402
from inferlearn.data.transforms import channel_stats, standardize  # noqa: E402
from inferlearn.diagnostics import gradient_alignment  # noqa: E402
from inferlearn.errors import ConvergenceError  # noqa: E402
from inferlearn.models import build_model  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
ARCH, BATCH, TRAIN_STEPS, BP_LR = "vgg5:width=0.0625", 128, 100, 3e-3
GRID = [(t, eta, "sgd") for t in (7, 20, 100) for eta in (0.1, 0.3, 0.5, 0.9)] + [(7, 0.1, "momentum")]


def trained(model, x, y, loss: str):
    """``model`` after ``TRAIN_STEPS`` steps of back-propagation on the first ``TRAIN_STEPS × BATCH`` images."""
    model = copy.deepcopy(model)
    rule = make_rule("backprop", {"loss": loss})
    opt = torch.optim.AdamW(model.parameters(), lr=BP_LR, weight_decay=5e-4)
    for i in range(TRAIN_STEPS):
        sl = slice((i * BATCH) % len(x), (i * BATCH) % len(x) + BATCH)
        opt.zero_grad(set_to_none=True)
        rule.backward(model, x[sl], y[sl])
        opt.step()
    return model


def conv_norm_sq(weight: torch.Tensor, in_shape: tuple, iters: int = 50) -> float:
    """``‖A‖₂²`` of the convolution (3×3, padding 1, no bias) with ``weight`` on inputs of ``in_shape`` (C, H, W), by
    power iteration of ``AᵀA`` (conv, then its transpose); a lower bound that converges to it."""
    v = torch.ones(1, *in_shape, dtype=torch.float64)
    v.view(-1)[1::2] = -0.5
    w = weight.detach().double()
    lam = 0.0
    for _ in range(iters):
        u = torch.nn.functional.conv_transpose2d(torch.nn.functional.conv2d(v, w, padding=1), w, padding=1)
        lam = float((v * u).sum() / (v * v).sum())
        v = u / u.norm()
    return lam


def stability_rows(runs: Path, image_shape: tuple) -> list[str]:
    """One line per PC run in ``runs``: its options, accuracy, and ``η max_k λ_k / 2`` at its last checkpoint."""
    import json

    lines = ["", f"## Stability of the inference steps at the end of the PC runs of `{runs.name}`", "",
             "`η max λ / 2` above 1 means plain steps of rate η can diverge on some "
             "value node (the bound is an upper bound: ReLU and max pooling slopes of 1 everywhere).", "",
             "| run | lr | η | output | last val / test acc | max_k λ_k | η max λ / 2 |", "|---|---|---|---|---|---|---|"]
    for ck in sorted(runs.glob("*/pc-*/**/checkpoint.pt")):
        cfg = json.loads((ck.parent / "config.json").read_text())
        opts = cfg.get("rule_options", {})
        if cfg.get("rule") != "pc" or opts.get("weight_step") is not None:
            continue
        state = torch.load(ck, map_location="cpu", weights_only=False)
        sd, hist = state["model"], state["history"]
        weights = [v for k, v in sd.items() if k.endswith("weight") and v.dim() in (2, 4)]
        norms, size = [], image_shape[1]
        for i, wgt in enumerate(weights):   # each conv reads its input after the previous block's 2×2 pooling
            if i > 0:
                norms.append(conv_norm_sq(wgt, (wgt.shape[1], size, size)) if wgt.dim() == 4
                             else float(torch.linalg.matrix_norm(wgt.double(), 2)) ** 2)
            if wgt.dim() == 4:
                size //= 2
        pi = float(opts.get("output_weight", 1.0))
        lam = [1.0 + n for n in norms[:-1]] + [1.0 + pi * norms[-1]]
        eta = float(opts.get("step_size", 0.1))
        last = hist[-1]
        acc = f"{last.get('val_acc', float('nan')):.3f} / {last['test_acc']:.3f}" if last.get("val_acc") is not None \
            else f"— / {last['test_acc']:.3f}"
        name = str(ck.parent.relative_to(runs))
        lines.append(f"| {name} | {cfg['lr']:g} | {eta:g} | {opts.get('output', 'se')} | {acc} | {max(lam):.1f} | "
                     f"{eta * max(lam) / 2:.2f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-unverified", action="store_true")
    p.add_argument("--runs", type=Path, nargs="*", default=[],
                   help="inferlearn benchmark folders (vgg5-cifar10, mlp-mnist, ...) whose PC runs to read")
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_dataset("cifar10", args.data_dir, allow_unverified=args.allow_unverified)
    copy_note = ("the lossy JPEG-derived development copy (checksums differ from the published files)"
                 if caught else "checksums verified against the published files")
    mean, std = channel_stats(data.train_x, data.image_shape)
    x = standardize(data.train_x[:TRAIN_STEPS * BATCH], mean, std, data.image_shape)
    y = data.train_y[:TRAIN_STEPS * BATCH]
    xb, yb = x[:BATCH], y[:BATCH]
    base = build_model(ARCH, "relu", data.n_features, data.n_classes, data.image_shape, seed=0)
    rows = []
    for output, loss in (("se", "quadratic"), ("ce", "cross-entropy")):
        states = {"initialisation": base, f"after {TRAIN_STEPS} BP steps": trained(base, x, y, loss)}
        reference = make_rule("backprop", {"loss": loss})
        for state, model in states.items():
            for steps, eta, opt in GRID:
                options = {"steps": steps, "step_size": eta, "output": output}
                if opt != "sgd":
                    options["inference_optimizer"] = opt
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        res = gradient_alignment(make_rule("pc", options), model, xb, yb, reference)
                    except ConvergenceError:   # the value nodes diverged: η too large for this network
                        rows.append((output, state, steps, eta, opt, None, None))
                        continue
                weights = [r for r in res if r["param"].endswith("weight")]
                names = [r["param"] for r in weights]
                rows.append((output, state, steps, eta, opt, [r["cosine"] for r in weights],
                             weights[0]["norm_ratio"]))
    lines = ["# Predictive coding's gradient against back-propagation's on VGG-5 (CPU budget width)", "",
             "Command: `OMP_NUM_THREADS=1 python benchmarks/investigations/pc_vgg5_alignment.py --data-dir DIR "
             "--allow-unverified" + "".join(f" --runs {r.name}" if i == 0 else f" {r.name}" for i, r in enumerate(args.runs))
             + "`" + (" (the `--out` folders of the `inferlearn benchmark` commands their tables name)" if args.runs else ""), "",
             f"Model `{ARCH}` (the `vgg5-cifar10` CPU budget's), seed 0, ReLU; one batch of the first {BATCH} "
             f"colour CIFAR-10 training images ({copy_note}), standardised per channel; float32. Cosine between PC's "
             "weight gradient and back-propagation's (the same output loss) per weight, first conv to the linear "
             f"head (`{'`, `'.join(names)}`), at the benchmark's initialisation and after {TRAIN_STEPS} BP steps "
             f"(AdamW, lr {BP_LR:g}); *‖g₁‖ ratio*: PC's first-conv gradient norm over BP's. "
             f"Wall time {(time.time() - t0) / 60:.1f} min.", "",
             "| output | state | T | η | value nodes | " + " | ".join(f"cos {i + 1}" for i in range(len(names)))
             + " | ‖g₁‖ ratio |",
             "|---|---|---|---|---|" + "---|" * len(names) + "---|"]
    for output, state, steps, eta, opt, cosines, ratio in rows:
        if cosines is None:
            lines.append(f"| {output} | {state} | {steps} | {eta:g} | {opt} | " + " | ".join(["—"] * len(names))
                         + " | diverged |")
            continue
        lines.append(f"| {output} | {state} | {steps} | {eta:g} | {opt} | "
                     + " | ".join(f"{c:.3f}" for c in cosines) + f" | {ratio:.3g} |")
    for runs in args.runs:
        shape = data.image_shape if (runs / "benchmark.json").read_text().find('"cifar10"') >= 0 else (1, 28, 28)
        lines += stability_rows(runs, shape)
    out = RESULTS / "pc_vgg5_alignment.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
