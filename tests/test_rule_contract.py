"""The contract every registered rule obeys (table-driven, like optax's tests).

For each rule × {SGD, Adam}: ``.grad`` is filled (finite) for every trainable parameter, the rule
never changes parameters, two calls accumulate, a fixed seed gives the same gradients, and an
optimiser step on the rule's gradient changes the weights. New rules join automatically.
"""
import copy

import pytest
import torch

from inferlearn.models import MLP
from inferlearn.rules import RULES, make_rule

OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.01), "adam": lambda p: torch.optim.Adam(p, lr=0.01)}


def _setup(name):
    rule = make_rule(name)
    model = MLP(rule.adapt_sizes([6, 5, 5, 3]), "relu", seed=3)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(8, 6, generator=gen)
    labels = torch.randint(0, 3, (8,), generator=gen)
    return rule, model, x, labels


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_rule_contract(name, opt_name):
    """Guards against rules that step themselves, forget a parameter, overwrite instead of accumulate,
    or depend on hidden global state."""
    rule, model, x, labels = _setup(name)
    before = copy.deepcopy(model.state_dict())
    opt = OPTIMIZERS[opt_name](model.parameters())
    opt.zero_grad(set_to_none=True)
    info = rule.backward(model, x, labels)
    assert info.output.shape == (8, 3)
    assert torch.isfinite(torch.tensor(info.loss))
    for (pname, p) in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient for {pname}"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{name} changed parameter {k}"
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert any(g.abs().sum() > 0 for g in first.values()), f"{name} produced an all-zero gradient"

    rule.backward(model, x, labels)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n], rtol=1e-5, atol=1e-7, msg=f"{name} does not accumulate {n}")

    rule2, model2, x2, labels2 = _setup(name)
    rule2.backward(model2, x2, labels2)
    for n, p in model2.named_parameters():
        torch.testing.assert_close(p.grad, first[n], rtol=0, atol=0, msg=f"{name} is not deterministic for {n}")

    opt.step()
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
