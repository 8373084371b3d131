"""Block-ADMM with a non-differentiable NMF layer between two blocks (DeepFacto, small).

A small MLP is split into blocks; an NMF module (z ≈ M s, M ≥ 0, s ≥ 0) of rank r factorises the
non-negative output of the first block, and the second block classifies from the scores s. Block-ADMM
trains all of it — the NMF layer has no gradient and is updated by its own multiplicative rules —
and the script prints the test accuracy per epoch and the sparsity of the scores.

Run:  python examples/admm_nmf.py                       # digits, 10 epochs, a few seconds
      python examples/admm_nmf.py --epochs 1             # a quick check
"""
import argparse

import torch
from torch import nn

from inferlearn.admm import NMF, ADMMConfig, BlockADMM, RunData, train_admm
from inferlearn.data import load_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()
    torch.manual_seed(0)
    data = load_dataset("digits")
    blocks = [nn.Sequential(nn.Linear(64, 48), nn.ReLU()),      # non-negative output for the NMF layer
              NMF(48, args.rank, seed=0),                       # s = argmin_{s ≥ 0} ‖z − M s‖²
              nn.Sequential(nn.Linear(args.rank, 10))]
    trainer = BlockADMM(blocks, ADMMConfig(batch_size=64, lr=1e-2, beta=[10.0, 10.0], zeta=[0.05, 0.05], seed=0))
    history = train_admm(trainer, RunData(data.train_x, data.train_y, data.test_x, data.test_y), args.epochs,
                         progress=False)
    for rec in history:
        print(f"epoch {rec['epoch']:2d}: test accuracy {rec['test_acc']:.4f}")
    with torch.no_grad():
        scores = blocks[1](blocks[0](data.test_x))
    print(f"scores exactly zero: {float((scores == 0).float().mean()):.2f}")


if __name__ == "__main__":
    main()
