"""NNLS solver and the DeepFacto NMF module against scipy and exact factorisations."""
import numpy as np
import pytest
import torch
from scipy.optimize import nnls as scipy_nnls
from torch import nn

from inferlearn.admm import ADMMConfig, BlockADMM
from inferlearn.admm.nmf import NMF, nnls, nnls_gram

torch.set_num_threads(1)


@pytest.mark.parametrize("m, r", [(30, 8), (12, 12), (40, 3)])
def test_nnls_matches_scipy(m, r):
    """Coordinate-descent NNLS must return scipy.optimize.nnls's solution (a second, active-set
    implementation); guards against a wrong update, a lost gradient update or an early stop."""
    g = torch.Generator().manual_seed(m + r)
    A = torch.randn(m, r, generator=g, dtype=torch.float64)
    B = torch.randn(m, 6, generator=g, dtype=torch.float64)
    X = nnls(A, B)
    assert float(X.min()) >= 0
    for k in range(B.shape[1]):
        ref, _ = scipy_nnls(A.numpy(), B[:, k].numpy())
        np.testing.assert_allclose(X[:, k].numpy(), ref, atol=1e-8)


def test_nnls_gram_reports_convergence():
    """The Gram-form solver reports converged/not converged honestly (inexact solves are allowed
    inside block-ADMM, so this flag is the only signal)."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(50, 10, generator=g, dtype=torch.float64)
    C = torch.randn(4, 10, generator=g, dtype=torch.float64)
    _, info = nnls_gram(A.T @ A, C, max_sweeps=1, tol=1e-14)
    assert not info.converged
    _, info = nnls_gram(A.T @ A, C, max_sweeps=500, tol=1e-10)
    assert info.converged and info.pg_norm < 1e-9


def test_rank_larger_than_features_is_an_error():
    """Guards against silently building an over-complete 'low-rank' factorisation."""
    with pytest.raises(ValueError, match="Invalid NMF rank 9: it must lie in 1..8"):
        NMF(8, 9)
    with pytest.raises(ValueError, match="Invalid NMF rank 0"):
        NMF(8, 0)


def test_projection_and_fit_recover_exact_factorisation():
    """On Z = S₀M₀ᵀ with non-negative factors of rank r, NMF.fit must reach a near-zero residual and
    the test-time projection of each sample must equal scipy's NNLS with the learnt basis. Guards
    against a projection that is not the NNLS minimiser and a fit that does not decrease the residual."""
    g = torch.Generator().manual_seed(0)
    Z = torch.rand(150, 4, generator=g, dtype=torch.float64) @ torch.rand(20, 4, generator=g, dtype=torch.float64).T
    m = NMF(20, 4, dtype=torch.float64, sweeps=500, tol=1e-12)
    S = m.fit(Z, iters=150)
    assert float((Z - S @ m.M.T).norm() / Z.norm()) < 5e-3
    P = m(Z[:5])
    for i in range(5):
        ref, _ = scipy_nnls(m.M.numpy(), Z[i].numpy())
        np.testing.assert_allclose(P[i].numpy(), ref, atol=1e-7)


def test_nmf_between_blocks_trains_and_keeps_constraints():
    """DeepFacto inside batch block-ADMM: M ≥ 0 and S ≥ 0 at all times, the NMF constraint
    residual ‖Z₁ − S Mᵀ‖ falls, the next block only sees S (its input width is the rank), and the
    training loss falls. Guards against a sign error in the V update, negative scores leaking
    through, and an NMF that the next block bypasses."""
    torch.manual_seed(0)
    X = torch.rand(120, 10)
    y = (X[:, :5].sum(1) > X[:, 5:].sum(1)).long()
    blocks = [nn.Sequential(nn.Linear(10, 12), nn.ReLU()), NMF(12, 4), nn.Linear(4, 2)]
    tr = BlockADMM(blocks, ADMMConfig(batch_size=40, lr=0.01, beta=[20.0, 20.0], zeta=[0.025, 0.05], nmf_init_iters=20))
    tr.init_state(X, y)
    base = torch.nn.functional.cross_entropy(tr.predict(X), y)
    ms = [tr.epoch() for _ in range(40)]
    assert float(blocks[1].M.min()) >= 0 and float(tr.Z[1].min()) >= 0
    assert tr.Z[1].shape == (120, 4)
    assert ms[-1]["rel_residual_2"] < 0.1
    assert float(torch.nn.functional.cross_entropy(tr.predict(X), y)) < float(base) - 0.05


def test_nmf_placement_errors():
    """An NMF module cannot be first/last or used in online mode (its basis update needs all samples)."""
    with pytest.raises(ValueError, match="cannot be the first or last block"):
        BlockADMM([NMF(4, 2), nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="mode='batch'"):
        BlockADMM([nn.Linear(3, 4), NMF(4, 2), nn.Linear(2, 2)], ADMMConfig(mode="online"))
