"""Oracle: BackProp's gradients equal plain autograd of the loss, in float64."""
import pytest
import torch

from inferlearn.models import MLP
from inferlearn.baselines import least_squares_fit
from inferlearn.rules import BackProp


@pytest.mark.parametrize("act", ["relu", "hard-sigmoid", "hard-tanh", "linear"])
@pytest.mark.parametrize("loss", ["quadratic", "cross-entropy"])
@pytest.mark.parametrize("fused", [True, False])
def test_backprop_matches_float64_autograd(act, loss, fused):
    """Guards against a wrong loss scaling (sum vs mean, missing ½), a wrong activation, or a wrong
    mask at the kinks in the fused hand-written backward."""
    torch.manual_seed(0)
    model = MLP("7-6-5-4", act, seed=1, dtype=torch.float64)
    x = torch.randn(9, 7, dtype=torch.float64)
    labels = torch.randint(0, 4, (9,))
    x[0] = 0.0  # with zero biases, sample 0 sits exactly at the kinks: exercises the mask convention
    BackProp(loss=loss, fused=fused).backward(model, x, labels)

    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    z = x
    for k in range(3):
        a = z @ params[2 * k].T + params[2 * k + 1]
        z = a if k == 2 else {"relu": a.clamp(min=0), "hard-sigmoid": a.clamp(0, 1),
                              "hard-tanh": a.clamp(-1, 1), "linear": a}[act]
    if loss == "quadratic":
        y = torch.nn.functional.one_hot(labels, 4).double()
        ref = 0.5 * ((z - y) ** 2).sum(1).mean()
    else:
        ref = torch.nn.functional.cross_entropy(z, labels)
    grads = torch.autograd.grad(ref, params)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-12)


def test_linear_regression_baseline_reaches_closed_form():
    """Linear regression is back-propagation on the model without hidden layers: SGD converges to the
    least-squares solution (closed form)."""
    torch.manual_seed(0)
    x = torch.rand(200, 5, dtype=torch.float64)
    labels = torch.randint(0, 3, (200,))
    rule = BackProp()
    model = MLP([5, 3], "relu", seed=0, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(4000):
        opt.zero_grad()
        rule.backward(model, x, labels)
        opt.step()
    w, b = least_squares_fit(x, labels, 3, ridge=0.0)
    torch.testing.assert_close(model.layers[0].weight.detach(), w, rtol=0, atol=1e-5)
    torch.testing.assert_close(model.layers[0].bias.detach(), b, rtol=0, atol=1e-5)
