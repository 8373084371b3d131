"""Props. 1-3 of the bilevel paper as float64 oracle tests (docs/maths.md §B).

Oracles: central finite differences of ``ℓ(z*(θ))`` with a tightly converged inner solve; a QP
solved by SciPy's L-BFGS-B (an independent solver) for Prop. 2; closed-form bounds for Prop. 3.
"""
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from inferlearn.bilevel import (AcceleratedProjectedGradient, ArgminLayer, Box, FunctionEnergy, ProximalEnergy,
                                QuadraticEnergy, contrastive_surrogate, solve)

TIGHT = AcceleratedProjectedGradient(max_iter=20000, tol=1e-13)


@pytest.fixture(autouse=True, scope="module")
def _float64():
    """float64 for this module only (restored afterwards: other tests rely on the float32 default)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _smooth_problem(seed=0, batch=3, n=4, p=3):
    """A strongly convex, non-quadratic energy E(z; θ, M) = ½zᵀQz − (θM)ᵀz + Σ log cosh z."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=gen)
    Q = A @ A.T / n + 0.5 * torch.eye(n)
    theta = torch.randn(batch, p, generator=gen)
    M = torch.randn(p, n, generator=gen)
    w = torch.randn(n, generator=gen)

    def fn(z, th, m):
        return 0.5 * ((z @ Q) * z).sum(-1) - ((th @ m) * z).sum(-1) + torch.log(torch.cosh(z)).sum(-1)

    energy = FunctionEnergy(fn, init=lambda th, m: torch.zeros(th.shape[0], n))

    def loss(z):  # smooth, non-linear outer loss
        return (torch.sin(z @ w) + 0.5 * z.pow(2).sum(-1)).sum()

    return energy, theta, M, loss


def _fd_gradient(energy, loss, inputs, h=1e-5):
    """Central finite differences of ℓ(z*(inputs)) in every input entry (the oracle)."""
    grads = []
    for idx, x in enumerate(inputs):
        g = torch.zeros_like(x)
        flat = g.view(-1)
        for j in range(x.numel()):
            vals = []
            for s in (1, -1):
                xs = [y.clone() for y in inputs]
                xs[idx].view(-1)[j] += s * h
                z, _ = solve(energy, xs, solver=TIGHT)
                vals.append(float(loss(z)))
            flat[j] = (vals[0] - vals[1]) / (2 * h)
        grads.append(g)
    return grads


def _layer_grads(energy, loss, inputs, **kw):
    xs = [x.clone().requires_grad_(True) for x in inputs]
    z = ArgminLayer(energy, solver=TIGHT, **kw)(*xs)
    loss(z).backward()
    return [x.grad for x in xs]


def _rel(a, b):
    return float(torch.cat([x.flatten() for x in a]).sub(torch.cat([y.flatten() for y in b])).norm()
                 / torch.cat([y.flatten() for y in b]).norm())


@pytest.fixture(scope="module")
def smooth():
    energy, theta, M, loss = _smooth_problem()
    return energy, [theta, M], loss, _fd_gradient(energy, loss, [theta, M])


def test_implicit_backward_matches_finite_differences(smooth):
    """Guards against a wrong sign or a missing mixed-derivative term in the implicit reference."""
    energy, inputs, loss, ref = smooth
    assert _rel(_layer_grads(energy, loss, inputs, backward="implicit"), ref) < 1e-7


@pytest.mark.parametrize("nudging, order", [("positive", 1), ("negative", 1), ("symmetric", 2)])
def test_prop1_contrastive_layer_converges_to_implicit_gradient(smooth, nudging, order):
    """Prop. 1 with the linearised loss: error O(β) one-sided, O(β²) symmetric.

    Guards against a backward that is right only up to a constant factor, that uses the wrong sign for
    the negative nudge, or whose symmetric variant is secretly one-sided.
    """
    energy, inputs, loss, ref = smooth
    errs = [_rel(_layer_grads(energy, loss, inputs, beta=b, nudging=nudging), ref) for b in (2e-2, 1e-2)]
    assert errs[1] < 0.05
    ratio = errs[0] / errs[1]
    assert 2 ** order * 0.8 < ratio < 2 ** order * 1.25, (errs, ratio)


def test_prop1_full_surrogate_converges_with_full_loss(smooth):
    """Prop. 1 for Definition 1 itself (non-linearised loss): gradient error O(β)."""
    energy, inputs, loss, ref = smooth
    errs = []
    for b in (2e-2, 1e-2):
        xs = [x.clone().requires_grad_(True) for x in inputs]
        contrastive_surrogate(energy, loss, *xs, beta=b, solver=TIGHT).backward()
        errs.append(_rel([x.grad for x in xs], ref))
    assert errs[1] < 0.05 and 1.6 < errs[0] / errs[1] < 2.5, errs


@pytest.mark.parametrize("c", [-1.0, 1.0, -0.3])
@pytest.mark.parametrize("solver", [None, "fista"])
def test_prop2_relu_unit_at_weakly_active_constraint(c, solver):
    """Prop. 2 example: E = ½(z − θ)² + ι≥0(z) at θ = 0, ℓ = c·z, so ż = max(0, −c).

    The contrastive gradient in θ is −max(0, −c) (the one-sided derivative that decreases the loss);
    implicit differentiation has no derivative there, returns 0 and reports one weakly active
    coordinate. Guards against a surrogate that inherits the implicit method's dead gradient.
    """
    theta = torch.zeros(1, 1, requires_grad=True)
    energy = ProximalEnergy() if solver is None else FunctionEnergy(lambda z, a: 0.5 * (z - a).pow(2).sum(-1),
                                                                     init=lambda a: torch.zeros_like(a))
    layer = ArgminLayer(energy, Box.nonnegative(), beta=1e-4, nudging="positive", solver=TIGHT)
    (c * layer(theta)).sum().backward()
    assert theta.grad.item() == pytest.approx(-max(0.0, -c), abs=1e-8)
    # ż = dẑ/dβ at 0⁺ by a one-sided difference (ẑ is piecewise linear in β here, so it is exact).
    beta = 1e-4
    z_hat, _ = solve(energy, [theta.detach()], Box.nonnegative(), TIGHT, shift=torch.full((1, 1), beta * c))
    assert float(z_hat) / beta == pytest.approx(max(0.0, -c), abs=1e-8)

    theta.grad = None
    implicit = ArgminLayer(energy, Box.nonnegative(), backward="implicit", solver=TIGHT)
    (c * implicit(theta)).sum().backward()
    assert theta.grad.item() == 0.0
    assert implicit.last_backward.weakly_active == 1


def test_prop2_direction_solves_the_qp_with_weakly_and_strongly_active_constraints():
    """Prop. 2: ż = dẑ_β/dβ|0⁺ solves min ½żᵀHż + gᵀż s.t. ż_S = 0, ż_W ≥ 0.

    Builds a quadratic with z ≥ 0 whose minimiser has free, strongly active (multiplier > 0) and
    weakly active (multiplier 0) coordinates; the QP is solved by SciPy's L-BFGS-B. Guards against
    treating weakly active constraints as equalities (implicit differentiation) or ignoring them.
    """
    gen = torch.Generator().manual_seed(3)
    n = 6
    A = torch.randn(n, n, generator=gen)
    Q = A @ A.T / n + 0.3 * torch.eye(n)
    z_star = torch.tensor([[0.7, 1.2, 0.0, 0.0, 0.0, 0.0]])
    lam = torch.tensor([[0.0, 0.0, 0.8, 1.5, 0.0, 0.0]])  # coords 2, 3 strongly, 4, 5 weakly active
    c = z_star @ Q - lam
    g = torch.tensor([[0.3, -0.5, -0.4, 0.2, -0.9, 0.6]])
    beta = 1e-6
    z0, _ = solve(QuadraticEnergy(), [Q, c], Box.nonnegative(), TIGHT)
    assert torch.allclose(z0, z_star, atol=1e-10)
    z_hat, _ = solve(QuadraticEnergy(), [Q, c], Box.nonnegative(), TIGHT, init=z0, shift=beta * g)
    zdot = ((z_hat - z_star) / beta).flatten().numpy()

    Qn, gn = Q.numpy(), g.flatten().numpy()
    bounds = [(None, None)] * 2 + [(0, 0)] * 2 + [(0, None)] * 2
    ref = minimize(lambda v: 0.5 * v @ Qn @ v + gn @ v, np.zeros(n), jac=lambda v: Qn @ v + gn,
                   bounds=bounds, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12}).x
    assert np.allclose(zdot, ref, atol=1e-5), (zdot, ref)
    assert zdot[4] > 0.1 and zdot[5] == pytest.approx(0.0, abs=1e-6)  # one weak constraint leaves, one stays


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beta", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("constrained", [False, True])
def test_prop3_bounds_on_random_strongly_convex_problems(seed, beta, constrained):
    """Prop. 3: ℓ(z*) − β‖∇ℓ(z*)‖²/(2μ) ≤ L^β ≤ ℓ(z*); the surrogate is a lower bound for β > 0.

    μ = λ_min(Q); ℓ convex (a quadratic plus a log-sum-exp). Guards against a surrogate whose value
    uses the wrong sign, forgets the 1/β, or is evaluated at an unconverged nudged solution.
    """
    gen = torch.Generator().manual_seed(seed)
    n, batch = 5, 2
    A = torch.randn(n, n, generator=gen)
    Q = A @ A.T / n + 0.2 * torch.eye(n)
    c = torch.randn(batch, n, generator=gen)
    t = torch.randn(batch, n, generator=gen)
    mu = QuadraticEnergy().strong_convexity(Q, c)
    box = Box.nonnegative() if constrained else None

    def loss(z):
        return 0.5 * (z - t).pow(2).sum() + torch.logsumexp(z, dim=-1).sum()

    z_star, _ = solve(QuadraticEnergy(), [Q, c], box, TIGHT)
    zz = z_star.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(zz), zz)
    l_star = float(loss(z_star))
    L_beta = float(contrastive_surrogate(QuadraticEnergy(), loss, Q, c, beta=beta, box=box, solver=TIGHT))
    assert L_beta <= l_star + 1e-9
    assert L_beta >= l_star - beta * float(grad.pow(2).sum()) / (2 * mu) - 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_negative_nudge_is_an_upper_bound(seed):
    """L^{−β} ≥ ℓ(z*) (nudging away; E − βℓ stays convex for β < μ). Guards against a swapped sign."""
    gen = torch.Generator().manual_seed(seed)
    n = 4
    A = torch.randn(n, n, generator=gen)
    Q = A @ A.T / n + 1.0 * torch.eye(n)
    c = torch.randn(2, n, generator=gen)
    t = torch.randn(2, n, generator=gen)

    def loss(z):
        return 0.5 * (z - t).pow(2).sum()

    z_star, _ = solve(QuadraticEnergy(), [Q, c], None, TIGHT)
    l_star = float(loss(z_star))
    for beta in (0.1, 0.5):
        assert float(contrastive_surrogate(QuadraticEnergy(), loss, Q, c, beta=-beta, solver=TIGHT)) >= l_star - 1e-9


def test_symmetric_contrastive_is_exact_for_quadratic_energy_with_stable_active_set():
    """For a quadratic energy the linearised surrogate is exact once the active set is stable:
    NNLS codes with the contrastive backward equal implicit differentiation to ~1e-8 (β = 1e-6)."""
    gen = torch.Generator().manual_seed(1)
    from inferlearn.bilevel import LeastSquaresEnergy

    D = torch.randn(7, 5, generator=gen)
    y = torch.randn(4, 7, generator=gen)
    w = torch.randn(5, generator=gen)
    grads = {}
    for mode in ("contrastive", "implicit"):
        energy = LeastSquaresEnergy(D, ridge=0.05)
        yy = y.clone().requires_grad_(True)
        layer = ArgminLayer(energy, Box.nonnegative(), beta=1e-6, backward=mode, solver=TIGHT)
        z = layer(yy)
        assert layer.last_forward.converged
        (torch.tanh(z @ w)).sum().backward()
        grads[mode] = (yy.grad, energy.D.grad)
    assert math.isclose(0, _rel(grads["contrastive"], grads["implicit"]), abs_tol=1e-6)
