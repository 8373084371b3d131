"""BatchNorm in training mode and dropout inside predictive coding's and ePC's predictions.

Oracles: predictive coding and ePC written in a few lines of autograd with the batch statistics in the predictions
(``F.batch_norm(..., training=True)``) and with the dropout mask the rule drew (the same generator state); the running
statistics equal to one forward pass's update (back-propagation's).
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.models.zoo import build_zoo_model
from inferlearn.rules import make_rule

DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")   # short trajectories


def _bn_net(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(),
                          nn.Linear(4, 3)).to(DT)
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.3, 0.3)
    return model.train()


def _data(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=DT), torch.randint(0, 3, (n,), generator=g)


def _bn(bn, a):
    return F.batch_norm(a, None, None, bn.weight, bn.bias, training=True, eps=bn.eps)


def _bn_prediction(m, x, k, zs):
    """Node ``k``'s prediction (0-based) from the nodes before it."""
    return torch.tanh(_bn(m[1], m[0](x))) if k == 0 else torch.tanh(_bn(m[4], m[3](zs[0])))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _few_line(model, x, y, prediction, steps, eta, errors: bool):
    """PC (``errors=False``) or ePC in a few lines: two value nodes (or their errors), the output ``Linear`` on the
    last; ``prediction(model, x, k, zs)`` is node ``k``'s prediction from the nodes before it."""
    head = model[-1]
    loss = lambda o: 0.5 * (o - y).pow(2).sum()   # noqa: E731

    def states(es):
        zs = []
        for k, e in enumerate(es):
            zs.append(prediction(model, x, k, zs) + e)
        return zs

    def state_energy(zs):
        return sum(0.5 * (z - prediction(model, x, k, zs)).pow(2).sum() for k, z in enumerate(zs)) + loss(head(zs[-1]))

    with torch.no_grad():
        fwd = states([0.0, 0.0])

    if errors:
        vs = [torch.zeros_like(z, requires_grad=True) for z in fwd]
        energy = lambda vs: 0.5 * sum(e.pow(2).sum() for e in vs) + loss(head(states(vs)[-1]))   # noqa: E731
    else:
        vs = [z.clone().requires_grad_(True) for z in fwd]
        energy = state_energy
    for _ in range(steps):
        grads = torch.autograd.grad(energy(vs), vs)
        with torch.no_grad():
            for v, g in zip(vs, grads):
                v -= eta * g
    with torch.no_grad():
        zs = states(vs) if errors else [v.detach() for v in vs]
    model.zero_grad(set_to_none=True)
    (state_energy(zs) / x.shape[0]).backward()
    return _grads(model), zs


@pytest.mark.parametrize("rule", ["pc", "epc"])
def test_batchnorm_in_training_mode_equals_few_line_autograd_with_batch_statistics(rule):
    """Guards the batch coupling (each sample's prediction reads the batch's statistics of the current value nodes,
    and the value-node gradient sums over the batch) and the running statistics updated once, as one forward pass."""
    model, ref_model = _bn_net(), _bn_net()
    x, labels = _data()
    y = F.one_hot(labels, 3).to(DT)
    expected = copy.deepcopy(model)
    with torch.no_grad():
        expected(x)   # one forward pass in training mode: back-propagation's update of the running statistics
    ref, ref_nodes = _few_line(ref_model, x, y, _bn_prediction, steps=8, eta=0.1, errors=rule == "epc")
    model.zero_grad(set_to_none=True)
    info = make_rule(rule, {"steps": 8, "step_size": 0.1}).backward(model, x, labels)
    for a, b in zip(_grads(model), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    for a, b in zip(info.extras["hidden"], ref_nodes, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    for got, want in ((model[1], expected[1]), (model[4], expected[4])):
        torch.testing.assert_close(got.running_mean, want.running_mean, rtol=0, atol=1e-14)
        torch.testing.assert_close(got.running_var, want.running_var, rtol=0, atol=1e-14)
        assert int(got.num_batches_tracked) == 1 and got.track_running_stats


def _drop_net(seed=0, p=0.4):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Dropout(p), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).to(DT)


@pytest.mark.parametrize("rule", ["pc", "epc"])
def test_dropout_holds_one_mask_per_batch_through_inference(rule):
    """Guards a mask redrawn at every inference step (a different network at each step) or one that leaks into the
    next batch: the rule equals few-line autograd with the one mask the rule drew from the same generator state."""
    model, ref_model = _drop_net(), _drop_net()
    x, labels = _data()
    y = F.one_hot(labels, 3).to(DT)
    torch.manual_seed(123)
    mask = torch.empty(x.shape[0], 5, dtype=DT).bernoulli_(0.6).div_(0.6)

    def prediction(m, x, k, zs):
        return torch.tanh(m[0](x)) if k == 0 else torch.tanh(m[3](zs[0] * mask))

    ref, ref_nodes = _few_line(ref_model, x, y, prediction, steps=8, eta=0.1, errors=rule == "epc")
    torch.manual_seed(123)
    model.zero_grad(set_to_none=True)
    info = make_rule(rule, {"steps": 8, "step_size": 0.1}).backward(model, x, labels)
    for a, b in zip(_grads(model), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert "forward" not in vars(model[2])   # the module is restored
    torch.manual_seed(7)
    model.zero_grad(set_to_none=True)
    make_rule(rule, {"steps": 8, "step_size": 0.1}).backward(model, x, labels)
    assert not torch.allclose(_grads(model)[2], ref[2])   # a new batch draws a new mask


@pytest.mark.parametrize("name", ["pc", "mac", "lpom"])
def test_dropout_in_eval_mode_is_the_identity_for_every_rule(name):
    x, labels = _data()
    plain = nn.Sequential(*[m for m in _drop_net() if not isinstance(m, nn.Dropout)])
    dropped = _drop_net().eval()
    if name == "lpom":   # box units for the lifted energies
        plain, dropped = (nn.Sequential(*[nn.ReLU() if isinstance(m, nn.Tanh) else m for m in net])
                          for net in (plain, dropped))
    for m in (plain, dropped):
        m.zero_grad(set_to_none=True)
        make_rule(name).backward(m, x, labels)
    for a, b in zip(_grads(plain), _grads(dropped), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name,model,match", [
    ("mac", _bn_net, r"module '1' \(BatchNorm1d\) in training mode: it mixes the samples"),
    ("contrastive", _bn_net, r"module '1' \(BatchNorm1d\).*not affine"),
    ("mac", _drop_net, r"module '2' \(Dropout\) in training mode: it is random"),
])
def test_other_energy_rules_refuse_batch_layers_in_training_mode_in_one_line(name, model, match):
    x, labels = _data()
    with pytest.raises(ValueError, match=match) as err:
        make_rule(name).backward(model(), x, labels)
    assert "\n" not in str(err.value)


def test_stacked_nudged_phases_refuse_batchnorm_in_training_mode():
    x, labels = _data()
    with pytest.raises(ValueError, match=r"nudging='symmetric' solves its 2 phases as one stacked batch") as err:
        make_rule("pc", {"nudging": "symmetric"}).backward(_bn_net(), x, labels)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("rule", ["pc", "epc", "backprop"])
def test_resnet18_with_batchnorm_in_training_mode_trains_and_updates_running_statistics_once(rule):
    model = build_zoo_model("resnet18:width=1/16,bn=train", (3, 8, 8), 10, seed=0).train()
    x, labels = torch.randn(6, 3 * 8 * 8), torch.randint(0, 10, (6,))
    make_rule(rule).backward(model, x, labels)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(int(m.num_batches_tracked) == 1 and m.track_running_stats for m in norms)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
