"""The argmin layer as a PyTorch building block: closed forms, autograd agreement, bad input.

Oracles: the clamp (the closed-form argmin of the proximal energy), float64 autograd through it,
the unconstrained quadratic's linear solve, and a slow projected-gradient reference solve.
"""
import pytest
import torch
from torch import nn

from inferlearn.bilevel import (AcceleratedProjectedGradient, ArgminLayer, Box, FunctionEnergy, LeastSquaresEnergy,
                                ProjectedGradient, ProximalEnergy, QuadraticEnergy, contrastive_surrogate, solve)
from inferlearn.errors import ConvergenceError, ConvergenceWarning

DT = torch.float64
TIGHT = AcceleratedProjectedGradient(max_iter=20000, tol=1e-12)


@pytest.mark.parametrize("mode", ["contrastive", "implicit"])
@pytest.mark.parametrize("nudging", ["positive", "negative", "symmetric"])
def test_hard_sigmoid_unit_matches_autograd_through_clamp(mode, nudging):
    """argmin ½‖z − a‖² over [0, 1] is the hard sigmoid; its backward must equal autograd of clamp
    away from the kinks. Guards against dropping the gradient on the interior or leaking it through
    strongly active bounds."""
    gen = torch.Generator().manual_seed(0)
    a = (torch.rand(6, 5, generator=gen, dtype=DT) * 3 - 1).requires_grad_(True)
    w = torch.randn(6, 5, generator=gen, dtype=DT)
    layer = ArgminLayer(ProximalEnergy(), Box(0.0, 1.0), beta=1e-6, nudging=nudging, backward=mode)
    z = layer(a)
    assert torch.equal(z, a.detach().clamp(0, 1))
    (w * z).sum().backward()
    ref = w * ((a.detach() > 0) & (a.detach() < 1))
    assert torch.allclose(a.grad, ref, atol=1e-8)


def test_fista_matches_slow_projected_gradient_and_closed_form():
    """The accelerated solver must reach the minimiser the slow reference (plain projected gradient)
    and the closed form (unconstrained linear solve) reach. Guards against a momentum bug that stops
    early at a non-minimiser."""
    gen = torch.Generator().manual_seed(2)
    A = torch.randn(6, 6, generator=gen, dtype=DT)
    Q = A @ A.T / 6 + 0.3 * torch.eye(6, dtype=DT)
    c = torch.randn(3, 6, generator=gen, dtype=DT)
    fn = FunctionEnergy(lambda z, q, cc: 0.5 * ((z @ q) * z).sum(-1) - (cc * z).sum(-1), init=lambda q, cc: torch.zeros_like(cc))
    z_closed, info = solve(QuadraticEnergy(), [Q, c])
    assert info.solver == "closed-form"
    z_fista, i1 = solve(fn, [Q, c], solver=TIGHT)
    assert torch.allclose(z_fista, z_closed, atol=1e-9)
    box = Box(lower=torch.full((6,), -0.2, dtype=DT), upper=0.5)
    z_fast, _ = solve(QuadraticEnergy(), [Q, c], box, TIGHT)
    z_slow, i2 = solve(fn, [Q, c], box, ProjectedGradient(max_iter=200000, tol=1e-12))
    assert torch.allclose(z_fast, z_slow, atol=1e-9)
    assert i1.iterations < i2.iterations * 10


def test_nnls_layer_trains_inside_a_model_and_reaches_upstream_parameters():
    """An argmin layer in an nn.Sequential: the contrastive backward must reach both the energy's own
    parameters (the dictionary) and the upstream nn.Linear, and agree with the implicit reference."""
    torch.manual_seed(0)
    grads = {}
    for mode in ("contrastive", "implicit"):
        torch.manual_seed(0)
        lin = nn.Linear(4, 6, dtype=DT)
        energy = LeastSquaresEnergy(torch.randn(6, 5, dtype=DT), ridge=0.1)
        model = nn.Sequential(lin, ArgminLayer(energy, Box.nonnegative(), beta=1e-4, backward=mode, solver=TIGHT),
                              nn.Linear(5, 2, dtype=DT))
        x = torch.randn(8, 4, dtype=DT)
        model(x).pow(2).sum().backward()
        assert set(n for n, p in model.named_parameters() if p.grad is not None) == {n for n, _ in model.named_parameters()}
        grads[mode] = [p.grad.clone() for p in model.parameters()]
    for gc, gi in zip(grads["contrastive"], grads["implicit"]):
        assert torch.allclose(gc, gi, atol=1e-6, rtol=1e-5)


def test_implicit_gradient_vanishes_on_weakly_active_nnls_but_contrastive_does_not():
    """Dictionary atoms at zero make z_i = 0 weakly active (zero multiplier): implicit
    differentiation gives those atoms no gradient (dead forever), the contrastive surrogate revives
    them where the loss wants z_i > 0. This is the behaviour examples/nnls_layer.py relies on."""
    gen = torch.Generator().manual_seed(4)
    D0 = torch.randn(6, 4, generator=gen, dtype=DT)
    D0[:, 2:] = 0
    y = torch.rand(5, 6, generator=gen, dtype=DT)
    out = {}
    for mode in ("contrastive", "implicit"):
        energy = LeastSquaresEnergy(D0, ridge=0.1)
        layer = ArgminLayer(energy, Box.nonnegative(), beta=1e-3, nudging="positive", backward=mode, solver=TIGHT)
        z = layer(y)
        (-z.sum()).backward()      # the loss wants every code to grow
        out[mode] = (energy.D.grad[:, 2:].abs().sum().item(), layer.last_backward.weakly_active)
    assert out["implicit"][0] == 0.0 and out["implicit"][1] >= 10
    assert out["contrastive"][0] > 1e-3


@pytest.mark.parametrize("beta", [0, 0.0, -1.0, float("nan"), float("inf"), True])
def test_invalid_beta_is_rejected(beta):
    """β = 0, negative or non-finite would divide by zero or nudge the wrong way silently."""
    with pytest.raises(ValueError, match="Invalid beta"):
        ArgminLayer(ProximalEnergy(), beta=beta)
    if beta is not True:
        with pytest.raises(ValueError, match="Invalid beta"):
            contrastive_surrogate(ProximalEnergy(), lambda z: z.sum(), torch.zeros(1, 2), beta=0 if beta == -1.0 else beta)


def test_wrong_shape_constraints_are_rejected():
    """Bounds that broadcast to a bigger or different shape than z would silently change the problem."""
    a = torch.zeros(3, 4, dtype=DT)
    with pytest.raises(ValueError, match="does not match"):
        ArgminLayer(ProximalEnergy(), Box(lower=torch.zeros(5)))(a)
    with pytest.raises(ValueError, match="does not match"):
        ArgminLayer(ProximalEnergy(), Box(upper=torch.ones(2, 3, 4)))(a)
    with pytest.raises(ValueError, match="lower bound must be < its upper"):
        Box(1.0, 0.0)
    with pytest.raises(ValueError, match="Invalid lower"):
        Box(float("nan"))


def test_bad_options_and_inputs_are_rejected():
    with pytest.raises(ValueError, match="Invalid nudging"):
        ArgminLayer(ProximalEnergy(), nudging="up")
    with pytest.raises(ValueError, match="Invalid backward"):
        ArgminLayer(ProximalEnergy(), backward="unroll")
    with pytest.raises(TypeError, match="FunctionEnergy"):
        ArgminLayer(lambda z: z)
    with pytest.raises(ValueError, match="NaN or inf"):
        ArgminLayer(ProximalEnergy())(torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="one value per sample"):
        solve(FunctionEnergy(lambda z: z.sum()), [], init=torch.zeros(2, 3), solver=TIGHT)
    with pytest.raises(ValueError, match="pass init="):
        ArgminLayer(FunctionEnergy(lambda z, a: (z - a).pow(2).sum(-1)))(torch.zeros(2, 3))


def test_unbounded_nonconvex_energy_reports_divergence():
    """A concave energy has no minimiser: the solver must stop with a ConvergenceError naming
    non-convexity rather than return a huge z."""
    energy = FunctionEnergy(lambda z, a: -0.5 * (z - a).pow(2).sum(-1), init=lambda a: a + 0.1)
    with pytest.raises(ConvergenceError, match="not convex"):
        ArgminLayer(energy)(torch.zeros(2, 3, dtype=DT))


def _saddle_energy():
    # ½z₁² − ½z₂² + ¼z₂⁴: z = 0 is a stationary point (a saddle), the minima are at z₂ = ±1.
    return FunctionEnergy(lambda z, a: 0.5 * (z[..., 0] - a[..., 0]).pow(2) - 0.5 * z[..., 1].pow(2) + 0.25 * z[..., 1].pow(4),
                          init=lambda a: torch.zeros_like(a), convex=False)


def test_nonconvex_energy_is_detected_by_contrastive_backward():
    """Started at a saddle, the forward solve stops there; the nudged solve then finds a lower energy,
    which cannot happen for a convex energy. Guards against returning a meaningless 'gradient'."""
    a = torch.zeros(1, 2, dtype=DT, requires_grad=True)
    z = ArgminLayer(_saddle_energy(), beta=1e-2, solver=TIGHT)(a)
    with pytest.raises(ConvergenceError, match="not convex"):
        z[:, 1].sum().backward()


def test_nonconvex_energy_is_detected_by_implicit_backward():
    """Implicit differentiation needs a positive definite Hessian; at the saddle CG meets negative
    curvature and must say so."""
    a = torch.zeros(1, 2, dtype=DT, requires_grad=True)
    z = ArgminLayer(_saddle_energy(), backward="implicit", solver=TIGHT)(a)
    with pytest.raises(ConvergenceError, match="not positive definite"):
        z[:, 1].sum().backward()


def test_iteration_limit_raises_or_warns():
    """Non-convergence is reported, never silent: raise by default, ConvergenceWarning on request."""
    gen = torch.Generator().manual_seed(0)
    D = torch.randn(8, 6, generator=gen, dtype=DT)
    y = torch.randn(4, 8, generator=gen, dtype=DT)
    with pytest.raises(ConvergenceError, match="no convergence in 3 iterations"):
        ArgminLayer(LeastSquaresEnergy(D), Box.nonnegative(), solver=AcceleratedProjectedGradient(max_iter=3, tol=1e-12))(y)
    with pytest.warns(ConvergenceWarning):
        ArgminLayer(LeastSquaresEnergy(D), Box.nonnegative(),
                    solver=AcceleratedProjectedGradient(max_iter=3, tol=1e-12, on_fail="warn"))(y)
    for bad in (dict(max_iter=0), dict(tol=0.0), dict(on_fail="skip")):
        with pytest.raises(ValueError, match="Invalid"):
            AcceleratedProjectedGradient(**bad)


def test_float32_layer_runs_and_keeps_dtype():
    """Device/dtype agnostic: a float32 input gives float32 codes and gradients."""
    y = torch.rand(4, 6)
    energy = LeastSquaresEnergy(torch.randn(6, 3), ridge=0.1)
    layer = ArgminLayer(energy, Box.nonnegative(), beta=1e-2, solver=AcceleratedProjectedGradient(tol=1e-5))
    z = layer(y.requires_grad_(True))
    z.sum().backward()
    assert z.dtype == torch.float32 and y.grad.dtype == torch.float32 and energy.D.grad.dtype == torch.float32


@pytest.mark.parametrize("batch", [1, 100, 1000])
def test_contrastive_gradient_accuracy_does_not_degrade_with_the_batch(batch):
    """With a mean loss, g = ∂ℓ/∂z* shrinks like 1/batch, and so does the nudge β g: a fixed solver
    tolerance made the gradient error grow with the batch (measured on this NNLS problem: 0.06% at B = 1,
    2% at B = 100, 30% at B = 1000). The nudged solve's tolerance scales with β·max|g|, so the error
    stays below 1% at the default settings."""
    gen = torch.Generator().manual_seed(1)
    D = torch.randn(12, 6, generator=gen, dtype=DT)
    y = torch.rand(batch, 12, generator=gen, dtype=DT)
    t = torch.rand(batch, 6, generator=gen, dtype=DT)
    grads = {}
    for mode in ("contrastive", "implicit"):
        energy = LeastSquaresEnergy(D.clone(), ridge=0.5)
        layer = ArgminLayer(energy, Box.nonnegative(), beta=1e-3, backward=mode)
        ((layer(y) - t) ** 2).sum(1).mean().backward()
        grads[mode] = energy.D.grad
    err = float((grads["contrastive"] - grads["implicit"]).norm() / grads["implicit"].norm())
    assert err < 1e-2, err


def test_float32_nudge_below_precision_warns():
    """In float32 a nudge below what the dtype resolves cannot give an accurate gradient: warn, do not
    return a silently wrong one."""
    gen = torch.Generator().manual_seed(2)
    D = torch.randn(12, 6, generator=gen)
    y = torch.rand(4, 12, generator=gen)
    layer = ArgminLayer(LeastSquaresEnergy(D, ridge=0.5), beta=1e-6)
    with pytest.warns(ConvergenceWarning, match="precision of torch.float32"):
        layer(y).sum().backward()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nnls_layer_trains_in_float32_at_default_settings(seed):
    """The README's NNLS layer, default solver and β, float32, batch 50: training must not stop on a
    ConvergenceError because float32 cannot reach a 1e-6 residual (the solver's tolerance is floored
    at what the dtype resolves)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data[:500] / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target[:500])
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    nnls = ArgminLayer(LeastSquaresEnergy(0.3 * torch.rand(32, 24, generator=gen), ridge=0.1), Box.nonnegative(),
                       beta=1e-3, nudging="symmetric")
    model = nn.Sequential(nn.Linear(64, 32), nnls, nn.Linear(24, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(0, 500, 50):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + 50]), labels[i:i + 50])
        loss.backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unbounded_energy_is_refused_in_float32_too(dtype):
    """In float32 a diverging iterate absorbs its own step (z − g == z once |z| ≈ 1e7), so a residual
    computed in float32 read 0 and an unbounded energy came back 'converged' at z ≈ 2e7."""
    energy = FunctionEnergy(lambda z, a: -(z * a).sum(1), init=lambda a: torch.zeros_like(a))
    with pytest.raises(ConvergenceError, match="not bounded below"):
        ArgminLayer(energy)(torch.ones(2, 3, dtype=dtype))


@pytest.mark.parametrize("nudging", ["symmetric", "positive"])
def test_stacked_argmin_layers_backpropagate_through_both(nudging):
    """Two argmin layers in one model: autograd chains their contrastive backwards (the top-down
    recursion of the bilevel paper). Oracle: the same function written with torch.linalg.solve and a
    ReLU, differentiated by float64 autograd. The quadratic energies make the linearised surrogate
    exact, so the gradients agree to rounding (symmetric) or to O(β) (positive)."""
    from inferlearn.bilevel import QuadraticEnergy

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, generator=gen, dtype=DT)
    W1 = torch.randn(6, 4, generator=gen, dtype=DT, requires_grad=True)
    W2 = torch.randn(3, 6, generator=gen, dtype=DT, requires_grad=True)
    M = torch.randn(6, 6, generator=gen, dtype=DT)
    Q1 = (M @ M.T + 6 * torch.eye(6, dtype=DT)).requires_grad_(True)
    d2 = (torch.rand(3, generator=gen, dtype=DT) + 0.5).requires_grad_(True)
    t = torch.randn(5, 3, generator=gen, dtype=DT)
    first = ArgminLayer(QuadraticEnergy(), beta=1e-4, nudging=nudging)
    second = ArgminLayer(QuadraticEnergy(), Box.nonnegative(), beta=1e-4, nudging=nudging)
    params = [W1, W2, Q1, d2]

    def loss_layers():
        z1 = first(Q1, x @ W1.T)
        z2 = second(torch.diag(d2), z1 @ W2.T)
        return ((z2 - t) ** 2).sum()

    def loss_oracle():
        z1 = torch.linalg.solve(0.5 * (Q1 + Q1.T), (x @ W1.T).T).T
        z2 = torch.relu((z1 @ W2.T) / d2)
        return ((z2 - t) ** 2).sum()

    got = torch.autograd.grad(loss_layers(), params)
    ref = torch.autograd.grad(loss_oracle(), params)
    tol = 1e-7 if nudging == "symmetric" else 1e-2
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


def test_the_argmin_solvers_share_the_engine_vocabulary_of_failures():
    """``on_fail`` means the same for FISTA, the augmented Lagrangian and the engine's solvers: "ignore" records a
    missed iteration limit in the returned info without raising or warning."""
    import warnings

    from inferlearn.bilevel import AugmentedLagrangian
    from inferlearn.engine.solvers import ON_FAIL

    assert ON_FAIL == ("warn", "raise", "ignore")
    Q = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=torch.float64)
    c = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z, info = AcceleratedProjectedGradient(max_iter=2, tol=1e-14, on_fail="ignore")(
            QuadraticEnergy(), Box.nonnegative(), torch.zeros(1, 2, dtype=torch.float64), (Q, c))
    assert not info.converged and info.iterations == 2 and torch.isfinite(z).all()
    for solver in (AcceleratedProjectedGradient, AugmentedLagrangian):
        for mode in ON_FAIL:
            solver(on_fail=mode)
