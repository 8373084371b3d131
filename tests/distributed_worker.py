"""Run by ``tests/distributed/test_distributed.py`` under the elastic launcher (2 processes on loopback).

For every registered rule, on the MLP, a conv net, a residual conv net, a vision transformer and a user's attention
block (the rules that read them), in float64: the gradient averaged over the
ranks' shards (:meth:`Group.average_gradients`) must equal the gradient one process computes on the
whole batch. Rank 0 writes ``{rule/model: max relative error}`` as JSON to ``argv[1]``.
"""
import sys

import torch
from torch import nn

from inferlearn.distributed import join
from graph_models import GRAPH_MODELS, UserAttention
from oracle_helpers import finish_worker
from inferlearn.models import MLP
from inferlearn.models.zoo import build_zoo_model
from inferlearn.rules import RULES, make_rule

MODELS = {
    "mlp": lambda: MLP([16, 8, 8, 3], "relu", seed=3),
    "conv": lambda: nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(),
                                  nn.AvgPool2d(2), nn.Flatten(), nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 3)),
    "residual-conv": GRAPH_MODELS["residual-conv"],
    "vit": lambda: build_zoo_model("vit:depth=1,width=8,heads=2,patch=2,pool=cls,act=gelu", (1, 4, 4), 3, seed=3),
    "user-attention": UserAttention,
}


def grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def main(out: str) -> None:
    torch.set_num_threads(1)
    group = join("cpu", timeout_s=60)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(11, 16, generator=gen, dtype=torch.float64)   # 11 rows: shards of 6 and 5
    labels = torch.randint(0, 3, (11,), generator=gen)
    errors = {}
    for name in sorted(RULES):
        for model_name, make in MODELS.items():
            torch.manual_seed(3)
            model = make().double()
            rule = make_rule(name)
            model.zero_grad(set_to_none=True)
            try:
                full_loss = rule.backward(model, x, labels).loss
            except ValueError:   # a lifted rule refusing attention (the same on every rank)
                continue
            full = grads(model)
            model.zero_grad(set_to_none=True)
            rows = group.shard(torch.arange(11))
            loss = rule.backward(model, x[rows], labels[rows]).loss
            loss = group.average_gradients(list(model.parameters()), len(rows), 11, loss)
            err = float((grads(model) - full).norm() / full.norm())
            errors[f"{name}/{model_name}"] = max(err, abs(loss - full_loss) / abs(full_loss))
    finish_worker(group, errors, out)


if __name__ == "__main__":
    main(sys.argv[1])
