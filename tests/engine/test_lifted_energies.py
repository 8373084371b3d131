"""Lifted energies and their gradients, against float64 autograd, finite differences and docs/maths.md §A.

Oracles: autograd of the per-sample energy (activation and weight gradients); central finite
differences of the *minimum* energy (the envelope theorem: the gradient of min_z E is ∂_W E at the
minimiser); the exact linear-unit identity ∇J_1 = γ^{L-1} · (back-propagated error) · ẑ_kᵀ.
"""
from __future__ import annotations

import copy

import pytest
import torch

from inferlearn.training.schedules import check_schedule, make_schedule, warmup_schedule

from inferlearn.diagnostics import rule_gradients
from inferlearn.engine.problems import LiftedEnergy, contrastive_grads, contrastive_problem
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.rules import BackProp, Contrastive, LiftedJ0, make_rule
from inferlearn.engine.solvers import ReferenceSolver

UNITS = ["linear", "relu", "hard-sigmoid", "hard-tanh"]


def _setup(units="relu", arch="10-8-7-6-3", seed=0, batch=6, gamma=0.5):
    model = MLP(arch, units, seed=seed, init_scale=1.5, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.layers:   # non-zero biases so that their terms are exercised
            layer.bias.uniform_(-0.3, 0.3, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 10)
    x = torch.rand(batch, model.sizes[0], generator=gen, dtype=torch.float64) * 2 - 0.5
    labels = torch.randint(0, model.sizes[-1], (batch,), generator=gen)
    return model, LiftedEnergy.from_model(model, gamma), x, labels


@pytest.mark.parametrize("units", UNITS)
def test_value_and_activation_gradients_match_autograd(units):
    """Guards against a wrong energy term (weights γ^k, biases, eliminated or clamped output, nudge)
    or a wrong analytic gradient used by every solver."""
    model, e, x, labels = _setup(units)
    y = one_hot(labels, 3, torch.float64)
    g = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    clamped = torch.tensor([True, False, True, False, False, True])
    p = e.problem(x, y, clamped=clamped, nudge=g, beta=0.3)
    hidden = [h + 0.1 for h in p.forward_init()]
    # explicit formula: Σ_k γ^{k-1}/2 ‖z_k − W_{k-1} z_{k-1} − b_{k-1}‖² + β gᵀ z_L on free rows
    zs = p.full(hidden)
    explicit = sum(0.5 * 0.5 ** k * (zs[k + 1] - zs[k] @ model.layers[k].weight.T - model.layers[k].bias).pow(2).sum(1)
                   for k in range(4))
    explicit = explicit + 0.3 * (g * zs[-1]).sum(1) * (~clamped)
    torch.testing.assert_close(p.value(hidden), explicit)
    assert torch.equal(zs[-1][clamped], y[clamped])
    # the eliminated output is optimal: ∂/∂z_L of the full energy + nudge vanishes on free rows
    zL = zs[-1].clone().requires_grad_()
    full = e.value(zs[:-1] + [zL]) + 0.3 * (g * zL).sum(1) * (~clamped)
    (gz,) = torch.autograd.grad(full.sum(), zL)
    assert gz[~clamped].abs().max() < 1e-12
    # activation gradients
    leaves = [h.clone().requires_grad_() for h in hidden]
    auto = torch.autograd.grad(p.value(leaves).sum(), leaves)
    for a, b in zip(auto, p.gradients(hidden)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("units", ["relu", "hard-sigmoid", "hard-tanh"])
def test_envelope_gradients_match_autograd_and_finite_differences(units):
    """Guards against a wrong weight-gradient formula and against using a non-minimiser: the envelope
    gradient must equal autograd of E at the minimiser and central differences of min_z E."""
    model, e, x, labels = _setup(units, seed=1)
    y = one_hot(labels, 3, torch.float64)
    solver = ReferenceSolver()
    clamped = torch.tensor([True, False] * 3)

    def min_value(energy):
        p = energy.problem(x, y, clamped=clamped, nudge=torch.ones(6, 3, dtype=torch.float64), beta=0.2)
        hidden, _ = solver.solve(p)
        return p, hidden, p.value(hidden).sum()

    p, hidden, _ = min_value(e)
    zs = p.full(hidden)
    grads = e.weight_grads(zs, 1.0)
    # (a) autograd of the energy (plus nudge) at fixed minimiser
    ws = [w.clone().requires_grad_() for w in e.weights]
    bs = [b.clone().requires_grad_() for b in e.biases]
    e2 = LiftedEnergy(ws, bs, e.units, gamma=e.gamma)
    e2.weights, e2.biases = ws, bs   # keep the graph (the constructor detaches)
    total = e2.value(zs).sum() + 0.2 * (torch.ones(6, 3, dtype=torch.float64) * zs[-1]).sum(1)[~clamped].sum()
    auto = torch.autograd.grad(total, ws + bs)
    for k, (gw, gb) in enumerate(grads):
        torch.testing.assert_close(gw, auto[k], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(gb, auto[4 + k], rtol=1e-9, atol=1e-10)
    # (b) central differences of the minimum along random directions
    gen = torch.Generator().manual_seed(5)
    for k in range(4):
        D = torch.randn(e.weights[k].shape, generator=gen, dtype=torch.float64)
        eps = 1e-5
        vals = []
        for sgn in (1, -1):
            ws = [w.clone() for w in e.weights]
            ws[k] = ws[k] + sgn * eps * D
            vals.append(min_value(LiftedEnergy(ws, e.biases, e.units, gamma=e.gamma))[2])
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert abs(float(fd - (grads[k][0] * D).sum())) < 1e-6 * (1 + abs(float(fd)))


def test_contrastive_grads_equal_signed_weight_grads():
    """Guards against the fused first-layer shortcut (ž_1 − ẑ_1) xᵀ differing from the definition."""
    model, e, x, labels = _setup("hard-sigmoid", seed=2)
    p = contrastive_problem(e, x, one_hot(labels, 3, torch.float64))
    hidden, _ = ReferenceSolver().solve(p)
    zs = p.full(hidden)
    coef = torch.cat([-torch.ones(6), torch.ones(6)]).double() * 0.7
    for (a, b), (c, d) in zip(contrastive_grads(e, zs, 0.7), e.weight_grads(zs, coef)):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, d)


@pytest.mark.parametrize("gamma", [1.0, 1 / 8])
def test_linear_units_contrastive_gradient_is_backprop_error_times_clamped_activation(gamma):
    """Guards against a wrong sign, scale (γ^{L-1}) or phase in the contrastive rule: for linear
    units ∇_{W_k} J_1 = γ^{L-1} δ_{k+1} ẑ_kᵀ exactly, δ_L = W_{L-1} ẑ_{L-1} + b − y, δ_k = W_kᵀ δ_{k+1}
    (docs/maths.md §A), and the rule divides by γ^{L-1}."""
    model, e, x, labels = _setup("linear", seed=3, gamma=gamma)
    y = one_hot(labels, 3, torch.float64)
    rule = Contrastive(gamma=gamma, solver="reference")
    got = rule_gradients(rule, model, x, labels)
    p = e.problem(x, y)
    hidden, _ = ReferenceSolver().solve(p)
    zs = [x, *hidden]
    delta = e.pre(4, hidden[-1]) - y
    for k in range(3, -1, -1):
        torch.testing.assert_close(got[f"layers.{k}.weight"], delta.T @ zs[k] / 6, rtol=1e-8, atol=1e-11)
        torch.testing.assert_close(got[f"layers.{k}.bias"], delta.mean(0), rtol=1e-8, atol=1e-11)
        delta = delta @ e.weights[k]


def test_relu_contrastive_gradient_approaches_backprop_as_gamma_shrinks():
    """Guards against an O(1) error in the contrastive gradient: its distance to back-propagation's
    must shrink about linearly with γ (docs/maths.md §A)."""
    model, _, x, labels = _setup("relu", arch="10-12-12-3", seed=4, batch=20)
    bp = rule_gradients(BackProp(), model, x, labels)
    errs = []
    for gamma in (1 / 8, 1 / 128, 1 / 512, 1 / 2048):
        g = rule_gradients(Contrastive(gamma=gamma, solver="reference"), model, x, labels)
        errs.append(max(float((g[n] - bp[n]).norm() / bp[n].norm()) for n in bp))
    assert errs[0] > errs[1] > errs[2] > errs[3]
    # asymptotically linear in γ: 4× smaller γ gives ≥ 3× smaller error (O(√γ) would give 2×)
    assert errs[1] / errs[2] > 3 and errs[2] / errs[3] > 3
    assert errs[3] < 0.005


def test_fast_rule_gradient_matches_reference_in_float32():
    """Guards against the default (float32, block-PG, fused) gradient being inaccurate: within 1e-3 of
    the float64 reference-solver gradient on a 4-layer network."""
    model = MLP("40-16-16-16-5", "relu", seed=5)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(50, 40, generator=gen) * (torch.rand(50, 40, generator=gen) < 0.3)
    labels = torch.randint(0, 5, (50,), generator=gen)
    fast = rule_gradients(Contrastive(), model, x, labels)
    ref = rule_gradients(Contrastive(solver="reference"), copy.deepcopy(model).double(), x.double(), labels)
    for n in ref:
        assert float((fast[n].double() - ref[n]).norm() / ref[n].norm()) < 1e-3, n


@pytest.mark.parametrize("hidden, gamma, warned", [(5, 1 / 32, True), (5, 1 / 8, False), (3, 1 / 8, False)])
def test_float32_precision_warning_marks_unresolved_contrastive_gradients(hidden, gamma, warned):
    """Guards the precision warning of directly solved phases (``phases="direct"``): where it fires (γ^{L-1}
    below 100 float32 ε) the float32 gradient of the first layer is far from the float64 reference solver's,
    and where it does not, close to it. (The default, ``phases="auto"``, solves such cases differentially:
    tests/engine/test_signal_precision.py.)"""
    import warnings

    from inferlearn.errors import PrecisionWarning

    model = MLP([30] + [20] * hidden + [5], "relu", seed=0)
    gen = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 30, generator=gen), torch.randint(0, 5, (64,), generator=gen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = rule_gradients(Contrastive(gamma=gamma, phases="direct"), model, x, labels)
        ref = rule_gradients(Contrastive(gamma=gamma, solver="reference"), copy.deepcopy(model).double(),
                             x.double(), labels)
    assert any(issubclass(w.category, PrecisionWarning) for w in caught) == warned
    err = float((fast["layers.0.weight"].double() - ref["layers.0.weight"]).norm() / ref["layers.0.weight"].norm())
    assert (err > 0.1) if warned else (err < 0.02), err


def test_a_directly_solved_nudged_phase_stops_relative_to_its_signal():
    """Guards the nudged phase's tolerance (float64, 5 hidden layers, β γ^{L-1} ≈ 3e-6 below the solver's absolute
    1e-5): solved directly it stops at a tolerance relative to its signal, so the first layer's gradient is within
    1 % of the reference solver's without any warning (stopped at the absolute 1e-5 it was ~100 % off: the nudge
    had not reached the first layers)."""
    import warnings

    from inferlearn.errors import PrecisionWarning

    gen = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 30, generator=gen, dtype=torch.float64), torch.randint(0, 5, (64,), generator=gen)
    model = MLP([30] + [20] * 5 + [5], "relu", seed=0).double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = rule_gradients(make_rule("eqprop", {"beta": 0.1, "gamma": 1 / 8, "phases": "direct"}), model, x, labels)
    ref = rule_gradients(make_rule("eqprop", {"beta": 0.1, "gamma": 1 / 8, "solver": "reference"}), model, x, labels)
    err = float((g["layers.0.weight"] - ref["layers.0.weight"]).norm() / ref["layers.0.weight"].norm())
    assert err < 0.01, err
    assert not any(issubclass(w.category, PrecisionWarning) for w in caught)


def test_rules_registry_options_and_lr_schedule():
    """Guards against a rule missing from the registry, CLI strings not parsed, or a bad option accepted."""
    r = make_rule("contrastive", {"gamma": "1/4", "solver": "cd", "max_iter": "3"})
    assert isinstance(r, Contrastive) and r.gamma == 0.25 and r._solver.sweeps == 3
    j0 = make_rule("lifted-j0", {"scaling": "global"})
    assert isinstance(j0, LiftedJ0) and j0.scaling == "global"
    opt = torch.optim.SGD(MLP("6-5-3").parameters(), lr=1.0)
    sched = warmup_schedule(opt, warmup_epochs=2, warmup_scale=0.05, after=0.5)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.05, 0.05, 0.5, 0.5]
    for bad, msg in [({"gamma": "0"}, "Invalid gamma: 0"), ({"gamma": "-1"}, "Invalid gamma: -1.0"),
                     ({"solver": "magic"}, "Unknown solver")]:
        with pytest.raises(ValueError, match=msg):
            make_rule("contrastive", bad)
    with pytest.raises(ValueError, match="Invalid warmup_scale"):
        warmup_schedule(opt, warmup_scale=0)
    # the named, parameterised warm-up (J_0 with the global scaling: benchmarks/results/j0_investigation_scaling.md)
    opt = torch.optim.SGD(MLP("6-5-3").parameters(), lr=1.0)
    sched = make_schedule("warmup:2:0.001:0.1", opt)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.001, 0.001, 0.1])
    for bad in ("warmup:2:0:0.1", "warmup:1.5:0.1:0.3", "warmup:2:0.1", "warmup:-1:0.1:0.3", "warmup:2:nan:1"):
        with pytest.raises(ValueError, match="use warmup:E:F:A"):
            check_schedule(bad)
    with pytest.raises(ValueError, match="Unknown option 'warmup_scale'"):
        make_rule("lifted-j0", {"warmup_scale": "0.1"})
    model = MLP("6-5-3", "relu", seed=0)
    with pytest.raises(ValueError, match="Labels out of range"):
        Contrastive().backward(model, torch.rand(4, 6), torch.tensor([0, 1, 2, 3]))


def test_lifted_j0_gradient_is_clamped_energy_gradient():
    """Guards against J_0 using the free phase or a wrong scale: it is ∇ mean Ê / γ^{L-1}."""
    model, e, x, labels = _setup("relu", seed=6)
    glob = rule_gradients(LiftedJ0(gamma=0.5, solver="reference", scaling="global"), model, x, labels)
    layer = rule_gradients(LiftedJ0(gamma=0.5, solver="reference"), model, x, labels)
    p = e.problem(x, one_hot(labels, 3, torch.float64))
    hidden, _ = ReferenceSolver().solve(p)
    for k, (gw, gb) in enumerate(e.weight_grads(p.full(hidden), 1 / (6 * 0.5 ** 3))):
        torch.testing.assert_close(glob[f"layers.{k}.weight"], gw)
        torch.testing.assert_close(glob[f"layers.{k}.bias"], gb)
        torch.testing.assert_close(layer[f"layers.{k}.weight"], gw * 0.5 ** (3 - k))
