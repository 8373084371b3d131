"""The paper's literal block-ADMM (``formulation="paper"``: a ``Z_T`` on the output) against oracles:
closed-form and slow-solver ``Z_T`` steps, a hand-written reverse sweep, Proposition 1's schedule."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm import online
from inferlearn.admm.config import loss_prox

torch.set_num_threads(1)


def _two_blocks(loss="cross-entropy", N=12, beta=(0.7, 1.3), zeta=(0.3, 1.0), z_steps=1, chunk=5):
    torch.manual_seed(0)
    X = torch.randn(N, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (N,))
    blocks = [nn.Sequential(nn.Linear(4, 5), nn.Tanh()).double(), nn.Linear(5, 3).double()]
    tr = BlockADMM(blocks, ADMMConfig(batch_size=N, optimizer="sgd", lr=0.05, beta=list(beta), zeta=list(zeta),
                                      z_steps=z_steps, loss=loss, chunk_size=chunk, formulation="paper"))
    tr.init_state(X, y)
    with torch.no_grad():  # away from the forward-pass initialisation, so that every term is active
        for u in tr.U:
            u.normal_(0, 0.2)
        for z in tr.Z:
            z.add_(0.1 * torch.randn_like(z))
    return tr, X, y, blocks


def test_paper_state_has_z_T_and_theta_T_sees_only_its_penalty():
    """The paper's form keeps a Z_T (N × outputs) and U_T; block T's Θ-term is its penalty, not the loss.
    Guards against a loss left on f_T(Z_{T-1}) (the default form) in the paper's form."""
    tr, X, y, (f1, f2) = _two_blocks()
    assert [tuple(z.shape) for z in tr.Z] == [(12, 5), (12, 3)] and len(tr.U) == 2
    idx = torch.arange(12)
    got = tr._theta_loss(idx)
    with torch.no_grad():
        want = (0.5 * 0.7 * (f1(X) - tr.Z[0] - tr.U[0]).pow(2).sum() + 0.5 * 1.3 * (f2(tr.Z[0]) - tr.Z[1] - tr.U[1]).pow(2).sum()) / 12
    torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss", ["quadratic", "mse"])
def test_z_T_step_is_the_closed_form_for_squared_losses(loss):
    """For ½‖z − target‖² the Z_T sub-problem has the minimiser (target + β a)/(1 + β), a = f_T(Z_{T-1}) − U_T;
    the stationarity condition must hold to round-off. Guards against a gradient step taken for the exact
    solve, a sign error in U_T or a wrong β."""
    tr, X, y, (f1, f2) = _two_blocks(loss="quadratic")
    if loss == "mse":
        tr.cfg = dataclasses.replace(tr.cfg, loss="mse")
        tr.Y = torch.randn(12, 3, dtype=torch.float64)
    beta = tr.beta[1]
    with torch.no_grad():
        a = f2(tr.Z[0]) - tr.U[1]
    tr._z_update(2)
    tgt = F.one_hot(y, 3).double() if loss == "quadratic" else tr.Y
    torch.testing.assert_close(tr.Z[1], (tgt + beta * a) / (1 + beta), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((tr.Z[1] - tgt) + beta * (tr.Z[1] - a), torch.zeros_like(a), rtol=0, atol=1e-12)


@pytest.mark.parametrize("beta", [0.05, 1.0, 20.0])
def test_z_T_step_solves_the_cross_entropy_subproblem(beta):
    """For cross-entropy the Z_T step must equal the minimiser of CE(z, y) + (β/2)‖z − a‖² found by a slow
    reference solver (scipy L-BFGS per sample, float64, tight tolerance), for small and large β.
    Guards against too few iterations, a wrong step bound or a missing β term."""
    from scipy.optimize import minimize

    tr, X, y, (f1, f2) = _two_blocks(beta=(1.0, beta))
    with torch.no_grad():
        a = f2(tr.Z[0]) - tr.U[1]
        a[0] += 6.0  # a sample far from its label's optimum
    got = loss_prox(tr.cfg.loss, a, y, tr.beta[tr.T - 1])
    for i in range(len(y)):
        ai, yi = a[i].numpy(), int(y[i])

        def fun(z):
            lse = np.log(np.exp(z - z.max()).sum()) + z.max()
            p = np.exp(z - lse)
            g = p.copy()
            g[yi] -= 1
            return lse - z[yi] + 0.5 * beta * ((z - ai) ** 2).sum(), g + beta * (z - ai)

        ref = minimize(fun, ai.copy(), jac=True, method="L-BFGS-B", options={"gtol": 1e-13, "ftol": 0, "maxiter": 10000})
        np.testing.assert_allclose(got[i].numpy(), ref.x, rtol=0, atol=1e-8)
    g = torch.softmax(got, 1) - F.one_hot(y, 3).double() + beta * (got - a)
    assert float(g.abs().max()) < 1e-10


@pytest.mark.parametrize("fused", [True, False])
def test_reverse_sweep_equals_hand_written_sequential_update(fused):
    """On a 2-block net the paper's sweep is: Z_2 ← argmin CE(z, y) + (β_2/2)‖z − f_2(Z_1) + U_2‖² (at the old
    Z_1), then z-steps of Z_1 on (β_1/2)‖z − f_1(X) + U_1‖² + (β_2/2)‖Z_2^new − f_2(z) + U_2‖², then
    U_t ← U_t + Z_t − f_t(Z_{t-1}). Written here by hand (float64 autograd, a slow solver for Z_2), it must
    match the trainer's fused and plain sweeps. Guards against the forward order, a stale Z_2 in the Z_1
    step, or a loss term left on f_2(Z_1)."""
    from scipy.optimize import minimize

    tr, X, y, (f1, f2) = _two_blocks(z_steps=2)
    (b1, b2), z1s = tr.beta, tr.zeta[0]
    Z1, Z2, U1, U2 = (t.clone() for t in (*tr.Z, *tr.U))
    with torch.no_grad():
        a = (f2(Z1) - U2).numpy()
    Z2n = np.zeros_like(a)
    for i in range(len(y)):
        obj = lambda z, i=i: float(torch.logsumexp(torch.tensor(z), 0) - z[int(y[i])] + 0.5 * b2 * ((z - a[i]) ** 2).sum())
        Z2n[i] = minimize(obj, a[i], method="BFGS", options={"gtol": 1e-12}).x
    Z2n = torch.tensor(Z2n)
    z1 = Z1
    for _ in range(2):
        z = z1.clone().requires_grad_(True)
        obj = 0.5 * b1 * (z - f1(X) + U1).pow(2).sum() + 0.5 * b2 * (Z2n - f2(z) + U2).pow(2).sum()
        z1 = (z - z1s * torch.autograd.grad(obj, z)[0]).detach()
    with torch.no_grad():
        r1, r2 = z1 - f1(X), Z2n - f2(z1)
    tr.fused = fused
    if fused:
        res, _ = tr._fused_z_dual_sweep()
    else:
        tr._z_update(2)
        tr._z_update(1)
        res, _ = tr._dual_update()
    torch.testing.assert_close(tr.Z[1], Z2n, rtol=0, atol=1e-6)  # BFGS reference: ~1e-7
    torch.testing.assert_close(tr.Z[0], z1, rtol=0, atol=1e-6)
    torch.testing.assert_close(tr.U[0], U1 + r1, rtol=0, atol=1e-6)
    torch.testing.assert_close(tr.U[1], U2 + r2, rtol=0, atol=1e-6)
    assert math.isclose(res[1], float(r2.pow(2).sum(1).mean().sqrt()), rel_tol=1e-5)


def test_fused_and_plain_paper_sweeps_agree_to_round_off():
    """The fused sweep (reusing f_T's forward for Z_{T-1}'s first step) must equal the plain one on 3 blocks."""
    torch.manual_seed(1)
    X, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    states = []
    for fused in (True, False):
        torch.manual_seed(2)
        blocks = [nn.Sequential(nn.Linear(4, 6), nn.Tanh()).double(), nn.Sequential(nn.Linear(6, 5), nn.Tanh()).double(),
                  nn.Linear(5, 3).double()]
        tr = BlockADMM(blocks, ADMMConfig(batch_size=8, optimizer="adam", lr=0.01, beta=0.8, zeta=0.4, z_steps=2,
                                          chunk_size=7, formulation="paper"))
        tr.fused = fused
        tr.init_state(X, y)
        for _ in range(3):
            m = tr.epoch()
        states.append(([z.clone() for z in tr.Z + tr.U], m["residual_3"]))
    for a, b in zip(states[0][0], states[1][0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert math.isclose(states[0][1], states[1][1], rel_tol=1e-9)


def test_paper_form_reaches_least_squares_on_a_linear_network():
    """With a squared loss and linear blocks the paper's form (Z_T, exact Z_T step) must still reach the
    closed-form least-squares loss, with all residuals (including Z_T's) vanishing."""
    g = torch.Generator().manual_seed(0)
    N, d, h, c = 64, 5, 4, 3
    X = torch.randn(N, d, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(d, c, generator=g, dtype=torch.float64) + 0.3 * torch.randn(N, c, generator=g, dtype=torch.float64)
    torch.manual_seed(1)
    blocks = [nn.Linear(d, h).double(), nn.Linear(h, h).double(), nn.Linear(h, c).double()]
    Xa = torch.cat([X, torch.ones(N, 1, dtype=X.dtype)], 1)
    best = 0.5 * (Xa @ torch.linalg.lstsq(Xa, Y).solution - Y).pow(2).sum(1).mean()
    tr = BlockADMM(blocks, ADMMConfig(batch_size=64, optimizer="sgd", lr=0.1, beta=1.0, zeta=0.5, loss="mse",
                                      formulation="paper"))
    tr.init_state(X, Y)
    first = tr.epoch()
    for _ in range(499):
        m = tr.epoch()
    loss = 0.5 * (tr.predict(X) - Y).pow(2).sum(1).mean()
    assert abs(float(loss - best)) < 1e-7
    assert m["residual_3"] < 1e-5 * first["residual_3"] + 1e-9


@pytest.mark.parametrize("p0, d", [(1, 0.9), (2, 0.8), (1, 1.0)])
def test_proposition_schedule_matches_formula(p0, d):
    """p_k = ⌈p_0 d^{−2k}⌉ (ε_k = ε_0 d^k and O(ε^{-2}) stochastic-gradient iterations), and an epoch runs p_k
    primal passes. Guards against an off-by-one in k, a linear schedule, or round-off in the ceiling."""
    tr, X, y, _ = _two_blocks()
    tr.cfg = dataclasses.replace(tr.cfg, primal_schedule="proposition", primal_steps=p0, eta_decay=d)
    for k in range(12):
        want = p0 if d == 1.0 else math.ceil(round(p0 * d ** (-2 * k), 9))
        assert tr.primal_steps_at(k) == want
    assert tr.epoch()["primal_steps"] == p0
    assert tr.epoch()["primal_steps"] == math.ceil(round(p0 * d ** -2, 9))


@pytest.mark.parametrize("kw, msg", [({"formulation": "paper", "mode": "online"}, "needs mode 'batch'"),
                                     ({"formulation": "thesis"}, "Unknown formulation 'thesis'"),
                                     ({"formulation": "paper", "loss": lambda o, t: o.sum()}, "needs a built-in loss"),
                                     ({"primal_schedule": "fast"}, "Unknown primal schedule 'fast'"),
                                     ({"primal_schedule": "proposition", "mode": "online"}, "needs mode 'batch'"),
                                     ({"primal_schedule": "proposition", "primal_growth": 1.0}, "set one of them")])
def test_bad_options_fail_clearly(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ADMMConfig(**kw)


def test_paper_beta_count_is_T():
    blocks = [nn.Linear(4, 5), nn.Linear(5, 3)]
    with pytest.raises(ValueError, match="Expected 2 values for beta"):
        BlockADMM(blocks, ADMMConfig(beta=[1.0], formulation="paper"))


def test_online_gradient_is_the_gradient_a_training_step_takes():
    """``online_gradient`` (used to measure gradient variance) must fill the gradient that the online step
    applies, without stepping: an SGD step of ``online_batch`` from the same state equals ``θ − lr·grad``.
    Guards against the variance benchmark measuring another gradient than training uses."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    blocks = [nn.Sequential(nn.Linear(4, 5), nn.Tanh()).double(), nn.Sequential(nn.Linear(5, 5), nn.Tanh()).double(),
              nn.Linear(5, 3).double()]
    tr = BlockADMM(blocks, ADMMConfig(mode="online", optimizer="sgd", lr=0.1, beta=1.0, zeta=0.1, z_steps=2,
                                      fused_optimizer=False))
    tr.lam = [0.3, 0.7]
    before = [p.detach().clone() for b in blocks for p in b.parameters()]
    tr.online_gradient(x, y)
    grads = [p.grad.clone() for b in blocks for p in b.parameters()]
    for p, q in zip((p for b in blocks for p in b.parameters()), before):
        assert torch.equal(p.detach(), q)
    online.online_batch(tr, x, y)
    for p, q, g in zip((p for b in blocks for p in b.parameters()), before, grads):
        torch.testing.assert_close(p.detach(), q - 0.1 * g, rtol=0, atol=1e-14)
