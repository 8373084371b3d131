"""Fenchel back-propagation against float64 autograd (the β → 0 limit) and its one-sided kinks."""
import pytest
import torch
from torch import nn

from inferlearn.diagnostics import rule_gradients
from inferlearn.models import MLP
from inferlearn.rules import BackProp, make_rule
from inferlearn.rules.fenchel import FenchelActivation, FenchelBackProp, convert_activations
from oracle_helpers import random_batch, relative_error as _rel

DT = torch.float64


def _batch(n_in=7, n_out=4, b=9, seed=0):
    return random_batch(n_in, n_out, b, seed)


@pytest.mark.parametrize("units", ["relu", "hard-sigmoid", "hard-tanh", "linear"])
@pytest.mark.parametrize("loss", ["quadratic", "cross-entropy"])
def test_mlp_fenchel_bp_equals_backprop_for_small_beta(units, loss):
    """β → 0 gives back-propagation (autograd, float64) for every MLP unit type and both losses.

    Guards against a wrong scaling of β (per-sample vs batch mean), a missing batch mean, or using
    the nudged activation as the forward activation."""
    model = MLP("7-6-5-4", units=units, seed=1, dtype=DT)
    x, labels = _batch()
    ref = rule_gradients(BackProp(loss=loss, fused=False), model, x, labels)
    got = rule_gradients(FenchelBackProp(beta=1e-7, loss=loss), model, x, labels)
    assert _rel(got, ref) < 1e-5


def test_finite_beta_differs_from_backprop_and_converges_linearly():
    """For finite β Fenchel BP is a different rule (the distance to BP shrinks with β, roughly
    linearly through the kinks it crosses); guards against a β that is silently ignored."""
    model = MLP("7-16-16-4", units="hard-sigmoid", seed=2, dtype=DT, init_scale=2.0)
    x, labels = _batch(b=32)
    ref = rule_gradients(BackProp(fused=False), model, x, labels)
    errs = [_rel(rule_gradients(FenchelBackProp(beta=b), model, x, labels), ref) for b in (1.0, 0.1, 0.01)]
    assert errs[0] > 1e-3 and errs[0] > errs[1] > errs[2]


def test_relu_kink_takes_the_loss_decreasing_one_sided_derivative():
    """At a = 0 exactly (Prop. 2), a ReLU passes g when g < 0 (z may grow) and blocks it when g > 0;
    autograd's ReLU'(0) = 0 would block both."""
    a = torch.zeros(2, 1, dtype=DT, requires_grad=True)
    act = FenchelActivation(nn.ReLU(), beta=1e-3)
    (act(a) * torch.tensor([[-1.0], [1.0]], dtype=DT)).sum().backward()
    # per-sample β' = β·2, g = ∓1 → δ = (0 − max(0, ±β'))/β'
    assert a.grad.flatten().tolist() == pytest.approx([-1.0, 0.0])


@pytest.mark.parametrize("act", [nn.ReLU(), nn.Hardsigmoid(), nn.Hardtanh(), nn.Sigmoid(), nn.Tanh(),
                                 nn.LeakyReLU(0.1), nn.ReLU6()])
def test_converted_sequential_matches_autograd_for_small_beta(act):
    """Any nn.Sequential with supported activation modules: the converted copy gives autograd's
    gradient as β → 0, shares the original parameters, and leaves the original model untouched."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 6, dtype=DT), act, nn.Linear(6, 5, dtype=DT), act, nn.Linear(5, 4, dtype=DT))
    x, labels = _batch()
    x = 3 * x
    ref = rule_gradients(BackProp(fused=False), model, x, labels)
    rule = FenchelBackProp(beta=1e-7)
    got = rule_gradients(rule, model, x, labels)
    assert _rel(got, ref) < 1e-5
    assert not any(isinstance(m, FenchelActivation) for m in model.modules())
    # the conversion shares parameters: gradients land in the model itself
    model.zero_grad()
    rule.backward(model, x, labels)
    assert all(p.grad is not None for p in model.parameters())


def test_smooth_activation_error_is_first_order_in_beta():
    """For sigmoid/tanh the finite difference has error O(β) (Prop. 1 with the linearised loss)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 6, dtype=DT), nn.Tanh(), nn.Linear(6, 4, dtype=DT))
    x, labels = _batch()
    ref = rule_gradients(BackProp(fused=False), model, x, labels)
    e1, e2 = (_rel(rule_gradients(FenchelBackProp(beta=b), model, x, labels), ref) for b in (0.02, 0.01))
    assert 1.7 < e1 / e2 < 2.3


def test_convert_in_place_and_plain_backward():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid(), nn.Linear(3, 2))
    conv = convert_activations(model, beta=0.5, inplace=True)
    assert conv is model and isinstance(model[1], FenchelActivation)
    model(torch.randn(4, 3)).sum().backward()
    assert model[0].weight.grad is not None


@pytest.mark.parametrize("beta", [0, 0.0, -0.1, float("nan"), float("inf")])
def test_invalid_beta(beta):
    """β = 0 divides by zero; β < 0 would flip the surrogate; non-finite β is meaningless."""
    with pytest.raises(ValueError, match="Invalid beta"):
        FenchelBackProp(beta=beta)
    with pytest.raises(ValueError, match="Invalid beta"):
        FenchelActivation(nn.ReLU(), beta=beta)


def test_cli_options_and_no_activation_error():
    assert make_rule("fenchel-bp", {"beta": "1/100"}).beta == pytest.approx(0.01)
    with pytest.raises(ValueError, match="No activation module"):
        convert_activations(nn.Linear(2, 2), beta=0.1)
