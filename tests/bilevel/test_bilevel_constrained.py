"""Constraints that depend on θ: the contrastive surrogate's multiplier terms λ·∂g/∂θ.

Oracles (float64): the closed form of a box whose lower bound is an input (z* = max(a, lo)); implicit
differentiation of the KKT system on the active set, at a KKT point found by SciPy's SLSQP and polished by
Newton's method on the active-set equations (independent of the augmented-Lagrangian solver); central
finite differences of the re-solved surrogate value (a value function, so its gradient is exact).
"""
import numpy as np
import pytest
import scipy.optimize as so
import torch

from inferlearn.bilevel import Constraints, ConstrainedArgminLayer, QuadraticEnergy, ProximalEnergy
from inferlearn.bilevel.constrained import AugmentedLagrangian, constrained_surrogate, solve_constrained

DT = torch.float64
BALL_AFFINE = Constraints(lambda z, A, b, r: torch.cat([z @ A.mT - b, (z * z).sum(-1, keepdim=True) - r ** 2], 1))


def _problem(seed=0, n=4, m=3):
    gen = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=gen, dtype=DT)
    Q = M @ M.T + 0.5 * torch.eye(n, dtype=DT)
    c = torch.randn(1, n, generator=gen, dtype=DT) * 3
    A = torch.randn(m, n, generator=gen, dtype=DT)
    b = torch.randn(1, m, generator=gen, dtype=DT) * 0.3
    t = torch.randn(1, n, generator=gen, dtype=DT)
    return Q, c, A, b, t


def _kkt_oracle(Q, c, A, b, r, t):
    """dℓ/dθ for θ = (c, A, b, r), ℓ = ½‖z* − t‖², by implicit differentiation of the active-set KKT system."""
    n = Q.shape[0]
    Qn, cn, An, bn, rn = (x.detach().numpy().astype(float) for x in (Q, c[0], A, b[0], r.reshape(())))
    cons = [{"type": "ineq", "fun": lambda z, i=i: bn[i] - An[i] @ z, "jac": lambda z, i=i: -An[i]}
            for i in range(len(bn))]
    cons.append({"type": "ineq", "fun": lambda z: rn ** 2 - z @ z, "jac": lambda z: -2 * z})
    res = so.minimize(lambda z: 0.5 * z @ Qn @ z - cn @ z, np.zeros(n), jac=lambda z: Qn @ z - cn,
                      constraints=cons, method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    z = torch.tensor(res.x, dtype=DT)

    def g(z, c, A, b, r):
        return torch.cat([A @ z - b, (z @ z - r ** 2).reshape(1)])

    theta = (c[0].detach(), A.detach(), b[0].detach(), r.detach().reshape(()))
    active = g(z, *theta).abs() < 1e-6
    S = active.nonzero().flatten()
    # λ_S from stationarity, then Newton on the active-set KKT equations R(z, λ_S) = 0 (exact in float64)

    def R(w, c, A, b, r):
        zz, lam = w[:n], w[n:]
        grad_g = torch.func.jacrev(lambda u: g(u, c, A, b, r)[S])(zz)
        return torch.cat([Q @ zz - c + grad_g.T @ lam, g(zz, c, A, b, r)[S]])

    Jg = torch.func.jacrev(lambda u: g(u, *theta)[S])(z)
    lam = torch.linalg.lstsq(Jg.T, -(Q @ z - theta[0]).unsqueeze(1)).solution.flatten()
    w = torch.cat([z, lam])
    for _ in range(20):
        w = w - torch.linalg.solve(torch.func.jacrev(R)(w, *theta), R(w, *theta))
    assert float(R(w, *theta).abs().max()) < 1e-12 and bool((w[n:] > 1e-6).all())   # strongly active
    Jw = torch.func.jacrev(R)(w, *theta)
    grads = []
    for i, th in enumerate(theta):
        Jt = torch.func.jacrev(R, argnums=i + 1)(w, *theta).reshape(len(w), -1)
        dz = -torch.linalg.solve(Jw, Jt)[:n]                 # dz/dθ_i
        grads.append(((w[:n] - t[0]) @ dz).reshape(th.shape))
    return w[:n], grads


@pytest.mark.parametrize("nudging", ["positive", "symmetric"])
def test_moving_lower_bound_matches_closed_form(nudging):
    """z* = max(a, lo) for ½‖z − a‖² s.t. z ≥ lo(θ): the bound's gradient is the loss gradient on the active
    coordinates. Without the multiplier term λ·∂g/∂lo the layer would give lo a zero gradient."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(5, 6, generator=gen, dtype=DT).requires_grad_(True)
    lo = torch.randn(5, 6, generator=gen, dtype=DT).requires_grad_(True)
    w = torch.randn(5, 6, generator=gen, dtype=DT)
    layer = ConstrainedArgminLayer(ProximalEnergy(), Constraints.lower_bounds(), beta=1e-3, nudging=nudging,
                                   solver=AugmentedLagrangian(tol=1e-11))
    z = layer(a, constraint_inputs=(lo,))
    assert torch.allclose(z, torch.maximum(a, lo).detach(), atol=1e-9)
    assert torch.allclose(layer.last_multipliers, (lo - a).clamp(min=0).detach(), atol=1e-8)
    (w * z + 0.5 * z * z).sum().backward()
    up = (w + z).detach()
    tol = 1e-6     # the linearised surrogate of a quadratic energy is exact while the nudge keeps the active set
    assert torch.allclose(lo.grad, up * (lo > a).detach(), atol=tol)
    assert torch.allclose(a.grad, up * (a > lo).detach(), atol=tol)


def test_weakly_active_moving_bound_gets_the_one_sided_derivative():
    """Prop. 2 with a θ-dependent bound: at a = lo the bound is weakly active (λ* = 0) and z* = max(a, lo) has no
    derivative; the positive nudge's one-sided answer splits the loss gradient w between the two inputs:
    lo receives max(w, 0) (the nudge pushes z into the bound, whose multiplier becomes βw) and a receives
    min(w, 0) (the nudge moves z off the bound)."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(4, 5, generator=gen, dtype=DT)
    lo = a.clone().requires_grad_(True)
    a.requires_grad_(True)
    w = torch.randn(4, 5, generator=gen, dtype=DT)
    layer = ConstrainedArgminLayer(ProximalEnergy(), Constraints.lower_bounds(), beta=1e-3, nudging="positive",
                                   solver=AugmentedLagrangian(tol=1e-11))
    (w * layer(a, constraint_inputs=(lo,))).sum().backward()
    assert float(layer.last_multipliers.abs().max()) < 1e-8
    assert torch.allclose(lo.grad, w.clamp(min=0), atol=1e-6)
    assert torch.allclose(a.grad, w.clamp(max=0), atol=1e-6)


def test_layer_matches_kkt_implicit_differentiation():
    """Affine constraints A z ≤ b and a ball ‖z‖ ≤ r, every one of c, A, b, r a θ: the layer's symmetric
    contrastive gradient must equal implicit differentiation of the KKT system (two half-spaces and the
    ball active in this instance, one half-space inactive)."""
    Q, c, A, b, t = _problem(seed=2)
    r = torch.tensor([[0.5]], dtype=DT)
    z_ref, ref = _kkt_oracle(Q, c, A, b, r, t)
    leaves = [x.clone().requires_grad_(True) for x in (c, A, b, r)]
    layer = ConstrainedArgminLayer(QuadraticEnergy(), BALL_AFFINE, beta=1e-4,
                                   solver=AugmentedLagrangian(tol=1e-11))
    z = layer(Q, leaves[0], constraint_inputs=leaves[1:])
    assert torch.allclose(z[0], z_ref, atol=1e-8)
    assert int((layer.last_multipliers > 1e-6).sum()) == 3      # two half-spaces and the ball, strongly active
    (0.5 * (z - t).pow(2).sum()).backward()
    for leaf, g_ref in zip(leaves, ref):
        assert torch.allclose(leaf.grad.reshape(g_ref.shape), g_ref, rtol=1e-5, atol=1e-6), (leaf.grad, g_ref)


def test_surrogate_gradient_is_the_derivative_of_its_value():
    """L^β with the full loss at a finite β: its gradient (with the multiplier terms) must equal central
    finite differences of the re-solved surrogate value, for the constraint inputs (b, r) and the energy's c."""
    Q, c, A, b, t = _problem(seed=2)
    r = torch.tensor([[0.5]], dtype=DT)
    solver = AugmentedLagrangian(tol=1e-11)

    def loss(z):
        return 0.5 * (z - t).pow(2).sum() + 0.1 * z.pow(4).sum()

    def value(c, b, r):
        return constrained_surrogate(QuadraticEnergy(), BALL_AFFINE, loss, (Q, c), (A, b, r), beta=0.3, solver=solver)

    leaves = [x.clone().requires_grad_(True) for x in (c, b, r)]
    value(*leaves).backward()
    h = 1e-5
    for i, leaf in enumerate(leaves):
        fd = leaf.grad.clone()
        for j in ([0] if i == 0 else [2] if i == 1 else [0]):   # one coordinate of c, of b (an active one) and r
            args_p = [x.detach().clone() for x in leaves]
            args_m = [x.detach().clone() for x in leaves]
            args_p[i].view(-1)[j] += h
            args_m[i].view(-1)[j] -= h
            fd.view(-1)[j] = (value(*args_p) - value(*args_m)) / (2 * h)
        assert torch.allclose(leaf.grad, fd, rtol=1e-5, atol=1e-6), (i, leaf.grad, fd)


def test_surrogate_approaches_implicit_differentiation_at_order_beta():
    """Prop. 1 with constraints: the full-loss surrogate's gradient error against the KKT oracle halves with β."""
    Q, c, A, b, t = _problem(seed=2)
    r = torch.tensor([[0.5]], dtype=DT)
    _, ref = _kkt_oracle(Q, c, A, b, r, t)
    errs = []
    for beta in (1e-2, 5e-3, 2.5e-3):
        leaves = [x.clone().requires_grad_(True) for x in (c, A, b, r)]
        constrained_surrogate(QuadraticEnergy(), BALL_AFFINE, lambda z: 0.5 * (z - t).pow(2).sum(), (Q, leaves[0]),
                              leaves[1:], beta=beta, solver=AugmentedLagrangian(tol=1e-12)).backward()
        errs.append(max(float((l.grad.reshape(g.shape) - g).abs().max()) for l, g in zip(leaves, ref)))
    assert errs[0] > 1e-6
    for e0, e1 in zip(errs, errs[1:]):
        assert 1.7 < e0 / e1 < 2.3, errs


def test_fixed_bound_agrees_with_the_argmin_layer_and_reaches_module_parameters():
    """With a bound that does not depend on θ (lo = 0), the constrained layer is the argmin layer's NNLS with
    Box.nonnegative(): same codes and the same gradients for the dictionary (a module parameter) and the signal."""
    from inferlearn.bilevel import ArgminLayer, Box, LeastSquaresEnergy
    from inferlearn.bilevel import AcceleratedProjectedGradient
    gen = torch.Generator().manual_seed(4)
    D = torch.randn(6, 4, generator=gen, dtype=DT)
    y = torch.randn(3, 6, generator=gen, dtype=DT)
    w = torch.randn(3, 4, generator=gen, dtype=DT)
    out = []
    for make in (lambda e: ArgminLayer(e, Box.nonnegative(), beta=1e-3,
                                       solver=AcceleratedProjectedGradient(max_iter=50000, tol=1e-12)),
                 lambda e: ConstrainedArgminLayer(e, Constraints.lower_bounds(), beta=1e-3,
                                                  solver=AugmentedLagrangian(tol=1e-12))):
        energy = LeastSquaresEnergy(D, ridge=0.1)
        yy = y.clone().requires_grad_(True)
        layer = make(energy)
        z = layer(yy) if isinstance(layer, ArgminLayer) else layer(yy, constraint_inputs=(torch.zeros(3, 4, dtype=DT),))
        (w * z).sum().backward()
        out.append((z.detach(), yy.grad, energy.D.grad))
    assert int((out[0][0] == 0).sum()) >= 2                                 # some codes at the bound
    for a, b in zip(*out):
        assert torch.allclose(a, b, atol=1e-7)


def test_bad_input():
    cons = Constraints.lower_bounds()
    a, lo = torch.zeros(2, 3, dtype=DT), torch.zeros(2, 3, dtype=DT)
    with pytest.raises(ValueError, match="Invalid beta"):
        ConstrainedArgminLayer(ProximalEnergy(), cons, beta=0.0)
    with pytest.raises(ValueError, match="Invalid beta"):
        ConstrainedArgminLayer(ProximalEnergy(), cons, beta=float("nan"))
    with pytest.raises(ValueError, match="NaN or inf"):
        ConstrainedArgminLayer(ProximalEnergy(), cons)(a, constraint_inputs=(lo + float("nan"),))
    with pytest.raises(ValueError, match="shape"):
        solve_constrained(ProximalEnergy(), Constraints(lambda z, lo: (lo - z).sum(-1)), (a,), (lo,))
    with pytest.raises(TypeError, match="Constraints"):
        ConstrainedArgminLayer(ProximalEnergy(), lambda z: z)
    with pytest.raises(ValueError, match="Invalid beta"):
        constrained_surrogate(ProximalEnergy(), cons, lambda z: z.sum(), (a,), (lo,), beta=0)
    with pytest.raises(ValueError, match="Invalid rho"):
        AugmentedLagrangian(rho=-1.0)
