"""The nested surrogates against back-propagation on real data, over β.

On scikit-learn's digits (no download; 64-32-32-10 MLP, float64, the first 500 samples, quadratic loss on
one-hot targets, seed 0 initial weights), for each β: the relative gradient error ``max_k ‖∇_k − ∇_k^BP‖_∞ /
‖∇_k^BP‖_∞`` and the cosine of the flattened gradients with back-propagation's, the surrogate's value
minus the loss ``ℓ(z_L*)``, and the evaluation time, for

* ``L_TD``, the non-linearised top-down surrogate (``inferlearn.bilevel.topdown_surrogate``, all β_k = β);
* ``L_GC``, the bottom-up global contrastive surrogate with all β_k = β;
* ``L_GC`` with β_k = β·γ^{L−k}, γ = β (``layer_betas(β, L, β)``: β_1 ≪ … ≪ β_L);
* Fenchel back-propagation (``fenchel-bp``, the linearised top-down recursion), as the closed-form reference.

Usage::

    python benchmarks/bench_nested.py --act relu

(``--act hard-sigmoid`` gives the same table at these initial weights: no digit pre-activation reaches 1,
the largest is 0.90 in the first layer, so the hard sigmoid's upper bound is never active.)

Writes ``benchmarks/results/bench_nested_<act>.md``.
"""
from __future__ import annotations

import argparse
import sys
import time


import torch  # noqa: E402
from epoch_timing import RESULTS, environment  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch import nn  # noqa: E402

from inferlearn.bilevel.nested import bottomup_surrogate, layer_betas, topdown_surrogate  # noqa: E402
from inferlearn.rules import make_rule  # noqa: E402

ACTS = {"relu": nn.ReLU, "hard-sigmoid": lambda: nn.Hardtanh(0.0, 1.0)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--act", default="relu", choices=sorted(ACTS))
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--betas", default="0.1,0.03,0.01,0.003")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.data[:args.samples] / 16.0, dtype=torch.float64)
    labels = torch.tensor(d.target[:args.samples])
    y = torch.nn.functional.one_hot(labels, 10).to(torch.float64)
    act = ACTS[args.act]
    model = nn.Sequential(nn.Linear(64, 32), act(), nn.Linear(32, 32), act(), nn.Linear(32, 10)).double()
    params = list(model.parameters())

    def grads():
        return [q.grad.clone() for q in params]

    model.zero_grad()
    loss = 0.5 * (model(x) - y).pow(2).sum(1).mean()
    loss.backward()
    bp, loss = grads(), float(loss)
    flat_bp = torch.cat([g.flatten() for g in bp])

    def compare(g):
        err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g, bp))
        flat = torch.cat([a.flatten() for a in g])
        return err, float(flat @ flat_bp / (flat.norm() * flat_bp.norm()))

    rows = []
    for beta in (float(b) for b in args.betas.split(",")):
        variants = [("L_TD, β_k = β", topdown_surrogate, beta), ("L_GC, β_k = β", bottomup_surrogate, beta),
                    ("L_GC, β_k = β·β^{L−k}", bottomup_surrogate, layer_betas(beta, 3, beta))]
        for label, fn, b in variants:
            model.zero_grad()
            t0 = time.perf_counter()
            res = fn(model, x, y, b)
            res.value.backward()
            secs = time.perf_counter() - t0
            err, cos = compare(grads())
            rows.append((beta, label, err, cos, float(res.value.detach()) - loss, secs, [s.iterations for s in res.solves]))
        model.zero_grad()
        t0 = time.perf_counter()
        make_rule("fenchel-bp", {"beta": beta}).backward(model, x, labels)
        secs = time.perf_counter() - t0
        err, cos = compare(grads())
        rows.append((beta, "Fenchel BP (linearised L_TD)", err, cos, float("nan"), secs, []))
        for r in rows[-4:]:
            print(f"β={r[0]:g} {r[1]}: rel. error {r[2]:.3g}, cosine {r[3]:.5f}, value − ℓ {r[4]:.3g}, {r[5]:.3f}s {r[6]}",
                  flush=True)
    cmd = "python benchmarks/bench_nested.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["| β | surrogate | rel. gradient error | cosine with BP | value − ℓ | time (s) | sweeps |",
             "|---|---|---|---|---|---|---|"]
    for beta, label, err, cos, gap, secs, its in rows:
        gap_s = "—" if gap != gap else f"{gap:.4g}"
        lines.append(f"| {beta:g} | {label} | {err:.4f} | {cos:.6f} | {gap_s} | {secs:.3f} | {', '.join(map(str, its)) or '—'} |")
    text = (f"# Nested surrogates against back-propagation ({args.act})\n\nCommand: `{cmd}`\n\n"
            f"digits, 64-32-32-10 {args.act} MLP (float64, seed 0 initial weights), the first {args.samples} samples, "
            f"quadratic loss on one-hot targets (ℓ = {loss:.4f} at the forward pass); gradients at the initial weights; "
            f"{environment()}.\n\n" + "\n".join(lines) + "\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"bench_nested_{args.act.replace('-', '_')}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
