"""Dual energies (strong and weak duality), free-energy scoring, γ sweep and filter pictures.

Oracles: the primal minimum from the reference solver (strong duality: D(λ*) = min E, docs/maths.md §A);
weak duality for random feasible multipliers (D(λ) ≤ min E); the exact O(γ) rate of the sweep.
"""
from __future__ import annotations

import pytest
import torch

from inferlearn.experiments.alignment import gamma_sweep, sweep_markdown
from inferlearn.engine.duals import class_energies, dual_value, duality_gap, free_energy, multipliers
from inferlearn.engine.problems import LiftedEnergy, contrastive_problem
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.engine.solvers import ReferenceSolver
from inferlearn.experiments.weight_pictures import filter_grid, plot_filters

UNITS = ["linear", "relu", "hard-sigmoid", "hard-tanh"]


def _setup(units, seed=0):
    model = MLP("9-8-7-6-3", units, seed=seed, init_scale=1.5, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.layers:
            layer.bias.uniform_(-0.3, 0.3, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(5, 9, generator=gen, dtype=torch.float64) * 2 - 0.5
    labels = torch.randint(0, 3, (5,), generator=gen)
    return model, x, labels


@pytest.mark.parametrize("units", UNITS)
def test_strong_and_weak_duality(units):
    """Guards against a wrong dual (signs, conjugates, bias terms, output handling): at the primal
    minimiser the dual value equals the primal minimum; random feasible multipliers give less."""
    model, x, labels = _setup(units)
    e = LiftedEnergy.from_model(model, gamma=0.5)
    p = contrastive_problem(e, x, one_hot(labels, 3, torch.float64))
    p_nudged = e.problem(x, nudge=torch.randn(5, 3, dtype=torch.float64), beta=0.4)
    for prob in (p, p_nudged):
        hidden, _ = ReferenceSolver().solve(prob)
        primal = prob.value(hidden)
        lam = multipliers(prob, hidden)
        torch.testing.assert_close(dual_value(prob, lam), primal, rtol=1e-9, atol=1e-11)
        assert duality_gap(prob, hidden).abs().max() < 1e-9
        gen = torch.Generator().manual_seed(1)
        for _ in range(10):
            # random multipliers, made feasible top-down: λ_k = W_kᵀ λ_{k+1} (+ s ≥ 0 for ReLU)
            rand = [lam_k + 0.3 * torch.randn(lam_k.shape, generator=gen, dtype=torch.float64) for lam_k in lam]
            rand[-1] = torch.where(prob.clamped.unsqueeze(1), rand[-1], lam[-1])   # free output: λ_L = −βg is fixed
            if units in ("linear", "relu"):
                for k in range(e.depth - 1, 0, -1):
                    rand[k - 1] = rand[k] @ e.weights[k]
                    if units == "relu":
                        rand[k - 1] = rand[k - 1] + torch.rand(rand[k - 1].shape, generator=gen, dtype=torch.float64)
            d = dual_value(prob, rand)
            assert torch.isfinite(d).all()
            assert (d <= primal + 1e-10).all()
    # an infeasible ReLU/linear multiplier gives −inf, never a spurious bound
    if units in ("linear", "relu"):
        bad = [lam_k.clone() for lam_k in multipliers(p, ReferenceSolver().solve(p)[0])]
        bad[0] = bad[0] - 1.0
        assert torch.isinf(dual_value(p, bad)).all() and (dual_value(p, bad) < 0).all()


def test_free_energy_zero_for_linear_and_class_energies_predict():
    """Guards against a wrong sign or phase in scoring: the free energy of a linear network is 0 (its
    forward pass is exact), and the minimal class energy of a weak-feedback net is the forward arg-max."""
    model, x, labels = _setup("linear")
    assert free_energy(model, x).abs().max() < 1e-20
    model, x, labels = _setup("relu", seed=3)
    fe = free_energy(model, x, gamma=1 / 8)
    assert (fe >= 0).all() and (fe > 0).any()
    ce = class_energies(model, x, gamma=1 / 64)
    assert ce.shape == (5, 3) and (ce > 0).all()
    assert torch.equal(ce.argmin(1), model(x).argmax(1))


def test_gamma_sweep_rows_and_linear_units_exact_cosine():
    """Guards against the sweep mislabelling γ or parameters; for linear units at tiny γ the
    contrastive gradient equals BackProp's (ẑ → forward pass), so cosine → 1."""
    model, x, labels = _setup("relu")
    rows = gamma_sweep(model, x, labels, gammas=(1 / 2, 1 / 64, 1 / 1024))
    assert {r["gamma"] for r in rows} == {1 / 2, 1 / 64, 1 / 1024} and len(rows) == 3 * 8
    err = {g: max(r["rel_error"] for r in rows if r["gamma"] == g) for g in (1 / 2, 1 / 64, 1 / 1024)}
    assert err[1 / 2] > err[1 / 64] > err[1 / 1024] and err[1 / 1024] < 1e-2
    assert "| 1/2 |" in sweep_markdown(rows) and "| 1/1024 |" in sweep_markdown(rows)
    lin, x, labels = _setup("linear")
    rows = gamma_sweep(lin, x, labels, gammas=(1e-4,))
    assert min(r["cosine"] for r in rows) > 0.9999


def test_gamma_sweep_j0_output_layer_matches_hidden_layers_do_not():
    """Guards against the J_0 sweep comparing the wrong gradient: J_0's output-layer gradient is the
    clamped phase's, equal to contrastive's (the free phase has a zero output residual), while its
    hidden layers keep the O(1) residuals of units at their bounds and do not approach back-propagation
    as γ → 0 (the paper's claim), unlike contrastive's."""
    model, x, labels = _setup("relu")
    j1 = gamma_sweep(model, x, labels, gammas=(1 / 256,))
    j0 = gamma_sweep(model, x, labels, gammas=(1 / 256,), rule="lifted-j0")
    assert {r["rule"] for r in j0} == {"lifted-j0"}
    out = "layers.3.weight"
    c1 = next(r["cosine"] for r in j1 if r["param"] == out)
    c0 = next(r["cosine"] for r in j0 if r["param"] == out)
    assert c0 == pytest.approx(c1, abs=1e-9)
    hidden = [r["cosine"] for r in j0 if r["param"] in ("layers.0.weight", "layers.1.weight")]
    assert max(hidden) < 0.9 < min(r["cosine"] for r in j1 if r["param"].endswith("weight"))
    with pytest.raises(ValueError, match="Unknown rule"):
        gamma_sweep(model, x, labels, gammas=(1.0,), rule="eqprop")


def test_filter_pictures(tmp_path):
    """Guards against filters tiled in the wrong order or shape, and a silent bad-shape picture."""
    w = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6) - 10
    grid = filter_grid(w, (2, 3), n=4)
    assert grid.shape == (2 * 3 - 1, 2 * 4 - 1)
    torch.testing.assert_close(grid[:2, :3], (w[0] / w[0].abs().max()).reshape(2, 3))
    torch.testing.assert_close(grid[3:5, 4:7], (w[3] / w[3].abs().max()).reshape(2, 3))
    with pytest.raises(ValueError, match="do not fit"):
        filter_grid(w, (3, 3))
    plot_filters({"a": torch.randn(64, 784), "b": torch.randn(64, 784)}, (1, 28, 28), tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
