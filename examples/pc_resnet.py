"""Predictive coding on your own ResNet, side by side with back-propagation.

A small residual network written as an ordinary ``nn.Module`` — a stem, two basic blocks
``relu(conv(relu(conv h)) + shortcut(h))`` (the second one downsamples through a 1×1 strided conv),
2×2 average pooling and a linear read-out — is read by the library as a graph (``torch.fx``): a value node
after every activation, and a block's output node sums its branch and its skip connection. It is trained
with ``pc`` and with ``backprop`` from the same initial weights (Adam, lr 1e-3); the script prints the graph it read,
the per-layer cosine between the two rules' gradients at the start, and test accuracy after each epoch.

Run:  python examples/pc_resnet.py                      # MNIST if found, else digits
      python examples/pc_resnet.py --data digits --epochs 1 --limit 300   # a quick check
"""
import argparse
import copy

import torch
from torch import nn

from inferlearn import read_graph
from inferlearn.data import load_dataset
from inferlearn.diagnostics import evaluate, gradient_alignment
from inferlearn.errors import DataError
from inferlearn.rules import make_rule


class Block(nn.Module):
    """A basic residual block: ``relu(conv(relu(conv h)) + shortcut(h))``."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride=stride)

    def forward(self, h):
        return self.relu2(self.conv2(self.relu1(self.conv1(h))) + self.shortcut(h))


class SmallResNet(nn.Module):
    """Your model: any traceable nn.Module works with predictive coding."""

    def __init__(self, image_shape, n_classes: int, width: int = 8):
        super().__init__()
        self.shape = tuple(image_shape)
        self.stem, self.relu = nn.Conv2d(image_shape[0], width, 3, padding=1), nn.ReLU()
        self.block1, self.block2 = Block(width, width), Block(width, 2 * width, stride=2)
        side = lambda n: (n + 1) // 2 // 2   # noqa: E731  (the strided block, then the pooling)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(2 * width * side(image_shape[1]) * side(image_shape[2]), n_classes)

    def forward(self, x):
        h = self.relu(self.stem(x.view(x.size(0), *self.shape)))
        h = self.block2(self.block1(h))
        return self.fc(torch.flatten(self.pool(h), 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, default=5000, help="training images used")
    args = p.parse_args()
    torch.manual_seed(0)
    try:
        data = load_dataset(args.data)
    except DataError:
        print(f"{args.data} not found; using scikit-learn's digits")
        data = load_dataset("digits")
    x, y = data.train_x[:args.limit], data.train_y[:args.limit]
    base = SmallResNet(data.image_shape, data.n_classes)
    graph = read_graph(base, example=x[:2])
    print(f"read as a graph of {graph.depth} nodes; node inputs:", [link.sources for link in graph.nodes])
    cos = gradient_alignment(make_rule("pc"), base, x[:200], y[:200])
    print("cosine of pc's gradient with backprop's at init:", [round(r["cosine"], 3) for r in cos])
    for name in ("backprop", "pc"):
        model, rule = copy.deepcopy(base), make_rule(name)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # the same optimiser and rate for both rules
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
