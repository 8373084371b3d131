"""Taxonomy rules on one energy engine: oracle tests of their limit cases (float64).

* equilibrium propagation, β → 0: implicit differentiation on the same (free) equilibrium, computed
  by the argmin layer of :mod:`inferlearn.bilevel` (FISTA + CG on the lifted energy's Hessian, a
  second implementation of energy, solver and derivative);
* predictive coding with a weakly weighted output error: back-propagation (Whittington & Bogacz
  2017); with the hard clamp, a closed form for a linear network;
* predictive coding and lifted Fenchel networks: envelope gradients equal autograd of the energy
  at the inferred activations; the Fenchel-Young gap is ≥ 0 and zero at the forward pass.
"""
import copy

import pytest
import torch

from inferlearn.bilevel import AcceleratedProjectedGradient, ArgminLayer, Box, FunctionEnergy
from inferlearn.diagnostics import rule_gradients
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.rules import BackProp, make_rule
from inferlearn.engine.graph import read_graph
from inferlearn.engine.problems import LayeredProblem
from inferlearn.rules.lifted_fenchel import LiftedFenchel
from inferlearn.rules.predictive_coding import PredictiveCoding
from inferlearn.rules.eqprop import EquilibriumPropagation
from oracle_helpers import random_batch, relative_error as _rel

DT = torch.float64


def _data(n_in=6, n_out=3, b=8, seed=0):
    return random_batch(n_in, n_out, b, seed)


def _implicit_lifted_gradient(model, x, labels, gamma):
    """d ℓ(z_L*(W)) / dW with z* = argmin of the lifted energy (free output eliminated), by the
    argmin layer's implicit-differentiation backward: an independent path to the same limit."""
    m = copy.deepcopy(model)
    sizes = m.sizes
    L = m.depth
    hidden = sizes[1:L]
    w = [gamma ** (k - 1) for k in range(1, L + 1)]

    def split(z):
        return list(torch.split(z, hidden, dim=-1))

    def fn(z, xx):
        zs = [xx, *split(z)]
        e = 0
        for k in range(1, L):
            e = e + 0.5 * w[k - 1] * (zs[k] - m.layers[k - 1](zs[k - 1])).pow(2).sum(-1)
        return e

    class Lifted(torch.nn.Module, FunctionEnergy):
        def __init__(self):
            torch.nn.Module.__init__(self)
            FunctionEnergy.__init__(self, fn, init=lambda xx: torch.zeros(xx.shape[0], sum(hidden), dtype=DT))
            self.net = m

    lower = torch.cat([torch.full((n,), u.lower, dtype=DT) for n, u in zip(hidden, m.units)])
    upper = torch.cat([torch.full((n,), u.upper, dtype=DT) for n, u in zip(hidden, m.units)])
    layer = ArgminLayer(Lifted(), Box(lower=lower, upper=upper), backward="implicit",
                        solver=AcceleratedProjectedGradient(max_iter=20000, tol=1e-13))
    z = layer(x, init=torch.cat(m.forward_all(x)[0][1:L], dim=1))
    out = m.layers[L - 1](split(z)[-1])
    loss = 0.5 * (out - one_hot(labels, out.shape[1], DT)).pow(2).sum(1).mean()
    loss.backward()
    return {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.parametrize("units", ["relu", "hard-sigmoid"])
def test_eqprop_small_beta_matches_implicit_differentiation(units):
    """EqProp → implicit differentiation of the same equilibrium (Prop. 1): error O(β) for positive
    and negative nudging; symmetric nudging is exact here (O(β²) in general, and the β² term vanishes
    for the lifted QP). Guards against a wrong 1/(β w_L) scale, a sign error in
    the negative phase, and a symmetric mode that is secretly one-sided."""
    model = MLP("6-7-5-3", units=units, seed=3, dtype=DT)
    with torch.no_grad():   # zero biases make z = 0 weakly active for inputs with z_{k-1} = 0 (Prop. 2)
        for layer in model.layers:
            layer.bias.copy_(0.3 * torch.randn(layer.bias.shape, generator=torch.Generator().manual_seed(7), dtype=DT))
    x, labels = _data()
    gamma = 0.5
    implicit = _implicit_lifted_gradient(model, x, labels, gamma)
    for nudging, order in (("positive", 1), ("negative", 1), ("symmetric", 2)):
        errs = [_rel(rule_gradients(EquilibriumPropagation(beta=b, gamma=gamma, nudging=nudging, solver="reference"),
                                    model, x, labels), implicit) for b in (2e-3, 1e-3)]
        assert errs[1] < 1e-2, (nudging, errs)
        if order == 1:
            assert 1.5 < errs[0] / errs[1] < 2.6, (nudging, errs)
        else:   # quadratic energy, linear nudge, stable active set: ẑ is affine in β and the O(β²) term vanishes
            assert max(errs) < 1e-8, errs


def infer_and_grad(rule, model, x, target):
    """The rule's gradient (per layer ``(∇W, ∇b)``) and inferred hidden layers for a clamped ``target``."""
    model.zero_grad(set_to_none=True)
    info = rule.clamped_backward(model, x, target)
    return [(l.weight.grad.clone(), l.bias.grad.clone()) for l in model.layers], info.extras["hidden"]


def energy_value(rule, model, x, hidden, target):
    """Per-sample energy of the rule at ``hidden`` with the output clamped to ``target``."""
    return LayeredProblem(rule.energy(read_graph(model)), x, target=target).value(hidden)


def test_pc_with_weak_output_clamp_is_backprop():
    """Predictive coding at equilibrium with a weakly weighted output error (precision π → 0, so the
    hidden prediction errors are small) gives back-propagation's gradient with relative error O(π).
    Guards against wrong signs of the prediction errors, a missing f' factor, or weights read off
    before inference."""
    model = MLP("6-7-5-3", units="relu", seed=1, dtype=DT)
    x, labels = _data()
    y = one_hot(labels, 3, DT)
    names = [n for n, _ in model.named_parameters()]
    bp = rule_gradients(BackProp(fused=False), model, x, labels)
    errs = []
    for pi in (2e-3, 1e-3):
        pc = PredictiveCoding(steps=3000, step_size=0.2, tol=1e-13, output_weight=pi)
        grads, _ = infer_and_grad(pc, model, x, y)
        errs.append(_rel(dict(zip(names, [t for wb in grads for t in wb])), bp))
    assert errs[1] < 1e-2 and 1.6 < errs[0] / errs[1] < 2.5, errs


def test_pc_with_hard_clamp_filters_the_deltas_closed_form():
    """Hard clamp (π = 1), one linear hidden layer: the equilibrium hidden error is
    δ = (I + W₁ᵀW₁)^{-1} W₁ᵀ e with e = y − W₁a₁ (closed form), not back-propagation's W₁ᵀe — even
    for a tiny output error. Guards against claiming more than the maths gives."""
    model = MLP("6-5-3", units="linear", seed=2, dtype=DT)
    x, labels = _data()
    y = one_hot(labels, 3, DT)
    out = model(x).detach()
    target = out + 1e-3 * (y - out)
    grads, _ = infer_and_grad(PredictiveCoding(steps=4000, step_size=0.3, tol=1e-14), model, x, target)
    W1 = model.layers[1].weight.detach()
    e = target - out
    delta = torch.linalg.solve(torch.eye(5, dtype=DT) + W1.T @ W1, (e @ W1).T).T
    assert torch.allclose(grads[0][0], -(delta.T @ x) / x.shape[0], atol=1e-10)


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")   # few steps on purpose: the identity holds anywhere
@pytest.mark.parametrize("rule", [PredictiveCoding(steps=7), LiftedFenchel(steps=5), LiftedFenchel(steps=3, gamma=0.5)])
def test_clamped_rules_accumulate_the_envelope_gradient_of_their_energy(rule):
    """The weight gradient must be ∇_W F at the inferred activations (autograd of the energy with z
    held fixed; the Fenchel rule divides layer k−1 by its term weight γ^{k-1})."""
    model = MLP("6-7-5-3", units="hard-sigmoid", seed=2, dtype=DT, init_scale=2.0)
    x, labels = _data()
    y = one_hot(labels, 3, DT)
    grads, hidden = infer_and_grad(rule, model, x, y)

    model.zero_grad()
    F = energy_value(rule, model, x, hidden, y).mean()
    F.backward()
    for k, (layer, (gw, gb)) in enumerate(zip(model.layers, grads), start=1):
        scale = rule.gamma ** (k - 1) if isinstance(rule, LiftedFenchel) else 1.0
        assert torch.allclose(gw * scale, layer.weight.grad, atol=1e-10), k
        assert torch.allclose(gb * scale, layer.bias.grad, atol=1e-10), k


def test_fenchel_young_gap_is_nonnegative_and_zero_at_forward_pass():
    """E_k = ½‖z − a‖² − ½‖Π(a) − a‖² ≥ 0 on C, = 0 at z = Π(a): so the clamped energy at the forward
    pass with the target equal to the output is 0 and inference does not move (zero gradient)."""
    model = MLP("6-7-5-3", units="relu", seed=4, dtype=DT)
    x, _ = _data()
    rule = LiftedFenchel(steps=10)
    zs, _ = model.forward_all(x)
    assert float(energy_value(rule, model, x, zs[1:-1], zs[-1]).detach().abs().max()) < 1e-12
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        hidden = [torch.rand(z.shape, generator=gen, dtype=DT) * 3 for z in zs[1:-1]]
        assert float(energy_value(rule, model, x, hidden, zs[-1]).detach().min()) >= -1e-12
    grads, _ = infer_and_grad(rule, model, x, zs[-1].detach())
    assert max(float(g.abs().max()) for gw_gb in grads for g in gw_gb) < 1e-12


def test_inference_lowers_the_energy():
    """Inference must not increase the clamped energy from the forward-pass start (step sizes)."""
    model = MLP("6-7-5-3", units="relu", seed=5, dtype=DT)
    x, labels = _data()
    y = one_hot(labels, 3, DT)
    zs, _ = model.forward_all(x)
    for rule in (PredictiveCoding(steps=15), LiftedFenchel(steps=15)):
        e0 = float(energy_value(rule, model, x, zs[1:-1], y).detach().sum())
        _, hidden = infer_and_grad(rule, model, x, y)
        e1 = float(energy_value(rule, model, x, hidden, y).detach().sum())
        assert e1 < e0


@pytest.mark.parametrize("name", ["eqprop", "pc", "lifted-fenchel", "fenchel-bp"])
def test_contract_fills_accumulates_and_leaves_parameters(name):
    """Rule contract: finite .grad for every parameter, parameters untouched, two calls accumulate."""
    model = MLP("6-7-5-3", units="relu", seed=0)
    x, labels = _data()
    x = x.float()
    before = [p.detach().clone() for p in model.parameters()]
    rule = make_rule(name)
    rule.backward(model, x, labels)
    g1 = [p.grad.clone() for p in model.parameters()]
    rule.backward(model, x, labels)
    for p, b, g in zip(model.parameters(), before, g1):
        assert torch.equal(p.detach(), b)
        assert torch.isfinite(g).all()
        assert torch.allclose(p.grad, 2 * g, atol=1e-6)


@pytest.mark.parametrize("name, opts, msg", [
    ("eqprop", {"beta": 0}, "Invalid beta: 0"),
    ("eqprop", {"beta": float("nan")}, "Invalid beta"),
    ("eqprop", {"nudging": "both"}, "Invalid nudging"),
    ("eqprop", {"gamma": 0}, "Invalid gamma: 0"),
    ("pc", {"steps": -1}, "Invalid steps: -1"),
    ("pc", {"step_size": 0}, "Invalid step_size: 0"),
    ("lifted-fenchel", {"gamma": float("inf")}, "Invalid gamma"),
])
def test_bad_options(name, opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule(name, opts)


@pytest.mark.parametrize("engine", ["fused", "generic"])
def test_pc_warns_when_it_stops_before_its_tolerance(engine):
    """Every iterative rule that stops before convergence warns the same way (ConvergenceWarning naming
    what was reached), on both engines; without tol it runs exactly T steps silently."""
    from inferlearn.errors import ConvergenceWarning

    model = MLP("6-7-5-3", units="relu", seed=1)
    x, labels = torch.rand(8, 6), torch.randint(0, 3, (8,))
    with pytest.warns(ConvergenceWarning, match=r"stopped after 3 iterations .* > tol 1e-12"):
        make_rule("pc", {"steps": 3, "tol": 1e-12, "engine": engine}).backward(model, x, labels)
    # without tol: exactly T steps, judged by the far-from-equilibrium criterion (3 steps of 0.1 leave layer 1
    # with a remaining gradient 15x its prediction error: the output error has not reached it), warned once
    rule = make_rule("pc", {"steps": 3, "engine": engine})
    with pytest.warns(ConvergenceWarning, match="value node 1's remaining gradient"):
        info = rule.backward(model, x, labels)
    assert info.extras["far"] and not info.extras["converged"] and info.extras["inference_steps"] == 3
    rule.backward(model, x, labels)   # once per run (warnings are errors in the tests)
    quiet = make_rule("pc", {"steps": 100, "step_size": 0.2, "engine": engine}).backward(model, x, labels)
    assert not quiet.extras["far"]
    with pytest.raises(ValueError, match="Invalid steps: 0"):
        make_rule("pc", {"steps": 0, "engine": engine})


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")   # far from equilibrium on purpose
def test_pc_small_steps_at_the_hard_clamp_reach_layer_d_to_order_eta_t_power_d():
    """Small-step PC at the hard clamp is not back-propagation: after T steps of η from the forward pass the
    layer d levels below the output has its error to order C(T, d) η^d ≈ (ηT)^d/d! (the d-th term of the
    binomial expansion of the linear error recursion). Oracle: back-propagation's per-layer gradient; the PC
    gradient is aligned with it and its norm ratio is C(T, d) η^d to leading order (within 10 % at ηT = 0.05)."""
    import math

    model = MLP("6-7-5-4-3", units="relu", seed=3, dtype=DT)
    x, labels = _data(n_in=6, n_out=3, b=16, seed=1)
    grads = {}
    for name, rule in (("bp", BackProp()), ("pc", PredictiveCoding(steps=10, step_size=0.005))):
        model.zero_grad(set_to_none=True)
        rule.backward(model, x, labels)
        grads[name] = [l.weight.grad.clone() for l in model.layers]
    L = len(grads["bp"])
    for k in range(L - 1):
        d = L - 1 - k
        pc, bp = grads["pc"][k], grads["bp"][k]
        ratio = float(pc.norm() / bp.norm()) / (math.comb(10, d) * 0.005 ** d)
        assert 0.9 < ratio < 1.1, (k, ratio)
        assert float((pc * bp).sum() / (pc.norm() * bp.norm())) > 0.99, k
