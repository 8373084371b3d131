"""Predictive coding on your own conv net, side by side with back-propagation.

A plain ``nn.Sequential`` conv net (conv → ReLU → max pooling: predictive coding takes any
differentiable layer) is trained with the rule ``pc`` (T = 15 inference steps per batch) and with
``backprop`` from the same initial weights; the script prints test accuracy after each epoch and the
per-layer cosine between the two rules' gradients at the start.

Run:  python examples/pc_conv.py                      # Fashion-MNIST if installed, else digits
      python examples/pc_conv.py --data digits --epochs 1 --limit 300   # a quick check
"""
import argparse
import copy

import torch
from torch import nn

from inferlearn.data import load_dataset
from inferlearn.diagnostics import evaluate, gradient_alignment
from inferlearn.errors import DataError
from inferlearn.rules import make_rule


def conv_net(image_shape, n_classes: int) -> nn.Sequential:
    """Your model: any layered nn.Sequential works with predictive coding."""
    c, h, w = image_shape
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * (h // 4) * (w // 4), 64), nn.ReLU(), nn.Linear(64, n_classes))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--limit", type=int, default=10000, help="training images used")
    args = p.parse_args()
    torch.manual_seed(0)
    try:
        data = load_dataset(args.data)
    except DataError:
        print(f"{args.data} not found; using scikit-learn's digits")
        data = load_dataset("digits")
    x, y = data.train_x[:args.limit], data.train_y[:args.limit]
    base = conv_net(data.image_shape, data.n_classes)
    cos = gradient_alignment(make_rule("pc"), base, x[:200], y[:200])
    print("cosine of pc's gradient with backprop's at init:", [round(r["cosine"], 3) for r in cos])
    for name in ("backprop", "pc"):
        model, rule = copy.deepcopy(base), make_rule(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
            for i in range(0, len(y), 50):
                idx = order[i:i + 50]
                opt.zero_grad()
                rule.backward(model, x[idx], y[idx])
                opt.step()
            print(f"{name:8s} epoch {epoch}: test accuracy {evaluate(model, data.test_x, data.test_y):.4f}")


if __name__ == "__main__":
    main()
