"""ePC's weight gradients on the vit-mnist transformer against AdamW's ε: the median |∂/∂W| of a hidden layer
(``blocks.0.fc1``) and of the head, for back-propagation and ePC (K = 5) at several error steps η, on the first
batch of 128 MNIST training images at the protocol's initialisation.

In the small-step regime ePC's hidden gradients are about ``η K`` times back-propagation's; where they fall near
AdamW's ``eps = 1e-8`` the optimiser damps those layers' updates.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/investigations/epc_vit_adam_eps.py

Writes ``benchmarks/results/epc_vit_adam_eps.md``.
"""
from pathlib import Path
import warnings

import torch

from inferlearn.data import load_dataset
from inferlearn.models.zoo import build_zoo_model
from inferlearn.rules import make_rule

ARCH = "vit:depth=2,width=32,heads=2,patch=7,pool=mean,act=gelu"
OUT = Path(__file__).resolve().parents[1] / "results" / "epc_vit_adam_eps.md"


def main() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    d = load_dataset("mnist")
    x = d.train_x[:128].float().reshape(128, -1)
    x = x / 255 if x.max() > 2 else x
    y = d.train_y[:128]
    rows = []
    for label, name, opts in [("BP (CE)", "backprop", {"loss": "cross-entropy"})] + [
            (f"ePC (CE), η = {eta:g}", "epc", {"output": "ce", "step_size": eta}) for eta in (1e-4, 1e-5, 1e-6)]:
        model = build_zoo_model(ARCH, (1, 28, 28), 10, seed=0)
        make_rule(name, opts).backward(model, x, y)
        grads = dict(model.named_parameters())
        rows.append(f"| {label} | {float(grads['blocks.0.fc1.weight'].grad.abs().median()):.3g} | "
                    f"{float(grads['head.weight'].grad.abs().median()):.3g} |")
    OUT.write_text("# ePC's weight gradients on the vit-mnist transformer, against AdamW's ε = 1e-8\n\n"
                   "Made by `python benchmarks/investigations/epc_vit_adam_eps.py` (first batch of 128 MNIST images, "
                   f"`{ARCH}`, seed 0).\n\n| rule | median abs gradient, blocks.0.fc1.weight | median abs gradient, "
                   "head.weight |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
