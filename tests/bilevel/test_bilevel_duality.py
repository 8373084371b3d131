"""The min–min–min form of the contrastive surrogate (joint minimisation over the nudged primal and the free
problem's dual) against the min−min form (two separate solves, Danskin), in float64.

Oracles: :func:`contrastive_surrogate` (value and gradient), strong duality (the dual optimum is ``−min E``
and the primal recovered from the dual, ``∇h*(μ_lo − μ_hi)``, is the free solution), and the closed form
of the hard-sigmoid layer.
"""
import math

import pytest
import torch

from inferlearn.bilevel import Box, FunctionEnergy, LeastSquaresEnergy, ProximalEnergy, QuadraticEnergy
from inferlearn.bilevel.duality import dual_objective, dual_surrogate, solve_joint
from inferlearn.bilevel import AcceleratedProjectedGradient, contrastive_surrogate, solve

DT = torch.float64
TIGHT = AcceleratedProjectedGradient(max_iter=50000, tol=1e-12)


def _loss(t):
    return lambda z: 0.5 * (z - t).pow(2).sum() + torch.nn.functional.softplus(z).sum()


def _cases():
    gen = torch.Generator().manual_seed(0)
    n = 5
    M = torch.randn(n, n, generator=gen, dtype=DT)
    Q = M @ M.T + 0.3 * torch.eye(n, dtype=DT)
    c = torch.randn(3, n, generator=gen, dtype=DT) * 2
    lo = torch.tensor([-0.5, -math.inf, 0.0, -1.0, -math.inf], dtype=DT)
    hi = torch.tensor([0.5, 0.2, math.inf, math.inf, math.inf], dtype=DT)
    D = torch.randn(6, n, generator=gen, dtype=DT)
    y = torch.randn(3, 6, generator=gen, dtype=DT)
    a = torch.randn(3, n, generator=gen, dtype=DT) * 2
    t = torch.randn(3, n, generator=gen, dtype=DT)
    return {
        "quadratic, mixed box": (QuadraticEnergy(), Box(lo, hi), [Q, c], t),
        "nnls (ridge)": (LeastSquaresEnergy(D, ridge=0.1).double(), Box.nonnegative(), [y], t),
        "hard sigmoid": (ProximalEnergy(), Box(0.0, 1.0), [a], t),
    }


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("beta", [0.5, 1e-2])
def test_joint_form_equals_min_minus_min(case, beta):
    """Value and gradient (inputs and the NNLS dictionary) of the joint min–min–min problem must equal the
    min−min form's at a finite and a small β."""
    energy, box, inputs, t = _cases()[case]
    loss = _loss(t)
    grads = []
    for fn in (contrastive_surrogate, dual_surrogate):
        xs = [x.clone().requires_grad_(True) for x in inputs]
        for p in energy.parameters_for_grad():
            p.grad = None
        v = fn(energy, loss, *xs, beta=beta, box=box, solver=TIGHT)
        v.backward()
        grads.append((float(v.detach()), [x.grad for x in xs] + [p.grad.clone() for p in energy.parameters_for_grad()]))
    (v0, g0), (v1, g1) = grads
    assert v1 == pytest.approx(v0, rel=1e-9, abs=1e-9)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), (a, b)


@pytest.mark.parametrize("case", list(_cases()))
def test_strong_duality_and_primal_recovery(case):
    """Without the loss the joint problem is the free primal plus its dual: D̃(μ*) = −min E and ∇h*(μ_lo − μ_hi) = z*."""
    energy, box, inputs, _ = _cases()[case]
    z_ref, _ = solve(energy, inputs, box, TIGHT)
    z, mu_lo, mu_hi, _ = solve_joint(energy, None, inputs, 1.0, box, TIGHT)
    assert torch.allclose(z, z_ref, atol=1e-9)
    assert int(((mu_lo > 1e-6) | (mu_hi > 1e-6)).sum()) >= 3     # the box binds: the dual is not trivial
    d = dual_objective(energy, mu_lo, mu_hi, inputs, box)
    assert torch.allclose(d, -energy.value(z_ref, *inputs).detach(), atol=1e-9)
    s = (mu_lo - mu_hi).requires_grad_(True)
    (grad_conj,) = torch.autograd.grad(energy.conjugate(s, *inputs).sum(), s)
    assert torch.allclose(grad_conj, z_ref, atol=1e-7)


def test_hard_sigmoid_dual_value_closed_form():
    """For ½‖z − a‖² over [0, 1] the free minimum is ½ dist(a, [0,1])², so D̃(μ*) = −½‖a − clamp(a)‖²."""
    a = torch.linspace(-2, 3, 11, dtype=DT).reshape(1, -1)
    _, mu_lo, mu_hi, _ = solve_joint(ProximalEnergy(), None, [a], 1.0, Box(0.0, 1.0), TIGHT)
    d = dual_objective(ProximalEnergy(), mu_lo, mu_hi, [a], Box(0.0, 1.0))
    assert torch.allclose(d, -0.5 * (a - a.clamp(0, 1)).pow(2).sum(-1), atol=1e-10)
    assert torch.allclose(mu_lo - mu_hi, a.clamp(0, 1) - a, atol=1e-9)   # the multiplier is z* − a


def test_bad_input():
    a = torch.zeros(2, 3, dtype=DT)
    for beta in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="Invalid beta"):
            dual_surrogate(ProximalEnergy(), lambda z: z.sum(), a, beta=beta)
    with pytest.raises(ValueError, match="NaN or inf"):
        dual_surrogate(ProximalEnergy(), lambda z: z.sum(), a + float("nan"), beta=0.1)
    with pytest.raises(ValueError, match="no convex conjugate"):
        dual_surrogate(FunctionEnergy(lambda z, a: (z - a).pow(2).sum(-1), init=torch.zeros_like), lambda z: z.sum(),
                       a, beta=0.1)
