"""Small models that are not chains, shared by the contract table and the data-parallel oracle."""
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.units import Clamp


class ResidualConvNet(nn.Module):
    """A residual conv net: stem, one basic block ``relu(conv(relu(conv h)) + h)``, average pooling, linear."""

    def __init__(self):
        super().__init__()
        self.stem, self.r0 = nn.Conv2d(1, 3, 3, padding=1), nn.ReLU()
        self.c1, self.r1 = nn.Conv2d(3, 3, 3, padding=1), nn.ReLU()
        self.c2, self.r2 = nn.Conv2d(3, 3, 3, padding=1), Clamp("hard-sigmoid")
        self.pool, self.fc = nn.AvgPool2d(2), nn.Linear(12, 3)

    def forward(self, x):
        h = self.r0(self.stem(x.view(x.size(0), 1, 4, 4)))
        h = self.r2(self.c2(self.r1(self.c1(h))) + h)
        return self.fc(torch.flatten(self.pool(h), 1))


class BranchingNet(nn.Module):
    """Two branches concatenated, then a sum with a scaled skip from the input (functional activations)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 5), nn.Linear(16, 3)
        self.mix, self.skip, self.out = nn.Linear(8, 4), nn.Linear(16, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.cat([F.relu(self.a(x)), F.hardtanh(self.b(x), 0.0, 1.0)], dim=1)
        return self.out(F.relu(self.mix(h) + 0.5 * self.skip(x)))


class TracedUserNet(nn.Module):
    """A user's module with a plain forward (activation modules, a residual stream, a view): read by fx."""

    def __init__(self):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(16, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()

    def forward(self, x):
        h = self.inp(x.view(x.size(0), -1))
        h = h + self.hidden(self.act1(h)) / 2
        return self.out(self.act2(h))


class UserAttention(nn.Module):
    """A user's transformer block on 4 tokens of 4 features: attention as written by hand, a GELU MLP, mean pooling."""

    def __init__(self):
        super().__init__()
        self.embed, self.ln1, self.qkv, self.proj = nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 24), nn.Linear(8, 8)
        self.ln2, self.fc1, self.act, self.fc2 = nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x.unflatten(1, (4, 4)))
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        h = h + self.proj(torch.softmax(q @ k.transpose(1, 2) / 8 ** 0.5, dim=-1) @ v)
        h = h + self.fc2(self.act(self.fc1(self.ln2(h))))
        return self.head(h.mean(1))


GRAPH_MODELS = {"residual-conv": ResidualConvNet, "branching": BranchingNet, "traced": TracedUserNet}
