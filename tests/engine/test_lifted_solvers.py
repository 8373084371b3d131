"""Inference solvers for lifted networks, against independent oracles.

Oracles: scipy's bounded-variable least squares (``lsq_linear``, method ``bvls``: an active-set
method with finite termination, written independently of our code) on the energy written as a
sum of squares; the closed form for linear units; and :class:`ReferenceSolver` (checked against
both) for the fast and the paper's solvers on random and briefly trained networks.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import lsq_linear

from inferlearn.engine.problems import LiftedEnergy, contrastive_problem
from inferlearn.errors import ConvergenceError, ConvergenceWarning
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.engine.solvers import BlockProjectedGradient, CoordinateDescent, ReferenceSolver, SolveInfo, get_solver

UNITS = ["linear", "relu", "hard-sigmoid", "hard-tanh"]


def _net(units, arch="12-9-8-7-4", seed=0, trained=False, dtype=torch.float64):
    """A random network, or one after 60 steps of back-propagation (weights grow and align)."""
    model = MLP(arch, units, seed=seed, init_scale=1.5, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(64, model.sizes[0], generator=gen, dtype=dtype) - 0.3
    labels = torch.randint(0, model.sizes[-1], (64,), generator=gen)
    if trained:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(60):
            opt.zero_grad()
            out = model(x)
            (0.5 * (out - one_hot(labels, out.shape[1], dtype)).pow(2).sum(1).mean()).backward()
            opt.step()
        assert all(torch.isfinite(p).all() for p in model.parameters())
    return model, x[:10], labels[:10]


def _bvls(energy: LiftedEnergy, x: np.ndarray, y: np.ndarray | None) -> tuple[np.ndarray, float]:
    """min over hidden z of Σ_k (w_k/2)‖z_k − W z_{k-1} − b‖² as bounded least squares (one row)."""
    W = [w.numpy() for w in energy.weights]
    b = [v.numpy() for v in energy.biases]
    sizes = energy.sizes
    L = energy.depth
    nh = sizes[1:L]
    off = np.concatenate([[0], np.cumsum(nh)])
    rows, rhs = [], []
    for k in range(1, L + 1):
        if k == L and y is None:
            continue   # a free output is eliminated: its term is zero at the optimum
        s = math.sqrt(energy.term_weights[k])
        M = np.zeros((sizes[k], off[-1]))
        d = b[k - 1].copy()   # residual z_k − W z_{k-1} − b = M z − d
        if k < L:
            M[:, off[k - 1]:off[k]] = np.eye(sizes[k])
        else:
            d = d - y         # clamped output: y − W z_{L-1} − b = −W z_{L-1} − (b − y)
        if k > 1:
            M[:, off[k - 2]:off[k - 1]] -= W[k - 1]
        else:
            d = d + W[0] @ x
        rows.append(s * M)
        rhs.append(s * d)
    M, d = np.vstack(rows), np.concatenate(rhs)
    lo = np.concatenate([np.full(n, u.lower) for n, u in zip(nh, energy.units)])
    hi = np.concatenate([np.full(n, u.upper) for n, u in zip(nh, energy.units)])
    if np.all(np.isinf(lo)) and np.all(np.isinf(hi)):
        z = np.linalg.lstsq(M, d, rcond=None)[0]   # linear units: the closed form
    else:
        z = lsq_linear(M, d, bounds=(lo, hi), method="bvls", tol=1e-15, lsmr_tol=None).x
    return z, 0.5 * float(np.sum((M @ z - d) ** 2))


@pytest.mark.parametrize("units", UNITS)
def test_reference_matches_bvls_and_closed_form(units):
    """Guards against a wrong energy, gradient, Hessian or active-set step: the reference minimiser
    and minimum must equal an independent bounded least-squares solver's (closed form for linear)."""
    model, x, labels = _net(units, trained=True)
    e = LiftedEnergy.from_model(model, gamma=0.5)
    y = one_hot(labels, 4, torch.float64)
    p = contrastive_problem(e, x[:4], y[:4])
    hidden, info = ReferenceSolver().solve(p)
    assert info.converged and info.residual < 1e-10
    z = torch.cat(hidden, 1).numpy()
    values = p.value(hidden).numpy()
    for i in range(8):
        zi, vi = _bvls(e, p.x[i].numpy(), p.target[i].numpy() if bool(p.clamped[i]) else None)
        assert abs(values[i] - vi) <= 1e-10 * max(1.0, abs(vi))
        np.testing.assert_allclose(z[i], zi, atol=1e-7)


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize("trained", [False, True])
def test_fast_and_paper_solvers_reach_reference_minimum(units, trained):
    """Guards against a solver that stops early or converges to a wrong point (e.g. a bad step size
    or a stale pre-activation): energy within 1e-6 relative of the reference minimum, γ = 1/8."""
    model, x, labels = _net(units, seed=2, trained=trained)
    e = LiftedEnergy.from_model(model, gamma=1 / 8)
    p = contrastive_problem(e, x, one_hot(labels, 4, torch.float64))
    ref = p.value(ReferenceSolver().solve(p)[0])
    for solver in (BlockProjectedGradient(), CoordinateDescent()):
        hidden, info = solver.solve(p)
        assert isinstance(info, SolveInfo) and info.iterations >= 1
        p.check_feasible(hidden)
        gap = (p.value(hidden) - ref)
        assert (gap >= -1e-12).all(), f"{solver.name} below the minimum: reference wrong"
        assert (gap <= 1e-6 * ref.abs() + 1e-12).all(), f"{solver.name}: energy gap {gap.max():.3g}"


def test_float32_fast_solver_close_to_reference():
    """Guards against float32 rounding spoiling the default training configuration."""
    model, x, labels = _net("relu", arch="30-16-16-16-5", seed=4, trained=False, dtype=torch.float32)
    e = LiftedEnergy.from_model(model, gamma=1 / 8)
    y = one_hot(labels, 5)
    p = contrastive_problem(e, x, y)
    hidden, _ = BlockProjectedGradient().solve(p)
    p64 = p.to(torch.float64)
    ref = p64.value(ReferenceSolver().solve(p64)[0])
    got = p64.value([h.double() for h in hidden])
    assert ((got - ref) <= 1e-5 * ref.abs() + 1e-9).all()


def test_linear_closed_form_for_every_solver():
    """Guards against solvers that are only approximately right: for linear units the minimiser
    solves (H) z = c exactly; CD and block-PG run to a tight tolerance must match it to 1e-8."""
    model, x, labels = _net("linear", seed=5)
    e = LiftedEnergy.from_model(model, gamma=1 / 8)
    p = e.problem(x, one_hot(labels, 4, torch.float64))
    zero = [torch.zeros_like(h) for h in p.forward_init()]
    c = -torch.cat(p.gradients(zero), 1)   # the gradient is affine: g(z) = H z − c
    z_star = torch.linalg.solve(e.hessian(True), c.T).T
    for solver in (CoordinateDescent(sweeps=200, tol=1e-13), BlockProjectedGradient(tol=1e-12, max_iter=500),
                   ReferenceSolver()):
        hidden, _ = solver.solve(p)
        torch.testing.assert_close(torch.cat(hidden, 1), z_star, atol=1e-8, rtol=0)


def test_free_linear_minimiser_is_forward_pass_and_fused_equals_separate():
    """Guards against coupling between the stacked free and clamped rows: solving them together must
    equal solving them apart; and the free minimiser of a linear network is its forward pass."""
    model, x, labels = _net("relu", seed=6, trained=True)
    e = LiftedEnergy.from_model(model, gamma=0.25)
    y = one_hot(labels, 4, torch.float64)
    solver = ReferenceSolver()
    both, _ = solver.solve(contrastive_problem(e, x, y))
    free, _ = solver.solve(e.problem(x))
    clamped, _ = solver.solve(e.problem(x, y))
    for zb, zf, zc in zip(both, free, clamped):
        torch.testing.assert_close(zb, torch.cat([zf, zc]), atol=1e-9, rtol=0)
    lin, _, _ = _net("linear", seed=6)
    el = LiftedEnergy.from_model(lin, gamma=0.25)
    p = el.problem(x)
    hidden, _ = BlockProjectedGradient().solve(p)
    for h, f in zip(hidden, p.forward_state()[0]):
        torch.testing.assert_close(h, f)
    assert float(p.value(hidden).abs().max()) < 1e-20


def test_nonconvergence_warns_or_raises_and_never_hangs():
    """Guards against silent garbage when a solver runs out of iterations, and against endless loops."""
    model, x, labels = _net("relu", seed=7, trained=True)
    e = LiftedEnergy.from_model(model, gamma=4.0)   # strong feedback: slow convergence
    p = e.problem(x, one_hot(labels, 4, torch.float64))
    pg = BlockProjectedGradient(max_iter=2, tol=1e-12)
    with pytest.warns(ConvergenceWarning, match=r"raise max_iter or tol \(warned once per run\)"):
        _, info = pg.solve(p)
    assert not info.converged and info.iterations == 2 and info.residual > 1e-12
    _, again = pg.solve(p)   # once per solver (a run): a batch's miss is recorded, not printed again
    assert not again.converged
    with pytest.raises(ConvergenceError):
        BlockProjectedGradient(max_iter=2, tol=1e-12, on_fail="raise").solve(p)
    with pytest.warns(ConvergenceWarning):
        CoordinateDescent(sweeps=1, tol=1e-12).solve(p)
    # the paper's fixed sweeps: judged against the starting residual, warned once per solver when far from it
    cd = CoordinateDescent(sweeps=1)
    with pytest.warns(ConvergenceWarning, match="far from equilibrium"):
        _, info = cd.solve(p)
    assert not info.converged and info.far and info.residual > 1e-3 * info.initial_residual
    _, again = cd.solve(p)   # once per run: the second solve records it silently (warnings are errors here)
    assert again.far
    _, quiet = CoordinateDescent(sweeps=1, far_rtol=None).solve(p)
    assert not quiet.converged and not quiet.far
    huge = LiftedEnergy([w * 1e200 for w in e.weights], e.biases, e.units, gamma=1.0)
    with pytest.raises(ConvergenceError, match="non-finite"):
        BlockProjectedGradient(max_iter=3, on_fail="ignore").solve(huge.problem(x, one_hot(labels, 4, torch.float64)))


def test_bad_input_messages():
    """Guards against silent garbage from invalid settings: each raises with a clear message."""
    model, x, labels = _net("relu")
    with pytest.raises(ValueError, match="Invalid gamma: 0"):
        LiftedEnergy.from_model(model, gamma=0)
    with pytest.raises(ValueError, match="Invalid gamma: -1"):
        LiftedEnergy.from_model(model, gamma=-1)
    with pytest.raises(ValueError, match="Unknown unit type 'softplus'"):
        LiftedEnergy([layer.weight for layer in model.layers], None, ["softplus"] * 3)
    e = LiftedEnergy.from_model(model)
    with pytest.raises(ValueError, match="Target must have shape"):
        e.problem(x, torch.zeros(x.shape[0], 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="Expected input of shape"):
        e.problem(x[:, :5])
    with pytest.raises(ValueError, match="Clamped rows need a target"):
        e.problem(x, clamped=torch.ones(x.shape[0], dtype=torch.bool))
    with pytest.raises(ValueError, match="Unknown solver"):
        get_solver("newton")
    with pytest.raises(ValueError, match="Invalid max_iter"):
        BlockProjectedGradient(max_iter=0)
    with pytest.raises(ValueError, match="Invalid tol"):
        CoordinateDescent(tol=-1.0)
    with pytest.raises(ValueError, match="leaves its unit set"):
        BlockProjectedGradient().solve(e.problem(x), init=[-torch.ones(x.shape[0], n, dtype=torch.float64)
                                                          for n in e.sizes[1:-1]])
