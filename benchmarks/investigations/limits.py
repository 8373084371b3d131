"""What the small-signal limits of three rules are, measured (float64, the library's public API).

    python benchmarks/investigations/limits.py      # about a minute on one thread

Writes ``benchmarks/results/limits.md``. Three statements of the docs rest on it:

1. **Equilibrium propagation as β → 0** is implicit differentiation of the loss through the *lifted* free
   equilibrium, not back-propagation: the β-sweep converges (symmetric nudging, error O(β²)) to a limit that
   stays a γ-dependent distance from back-propagation's gradient, shrinking as γ → 0.
2. **The argmin layer's contrastive surrogate** is exact for a quadratic energy only without active
   constraints: with a box, a nudge of size β switches coordinates between active and free, an O(β) bias
   against implicit differentiation (symmetric nudging as well).
3. **Predictive coding at the hard clamp with small steps** is not back-propagation: after ``T`` steps of
   ``η`` from the forward pass, layer ``d`` below the output has received the output error only to order
   ``C(T, d) η^d ≈ (ηT)^d / d!``, so its gradient's norm relative to back-propagation's shrinks like that.

Data: the first 64 MNIST training images (``INFERLEARN_DATA``), MLP 784-32-32-32-10 (ReLU, the library's
initialisation, seed 0); for the argmin layer a non-negative least-squares code layer.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from inferlearn.bilevel import ArgminLayer, Box, LeastSquaresEnergy
from inferlearn.data import load_dataset
from inferlearn.models import MLP
from inferlearn.rules import make_rule

OUT = Path(__file__).resolve().parents[1] / "results" / "limits.md"
DT = torch.float64


def grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def layer_grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return [l.weight.grad.clone() for l in model.layers]


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def eqprop_section(x, labels) -> list[str]:
    lines = ["## Equilibrium propagation: the β → 0 limit", "",
             "Relative distance of EqProp's weight gradient (symmetric nudging, block-pg at tol 1e-12) from its "
             "smallest-β value (the limit) and from back-propagation's, per feedback weight γ.", "",
             "| γ | β | distance from the β = 1e-5 limit | distance from back-propagation |", "|---|---|---|---|"]
    model = MLP("784-32-32-32-10", units="relu", seed=0, dtype=DT)
    bp = grads(make_rule("backprop", {}), model, x, labels)
    for gamma in (0.5, 0.125, 1 / 32):
        opts = {"gamma": gamma, "nudging": "symmetric", "tol": 1e-12, "max_iter": 20000, "phases": "direct"}
        limit = grads(make_rule("eqprop", opts | {"beta": 1e-5}), model, x, labels)
        for beta in (1e-1, 1e-2, 1e-3, 1e-5):
            g = limit if beta == 1e-5 else grads(make_rule("eqprop", opts | {"beta": beta}), model, x, labels)
            lines.append(f"| {gamma:g} | {beta:g} | {rel(g, limit):.2e} | {rel(g, bp):.2e} |")
    return lines


def argmin_section() -> list[str]:
    lines = ["## The argmin layer with a box: contrastive against implicit differentiation", "",
             "NNLS codes `z = argmin_{z ≥ 0} ½‖Dz − y‖² + 0.05‖z‖²` (D 32×24, entries 0.3·N(0,1), 50 inputs "
             "y ~ N(0,1)), loss ½‖z − t‖²; relative distance of the contrastive gradient (w.r.t. D and y) from "
             "the implicit one, with and without the box (without it the energy is a plain quadratic).", "",
             "| box | nudging | β | distance from implicit |", "|---|---|---|---|"]
    gen = torch.Generator().manual_seed(0)
    D0 = 0.3 * torch.randn(32, 24, generator=gen, dtype=DT)
    y0 = torch.randn(50, 32, generator=gen, dtype=DT)
    t = torch.randn(50, 24, generator=gen, dtype=DT)

    def grad(box, backward, nudging="symmetric", beta=1e-3):
        y = y0.clone().requires_grad_(True)
        layer = ArgminLayer(LeastSquaresEnergy(D0.clone(), ridge=0.1), box, beta=beta, nudging=nudging,
                            backward=backward)
        (0.5 * (layer(y) - t).pow(2).sum(1).mean()).backward()
        D = next(layer.parameters())
        return torch.cat([D.grad.flatten(), y.grad.flatten()])

    for name, box in (("z ≥ 0", Box.nonnegative()), ("none", None)):
        ref = grad(box, "implicit")
        for nudging in ("symmetric", "positive"):
            for beta in (1e-1, 1e-2, 1e-3, 1e-4):
                lines.append(f"| {name} | {nudging} | {beta:g} | {rel(grad(box, 'contrastive', nudging, beta), ref):.2e} |")
    return lines


def pc_section(x, labels) -> list[str]:
    lines = ["## Predictive coding at the hard clamp, small steps", "",
             "Norm of each layer's weight gradient relative to back-propagation's after T steps of η from the "
             "forward pass (output clamped to the one-hot label, π = 1), against C(T, d) η^d ≈ (ηT)^d/d! for the "
             "layer d levels below the output (the leading term of the error recursion).", "",
             "| ηT (η × T) | layer (d below output) | ‖∇PC‖ / ‖∇BP‖ | C(T, d) η^d | cosine with BP |", "|---|---|---|---|---|"]
    model = MLP("784-32-32-32-10", units="relu", seed=0, dtype=DT)
    bp = layer_grads(make_rule("backprop", {}), model, x, labels)
    L = len(bp)
    for eta, T in ((0.005, 10), (0.02, 10), (0.1, 10), (0.1, 100)):
        pc = layer_grads(make_rule("pc", {"steps": T, "step_size": eta}), model, x, labels)
        for k in range(L):
            d = L - 1 - k
            cos = float((pc[k] * bp[k]).sum() / (pc[k].norm() * bp[k].norm() + 1e-300))
            lines.append(f"| {eta * T:g} ({eta:g} × {T}) | {k + 1} ({d}) | {float(pc[k].norm() / bp[k].norm()):.3g} | "
                         f"{math.comb(T, d) * eta ** d:.3g} | {cos:.3f} |")
    return lines


def main() -> int:
    torch.set_num_threads(1)
    ds = load_dataset("mnist")
    x = ds.train_x[:64].to(DT).flatten(1)
    labels = ds.train_y[:64]
    import warnings
    from inferlearn.errors import InferlearnWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InferlearnWarning)   # the PC rows are far from equilibrium on purpose
        body = eqprop_section(x, labels) + [""] + argmin_section() + [""] + pc_section(x, labels)
    head = ["# Small-signal limits: equilibrium propagation, the argmin layer, predictive coding", "",
            "Made by `python benchmarks/investigations/limits.py` (float64; first 64 MNIST training images, "
            "MLP 784-32-32-32-10, ReLU, seed 0).", ""]
    OUT.write_text("\n".join(head + body) + "\n")
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
