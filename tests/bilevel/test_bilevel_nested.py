"""Nested (multi-level) surrogates on layered networks: the non-linearised top-down surrogate L_TD and the
bottom-up, global contrastive L_GC, in float64.

Oracles: the top-down recursion ℓ_{k-1}(z_{k-1}) = (1/β_k)[min_{z_k}(E_k + β_k ℓ_k) − min E_k] evaluated
literally, level by level (the inner levels as functions minimised by SciPy's L-BFGS-B and the argmin
layer's solver), against the engine's single joint problem; central finite differences of the re-solved
surrogate values (value functions, so exact); autograd back-propagation as β → 0, with the order the
construction predicts (O(β) for L_TD; for L_GC only with β_1 ≪ … ≪ β_L).
"""
import pytest
import scipy.optimize as so
import torch
from torch import nn

from inferlearn.bilevel import Box, FunctionEnergy
from inferlearn.bilevel import AcceleratedProjectedGradient, solve
from inferlearn.bilevel.nested import bottomup_surrogate, layer_betas, topdown_surrogate

DT = torch.float64
ACTS = {"relu": nn.ReLU, "hard-sigmoid": lambda: nn.Hardtanh(0.0, 1.0)}


def _net(act, widths=(4, 5, 5, 3), seed=0):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(act())
    m = nn.Sequential(*layers).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))      # non-zero biases: no unit sits exactly at a kink
    x = torch.randn(6, widths[0], dtype=DT)
    y = torch.randn(6, widths[-1], dtype=DT)
    return m, x, y


def _grads(m, fn, *args):
    m.zero_grad()
    res = fn(m, *args)
    res.value.backward()
    return res, [p.grad.clone() for p in m.parameters()]


def _bp(m, x, y):
    m.zero_grad()
    (0.5 * (m(x) - y).pow(2).sum(1).mean()).backward()
    return [p.grad.clone() for p in m.parameters()]


def _rel_err(g, ref):
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g, ref))


def test_topdown_equals_the_literal_nested_recursion():
    """L_TD is defined level by level; evaluated that way (z_2 minimised inside a function of z_1, z_1 by
    L-BFGS-B) it must equal the engine's one joint Fenchel-gap problem."""
    m, x, y = _net(nn.ReLU, widths=(2, 3, 3, 2), seed=3)
    x, y = x[:2], y[:2]
    b1, b2, b3 = 0.2, 0.3, 0.25
    W = [(l.weight.detach(), l.bias.detach()) for l in m if isinstance(l, nn.Linear)]
    relu = Box.nonnegative()
    tight = AcceleratedProjectedGradient(max_iter=50000, tol=1e-13)
    td = topdown_surrogate(m, x, y, [b1, b2, b3])
    for i in range(2):
        xi, yi = x[i:i + 1], y[i:i + 1]

        def ell2(z2):                       # (1/β_3)[min_{z_3} ½‖z_3 − a_3‖² + β_3 ½‖z_3 − y‖²], closed form
            a3 = z2 @ W[2][0].T + W[2][1]
            return 0.5 * (a3 - yi).pow(2).sum(-1) / (1 + b3)

        def ell1(z1):                       # (1/β_2)[min_{z_2 ≥ 0} ½‖z_2 − a_2‖² + β_2 ℓ_2(z_2) − ½ dist(a_2)²]
            a2 = z1 @ W[1][0].T + W[1][1]
            inner = FunctionEnergy(lambda z2, a2: 0.5 * (z2 - a2).pow(2).sum(-1) + b2 * ell2(z2))
            z2, _ = solve(inner, [a2.detach()], relu, tight, init=a2.detach().clamp(min=0))
            return (0.5 * (z2 - a2).pow(2).sum(-1) + b2 * ell2(z2) - 0.5 * a2.clamp(max=0).pow(2).sum(-1)) / b2

        a1 = xi @ W[0][0].T + W[0][1]

        def outer(z):                       # ½‖z_1 − a_1‖² + β_1 ℓ_1(z_1), gradient by Danskin
            z1 = torch.tensor(z, dtype=DT).reshape(1, -1).requires_grad_(True)
            v = (0.5 * (z1 - a1).pow(2).sum(-1) + b1 * ell1(z1)).sum()
            (g,) = torch.autograd.grad(v, z1)
            return float(v.detach()), g.numpy().ravel().astype(float)

        res = so.minimize(outer, a1.clamp(min=0).numpy().ravel(), jac=True, method="L-BFGS-B",
                          bounds=[(0, None)] * 3, options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 2000})
        literal = (res.fun - 0.5 * float(a1.clamp(max=0).pow(2).sum())) / b1
        assert float(td.rows[i]) == pytest.approx(literal, rel=1e-8, abs=1e-10)


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("which", ["topdown", "bottomup"])
def test_gradient_is_the_derivative_of_the_value(act, which):
    """At a finite β = 0.3 the surrogate's Danskin gradient must equal central differences of its re-solved value."""
    fn = topdown_surrogate if which == "topdown" else bottomup_surrogate
    m, x, y = _net(ACTS[act])
    _, g = _grads(m, fn, x, y, 0.3)
    h = 1e-5
    for p, gp in zip(m.parameters(), g):
        for j in (0, p.numel() // 2, p.numel() - 1):
            old = float(p.detach().view(-1)[j])
            with torch.no_grad():
                p.view(-1)[j] = old + h
            vp = float(fn(m, x, y, 0.3).value.detach())
            with torch.no_grad():
                p.view(-1)[j] = old - h
            vm = float(fn(m, x, y, 0.3).value.detach())
            with torch.no_grad():
                p.view(-1)[j] = old
            assert float(gp.view(-1)[j]) == pytest.approx((vp - vm) / (2 * h), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("act", list(ACTS))
def test_topdown_approaches_backprop_at_order_beta(act):
    """Equal β_k → 0: a penalty method on the layer gaps; value and gradient error against back-propagation
    halve with β, and the value stays below the loss (the forward pass is feasible with zero gaps)."""
    m, x, y = _net(ACTS[act])
    bp = _bp(m, x, y)
    loss = float(0.5 * (m(x) - y).pow(2).sum(1).mean().detach())
    errs = []
    for beta in (0.04, 0.02, 0.01, 0.005):
        res, g = _grads(m, topdown_surrogate, x, y, beta)
        assert float(res.value.detach()) <= loss
        errs.append(_rel_err(g, bp))
    assert errs[-1] < 0.1
    for e0, e1 in zip(errs, errs[1:]):
        assert 1.6 < e0 / e1 < 2.4, errs


@pytest.mark.parametrize("act", list(ACTS))
def test_bottomup_approaches_backprop_only_with_increasing_betas(act):
    """L_GC with equal β_k → 0 keeps an O(1) error (the global free problem is not the forward pass);
    with β_k = β γ^{L−k}, β = γ → 0 (β_1 ≪ … ≪ β_L) the error halves with β."""
    m, x, y = _net(ACTS[act])
    bp = _bp(m, x, y)
    equal = [_rel_err(_grads(m, bottomup_surrogate, x, y, b)[1], bp) for b in (0.02, 0.01, 0.005)]
    assert min(equal) > 0.15 and equal[-1] > 0.8 * equal[0], equal
    geo = [_rel_err(_grads(m, bottomup_surrogate, x, y, layer_betas(b, 3, b))[1], bp) for b in (0.02, 0.01, 0.005)]
    assert geo[-1] < 0.05
    for e0, e1 in zip(geo, geo[1:]):
        assert 1.6 < e0 / e1 < 2.4, geo


def test_linear_units_make_both_directions_coincide():
    """With linear hidden units the global free minimum is the forward pass (energy 0), so L_GC = L_TD."""
    m, x, y = _net(nn.Identity)
    td, g_td = _grads(m, topdown_surrogate, x, y, [0.3, 0.2, 0.1])
    gc, g_gc = _grads(m, bottomup_surrogate, x, y, [0.3, 0.2, 0.1])
    assert torch.allclose(td.rows, gc.rows, atol=1e-10)
    for a, b in zip(g_td, g_gc):
        assert torch.allclose(a, b, atol=1e-8)


def test_layer_betas():
    assert layer_betas(0.1, 3, 0.5) == pytest.approx([0.025, 0.05, 0.1])
    assert layer_betas(0.1, 2) == [0.1, 0.1]


def test_bad_input():
    m, x, y = _net(nn.ReLU)
    for beta in (0.0, -1.0, float("nan"), [0.1, 0.1]):
        with pytest.raises(ValueError, match="beta"):
            topdown_surrogate(m, x, y, beta)
    with pytest.raises(ValueError, match="NaN or inf"):
        bottomup_surrogate(m, x + float("nan"), y, 0.1)
    with pytest.raises(ValueError, match="does not match"):
        topdown_surrogate(m, x, y[:, :2], 0.1)
    with pytest.raises(ValueError, match="same non-zero number of rows"):
        topdown_surrogate(m, x, y[:3], 0.1)
    with pytest.raises(ValueError, match="Tanh"):
        topdown_surrogate(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double(), x, y, 0.1)
    with pytest.raises(ValueError, match="gamma"):
        layer_betas(0.1, 3, 0.0)


@pytest.mark.parametrize("which", ["topdown", "bottomup-increasing"])
def test_conv_chain_approaches_backprop(which):
    """Any affine chain: a conv net (Conv2d, ReLU, AvgPool, Flatten, Linear) through the engine's generic layered
    path; the gradient error against autograd BP halves with β (L_GC with β_k = β·β^{L−k})."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Unflatten(1, (1, 6, 6)), nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                      nn.Flatten(), nn.Linear(27, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x, y = torch.randn(4, 36, dtype=DT), torch.randn(4, 3, dtype=DT)
    bp = _bp(m, x, y)
    errs = []
    for b in (0.02, 0.01, 0.005):
        beta = b if which == "topdown" else layer_betas(b, 3, b)
        fn = topdown_surrogate if which == "topdown" else bottomup_surrogate
        errs.append(_rel_err(_grads(m, fn, x, y, beta)[1], bp))
    assert errs[-1] < 0.05
    for e0, e1 in zip(errs, errs[1:]):
        assert 1.6 < e0 / e1 < 2.4, errs
