"""Block-ADMM against exact oracles: closed-form least squares, plain training, float64 autograd."""
import dataclasses
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.admm import ADMMConfig, BlockADMM

torch.set_num_threads(1)


def _linear_problem(T=3, N=64, d=5, h=4, c=3):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, d, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(d, c, generator=g, dtype=torch.float64) + 0.3 * torch.randn(N, c, generator=g,
                                                                                     dtype=torch.float64)
    torch.manual_seed(1)
    widths = [d] + [h] * (T - 1) + [c]
    blocks = [nn.Linear(a, b).double() for a, b in zip(widths[:-1], widths[1:])]
    return X, Y, blocks


def test_linear_network_converges_to_least_squares_and_residuals_vanish():
    """A 3-block linear network (widths 5-4-4-3, rank ≥ 3 = outputs) trained by block-ADMM must reach
    the closed-form least-squares loss, and the constraint residuals ‖Z_t − f_t(Z_{t-1})‖ must go to
    zero. Guards against wrong signs/terms in the Z, Θ or dual updates (any of which leaves a gap or a
    non-zero residual at the fixed point) and against a test-time pass that ignores trained blocks."""
    X, Y, blocks = _linear_problem()
    Xa = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
    best = 0.5 * (Xa @ torch.linalg.lstsq(Xa, Y).solution - Y).pow(2).sum(1).mean()
    tr = BlockADMM(blocks, ADMMConfig(batch_size=64, optimizer="sgd", lr=0.1, beta=1.0, zeta=0.5, loss="mse"))
    tr.init_state(X, Y)
    first = tr.epoch()
    for _ in range(299):
        m = tr.epoch()
    loss = 0.5 * (tr.predict(X) - Y).pow(2).sum(1).mean()
    assert float(loss - best) < 1e-8
    assert float(loss - best) > -1e-10  # cannot beat least squares
    assert m["residual_1"] < 1e-6 * first["residual_1"] + 1e-9
    assert m["residual_2"] < 1e-6 * first["residual_2"] + 1e-9


@pytest.mark.parametrize("mode", ["batch", "online"])
def test_one_block_is_plain_training(mode):
    """With T = 1 there are no decoupling variables and block-ADMM must be plain mini-batch training
    of the block (same order of samples, same optimiser): guards against extra terms, rescaled
    losses or a different sampling order in the single-block case."""
    torch.manual_seed(0)
    X, y = torch.randn(50, 6), torch.randint(0, 3, (50,))
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    ref = copy.deepcopy(net)
    cfg = ADMMConfig(mode=mode, batch_size=16, optimizer="adam", lr=0.01, seed=3)
    tr = BlockADMM([net], cfg)
    if mode == "batch":
        tr.init_state(X, y)
    opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        tr.epoch() if mode == "batch" else tr.epoch(X, y)
        perm = torch.randperm(50, generator=g)
        for a in range(0, 50, 16):
            idx = perm[a:a + 16]
            opt.zero_grad()
            F.cross_entropy(ref(X[idx]), y[idx]).backward()
            opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_z_update_matches_autograd_of_augmented_lagrangian():
    """One batch iteration's Z updates must equal gradient steps on the per-sample augmented
    Lagrangian computed independently with float64 autograd, in reverse order t = T-1 … 1, and the
    dual update must add the new residuals. Guards against a missing term (e.g. the next block's),
    a wrong order, stale Z_{t+1} or a mis-scaled step."""
    torch.manual_seed(0)
    N = 20
    X = torch.randn(N, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (N,))
    blocks = [nn.Sequential(nn.Linear(4, 5), nn.Tanh()).double(), nn.Sequential(nn.Linear(5, 6), nn.Sigmoid()).double(),
              nn.Linear(6, 3).double()]
    beta, zeta = [0.7, 1.3], [0.2, 0.4]
    tr = BlockADMM(blocks, ADMMConfig(batch_size=N, optimizer="sgd", lr=0.05, beta=beta, zeta=zeta, z_steps=2,
                                      chunk_size=7))
    tr.init_state(X, y)
    with torch.no_grad():
        tr.U[0].normal_(0, 0.1)
        tr.U[1].normal_(0, 0.1)
        tr.Z[0].add_(0.05 * torch.randn_like(tr.Z[0]))
    Z1, Z2, U1, U2 = (t.clone() for t in (*tr.Z, *tr.U))
    tr._theta_pass()  # Θ step first (as in the iteration); the oracle starts from the new weights
    f1, f2, f3 = blocks

    def lagr(z1, z2):  # Σ_i per-sample augmented Lagrangian
        return (F.cross_entropy(f3(z2), y, reduction="sum") + 0.5 * beta[0] * (z1 - f1(X) + U1).pow(2).sum()
                + 0.5 * beta[1] * (z2 - f2(z1) + U2).pow(2).sum())

    for _ in range(2):
        z2 = Z2.clone().requires_grad_(True)
        Z2 = (z2 - zeta[1] * torch.autograd.grad(lagr(Z1, z2), z2)[0]).detach()
    for _ in range(2):
        z1 = Z1.clone().requires_grad_(True)
        Z1 = (z1 - zeta[0] * torch.autograd.grad(lagr(z1, Z2), z1)[0]).detach()
    tr._z_update(2)
    tr._z_update(1)
    torch.testing.assert_close(tr.Z[1], Z2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tr.Z[0], Z1, rtol=1e-12, atol=1e-12)
    res, _ = tr._dual_update()
    with torch.no_grad():
        r1, r2 = Z1 - f1(X), Z2 - f2(Z1)
    torch.testing.assert_close(tr.U[0], U1 + r1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tr.U[1], U2 + r2, rtol=1e-12, atol=1e-12)
    assert math.isclose(res[1], float(r2.pow(2).sum(1).mean().sqrt()), rel_tol=1e-10)


def test_adaptive_penalty_keeps_unscaled_dual():
    """When the constraint error exceeds η_k the adaptive rule must raise β by c and keep the
    unscaled dual λ = β U (so U shrinks by 1/c); below η_k it must update U and keep β. Guards
    against updating both, or rescaling the wrong way."""
    X, Y, blocks = _linear_problem(T=2)
    tr = BlockADMM(blocks, ADMMConfig(batch_size=64, optimizer="sgd", lr=0.1, beta=1.0, zeta=0.5, loss="mse",
                                      adaptive=True, eta0=1e-12, penalty_growth=3.0))
    tr.init_state(X, Y)
    tr.epoch()
    with torch.no_grad():
        tr.U[0].fill_(0.6)
    tr.epoch()
    assert tr.beta == [9.0]
    torch.testing.assert_close(tr.U[0], torch.full_like(tr.U[0], 0.2))
    tr.cfg = dataclasses.replace(tr.cfg, eta0=1e12)
    r = tr._constraint_residual(1, slice(None)).detach()
    before = tr.U[0].clone()
    tr._dual_update()
    assert tr.beta == [9.0]
    torch.testing.assert_close(tr.U[0], before + r)


def test_online_scalar_dual_update():
    """Online block-ADMM keeps one scalar dual per block and updates it by λ_t ← λ_t + ρ_t h_t with
    h_t ≥ 0 the mean squared constraint error; guards against per-sample state leaking into the
    online mode and against a dual that never moves."""
    torch.manual_seed(0)
    X, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    blocks = [nn.Sequential(nn.Linear(6, 8), nn.ReLU()), nn.Linear(8, 3)]
    tr = BlockADMM(blocks, ADMMConfig(mode="online", batch_size=64, beta=2.0, zeta=0.5, z_steps=3))
    m = tr.epoch(X, y)
    assert tr.Z == [] and tr.U == []
    assert m["h_1"] > 0
    assert math.isclose(tr.lam[0], 2.0 * m["h_1"], rel_tol=1e-6)


def test_random_shift_moves_pixels_by_drawn_offsets():
    """The vectorised augmentation must equal a per-image crop of the zero-padded image at the
    drawn offsets (same generator draws), for flat and image-shaped input. Guards against swapped
    row/column offsets or a gather that mixes images."""
    from inferlearn.admm import random_shift

    x = torch.rand(6, 2, 5, 7)
    out = random_shift(2, (2, 5, 7))(x, torch.Generator().manual_seed(4))
    shifts = torch.randint(-2, 3, (6, 2), generator=torch.Generator().manual_seed(4))
    pad = F.pad(x, (2, 2, 2, 2))
    ref = torch.stack([pad[i, :, 2 + dy:7 + dy, 2 + dx:9 + dx] for i, (dy, dx) in enumerate(shifts.tolist())])
    assert torch.equal(out, ref)
    flat = random_shift(2, (2, 5, 7))(x.reshape(6, -1), torch.Generator().manual_seed(4))
    assert torch.equal(flat, ref.reshape(6, -1))


@pytest.mark.parametrize("primal_steps", [1, 2])
def test_fused_sweep_equals_separate_z_and_dual_updates(primal_steps):
    """The fused Z-sweep + dual pass (the fast path) must reproduce the reference order
    (all Z updates in reverse, then all dual updates) to float64 round-off, over several
    iterations with 4 blocks and uneven chunks. Guards against the fused path using a stale Z, an
    updated U too early, or the wrong f_1(X)."""
    torch.manual_seed(0)
    X, y = torch.randn(30, 5, dtype=torch.float64), torch.randint(0, 3, (30,))

    def make():
        torch.manual_seed(1)
        blocks = [nn.Linear(5, 6), nn.Sequential(nn.Tanh(), nn.Linear(6, 6)), nn.Sequential(nn.ReLU(), nn.Linear(6, 4)),
                  nn.Sequential(nn.Tanh(), nn.Linear(4, 3))]
        tr = BlockADMM([b.double() for b in blocks], ADMMConfig(batch_size=8, beta=[0.5, 1.0, 2.0], zeta=0.3, z_steps=2,
                                                                 primal_steps=primal_steps, chunk_size=7))
        tr.init_state(X, y)
        return tr

    fast, ref = make(), make()
    ref.fused = False
    for _ in range(3):
        m_fast, m_ref = fast.epoch(), ref.epoch()
    for a, b in zip(fast.Z + fast.U, ref.Z + ref.U):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for k in set(m_ref) - {"theta_seconds", "z_dual_seconds"}:
        assert math.isclose(m_fast[k], m_ref[k], rel_tol=1e-9, abs_tol=1e-12), k


class _PerBlockOptimizers:
    """Algorithm 1 as written: one torch.optim optimiser per block (the reference for the shared one)."""

    def __init__(self, blocks, make):
        self.opts = [make(b.parameters()) for b in blocks]

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()


@pytest.mark.parametrize("mode, optimizer", [("batch", "adam"), ("batch", "sgd"), ("online", "adam")])
def test_one_optimizer_equals_one_per_block(mode, optimizer):
    """The trainer steps all blocks with ONE optimiser (one parameter group per block). Since each
    block's term touches only its own parameters and SGD/Adam keep per-parameter state, this must
    equal one optimiser per block bit for bit (unfused), and the fused kernels must agree to float
    round-off. Guards against a shared optimiser that couples blocks (e.g. a global gradient norm or
    shared moments) or a fused path that changes the update."""
    torch.manual_seed(0)
    X, y = torch.randn(40, 6), torch.randint(0, 3, (40,))

    def make(fused, per_block=False):
        torch.manual_seed(1)
        blocks = [nn.Linear(6, 7), nn.Sequential(nn.Tanh(), nn.Linear(7, 5)), nn.Sequential(nn.ReLU(), nn.Linear(5, 3))]
        cfg = ADMMConfig(mode=mode, batch_size=16, optimizer=optimizer, lr=0.01, momentum=0.9 if optimizer == "sgd"
                         else 0.0, beta=[0.5, 2.0], zeta=0.3, z_steps=2, fused_optimizer=fused, seed=2)
        tr = BlockADMM(blocks, cfg)
        if per_block:
            cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam
            kw = {"lr": 0.01, "momentum": 0.9} if optimizer == "sgd" else {"lr": 0.01}
            tr.optimizer = _PerBlockOptimizers(blocks, lambda p: cls(p, **kw))
        if mode == "batch":
            tr.init_state(X, y)
        return tr

    ref, one, fused = make(False, per_block=True), make(False), make(True)
    for _ in range(3):
        for tr in (ref, one, fused):
            tr.epoch() if mode == "batch" else tr.epoch(X, y)
    params = [torch.cat([p.detach().flatten() for b in tr.blocks for p in b.parameters()]) for tr in (ref, one, fused)]
    assert torch.equal(params[0], params[1])
    torch.testing.assert_close(params[2], params[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(ref.Z + ref.U, one.Z + one.U):
        assert torch.equal(a, b)
