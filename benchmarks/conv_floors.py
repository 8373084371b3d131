"""Multiply-add floors of PC's and ePC's epoch time over back-propagation's, on the benchmark's conv and transformer
models.

The multiply-adds per image of each ``Conv2d``/``Linear`` of the actual zoo model are counted by forward hooks (a
``Linear`` once per token), and each self-attention's two products ``QKᵀ`` and ``AV`` as ``2 n² d`` for ``n`` tokens of
width ``d`` (``Σ`` all of them, ``Σ₁`` all but the first layer, whose input gradient no rule needs). Per training step:

- back-propagation: forward ``Σ``, weight gradients ``Σ``, input gradients ``Σ₁``: ``2Σ + Σ₁``;
- predictive coding, ``T`` steps: forward ``Σ``, each step the predictions and their adjoint ``2Σ₁``, then the final
  predictions and weight gradients ``2Σ + Σ₁`` less the forward already done: ``2Σ + (2T + 1)Σ₁``
  (``benchmarks/epoch_timing.py``'s count for chains);
- ePC, ``K`` error steps: each a forward pass with the errors injected and a VJP from the top (``Σ + Σ₁``), then
  the states' forward pass and the weight gradient (``3Σ``): ``K(Σ + Σ₁) + 3Σ``.

Element-wise work (activations, pooling, normalisation, softmax, the value nodes' updates) is not counted: the floor is a lower bound of
the ratio a perfect implementation of the same algorithm would reach.

Run:  python benchmarks/conv_floors.py   → benchmarks/results/conv_floors.md
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from inferlearn.models import build_model

#: (model, input shape): the conv benchmarks' and the transformers' (vit-mnist, vit-cifar10) at --budget cpu
MODELS = (("vgg5:width=0.125", (3, 32, 32)), ("vgg7:width=0.125", (3, 32, 32)), ("resnet18:width=0.125", (3, 32, 32)),
          ("vit:depth=2,width=32,heads=2,patch=7,pool=mean,act=gelu", (1, 28, 28)),
          ("vit:depth=4,width=32,heads=4,patch=4,pool=cls,act=gelu", (3, 32, 32)))
OUT = Path(__file__).resolve().parent / "results" / "conv_floors.md"


def layer_macs(arch: str, shape: tuple = (3, 32, 32)) -> list[int]:
    """Multiply-adds per image of each Conv2d / Linear / self-attention of ``arch`` on images of ``shape``, in call
    order."""
    from inferlearn.models.vit import SelfAttention

    features = shape[0] * shape[1] * shape[2]
    model = build_model(arch, "relu", features, 10, shape)
    counts: list[int] = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            k = module.weight[0].numel()   # (C_in / groups) · kh · kw
            counts.append(int(output[0].numel() * k))
        elif isinstance(module, nn.Linear):
            counts.append(int(output[0].numel() * module.in_features))   # per token
        else:   # softmax(QKᵀ) V: two n × n × d products over the heads
            n, d = inputs[0].shape[-2], inputs[0].shape[-1]
            counts.append(2 * n * n * d)

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear, SelfAttention)):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, features))
    return counts


def floors(counts: list[int], steps: int = 8, k: int = 5) -> dict:
    total, upper = sum(counts), sum(counts) - counts[0]
    bp = 2 * total + upper
    return {"macs": total, "pc": (2 * total + (2 * steps + 1) * upper) / bp, "epc": (k * (total + upper) + 3 * total) / bp}


def main() -> None:
    lines = ["# Multiply-add floors of the conv and transformer benchmarks", "",
             "Made by `python benchmarks/conv_floors.py` (the counting rule is in its docstring).", "",
             "T = 7 and 8 are PCX's VGG-5 recipes' inference steps (PC-SE, PC-CE), T = 11 its VGG-7 PC-CE recipe's.", "",
             "| model | multiply-adds / image | PC / BP, T = 7 | PC / BP, T = 8 | PC / BP, T = 11 | ePC / BP, K = 5 |",
             "|---|---|---|---|---|---|"]
    for arch, shape in MODELS:
        c = layer_macs(arch, shape)
        f7, f8, f11 = floors(c, 7), floors(c, 8), floors(c, 11)
        lines.append(f"| `{arch}` | {f8['macs'] / 1e6:.2f} M | {f7['pc']:.2f} | {f8['pc']:.2f} | {f11['pc']:.2f} | "
                     f"{f8['epc']:.2f} |")
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
