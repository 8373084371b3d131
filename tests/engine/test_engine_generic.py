"""Oracles of the generic engine (any chain) against the fused dense paths and against unrolled references.

* Generic = fused in float64, for every energy rule and unit type: the two engines are independent
  implementations (hand-written ``addmm`` loops vs forwards and adjoints through the layer maps).
* A conv lifted energy's minimiser equals the dense reference solver's (Newton-polished) minimiser
  on the same network with every layer map unrolled into its matrix (the Jacobian of the map).
* Weight gradients of the minimum energy equal central finite differences (envelope theorem).
* On a random conv net, Fenchel BP's gradient aligns with back-propagation's.
"""
import pytest
import torch
from torch import nn

from inferlearn.engine.graph import read_graph
from inferlearn.engine.problems import LiftedEnergy
from inferlearn.engine.problems import LayeredEnergy, LayeredProblem
from inferlearn.engine.solvers import ReferenceSolver
from inferlearn.models import MLP
from inferlearn.rules import make_rule
from inferlearn.units import Clamp

DT = torch.float64
TIGHT = {"tol": 1e-12, "max_iter": 20000, "on_fail": "raise"}


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return [p.grad.clone() for p in model.parameters()]


def _data(n=12, d=7, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=DT), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("units", ["relu", "hard-sigmoid", "hard-tanh", "linear"])
@pytest.mark.parametrize("name,opts", [
    ("contrastive", {"gamma": 0.25} | TIGHT),
    ("lifted-j0", {"gamma": 0.5} | TIGHT),
    ("lifted-j0", {"gamma": 0.5, "scaling": "global"} | TIGHT),
    ("eqprop", {"nudging": "symmetric"} | TIGHT),
    ("eqprop", {"nudging": "positive", "beta": 0.3} | TIGHT),
    ("eqprop", {"nudging": "negative", "loss": "cross-entropy"} | TIGHT),
    ("pc", {"steps": 20, "step_size": 0.2}),
    ("pc", {"steps": 10, "output_weight": 0.5}),
])
def test_generic_engine_equals_fused_path_in_float64(name, opts, units):
    """Guards against a wrong adjoint, sign, term weight, phase coefficient or scaling in either engine."""
    model = MLP("7-6-5-3", units, seed=1, dtype=DT, init_scale=1.5)
    with torch.no_grad():
        for layer in model.layers:
            layer.bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(9))
    x, labels = _data()
    fused = _grads(make_rule(name, opts | {"engine": "fused"}), model, x, labels)
    generic = _grads(make_rule(name, opts | {"engine": "generic"}), model, x, labels)
    for f, g in zip(fused, generic):
        torch.testing.assert_close(g, f, rtol=1e-8, atol=1e-10)


def test_generic_fenchel_bp_and_backprop_equal_their_fused_paths():
    """Fenchel BP through converted activations (autograd) equals the fused recursion; BackProp too."""
    model = MLP("7-6-5-3", "hard-sigmoid", seed=2, dtype=DT, init_scale=2.0)
    seq = nn.Sequential(model.layers[0], nn.Hardsigmoid(), model.layers[1], nn.Hardsigmoid(), model.layers[2])
    seq[1], seq[3] = Clamp("hard-sigmoid"), nn.Hardtanh(0.0, 1.0)   # box units, but not dense-detected
    x, labels = _data(seed=3)
    for name, opts in [("fenchel-bp", {"beta": 0.3}), ("backprop", {})]:
        fused = _grads(make_rule(name, opts), model, x, labels)
        rule = make_rule(name, opts | ({"fused": False} if name == "backprop" else {}))
        ref = _grads(rule, nn.Sequential(nn.Identity(), seq) if name == "backprop" else _non_dense(seq), x, labels)
        for f, g in zip(fused, ref):
            torch.testing.assert_close(g, f, rtol=1e-10, atol=1e-12)


def _non_dense(seq):
    """The same function as a chain whose first map is not a lone Linear (so the autograd path runs)."""
    class Keep(nn.Module):
        def forward(self, x):
            return x
    return nn.Sequential(Keep(), *seq)


def conv_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(2, 3, 2), Clamp("hard-sigmoid"), nn.Flatten(), nn.Linear(3, 3)).to(DT)


def _unrolled_energy(model, gamma, in_dim=16):
    """The dense lifted energy of the same network: each layer map as its Jacobian matrix and offset."""
    chain = read_graph(model)
    ws, bs, shape = [], [], (in_dim,)
    for link in chain.nodes:
        def flat_map(v, link=link, shape=shape):
            return link.map(v.reshape(1, *shape)).reshape(-1)
        zero = torch.zeros(int(torch.tensor(shape).prod()), dtype=DT)
        W = torch.autograd.functional.jacobian(flat_map, zero)
        with torch.no_grad():
            out = link.map(zero.reshape(1, *shape))
        ws.append(W.detach())
        bs.append(out.reshape(-1))
        shape = tuple(out.shape[1:])
    units = [l.units for l in chain.nodes[:-1]]
    return LiftedEnergy(ws, bs, units, gamma=gamma)


@pytest.mark.parametrize("clamped", [False, True])
def test_conv_lifted_minimiser_matches_unrolled_reference(clamped):
    """Guards against a wrong conv adjoint or step size: the generic solve of a conv net's lifted energy
    reaches the minimiser that the dense reference solver (block sweeps + active-set Newton, float64)
    finds for the unrolled network."""
    model = conv_net()
    x, labels = _data(n=6, d=16, seed=4)
    y = torch.nn.functional.one_hot(labels, 3).to(DT)
    gamma = 0.5
    generic = LayeredProblem(LayeredEnergy.lifted(read_graph(model), gamma), x, target=y if clamped else None)
    h_gen, info = ReferenceSolver().solve(generic)
    dense = _unrolled_energy(model, gamma)
    h_ref, _ = ReferenceSolver().solve(dense.problem(x, y if clamped else None))
    assert info.residual < 1e-9
    for a, b in zip(h_gen, h_ref):
        torch.testing.assert_close(a.reshape(a.shape[0], -1), b, rtol=0, atol=1e-8)
    torch.testing.assert_close(generic.value(h_gen), dense.problem(x, y if clamped else None).value(h_ref),
                               rtol=1e-10, atol=1e-12)


def test_conv_weight_gradients_match_finite_differences_of_the_minimum():
    """Envelope theorem on a conv net: ∇_θ min_z Ê (as the engine accumulates it) equals central finite
    differences of the minimum value, re-solved to machine precision for each perturbation."""
    model = conv_net(seed=1)
    x, labels = _data(n=5, d=16, seed=5)
    y = torch.nn.functional.one_hot(labels, 3).to(DT)

    def min_energy():
        p = LayeredProblem(LayeredEnergy.lifted(read_graph(model), 0.5), x, target=y)
        h, _ = ReferenceSolver().solve(p)
        return p, h, float(p.value(h, fresh_a1=False).sum().detach())

    p, h, _ = min_energy()
    model.zero_grad(set_to_none=True)
    p.accumulate_weight_grads(h, 1.0)
    eps = 1e-6
    for param in [model[1].weight, model[4].weight, model[4].bias, model[7].weight]:
        for idx in [(0,) * param.dim(), tuple(s - 1 for s in param.shape)]:
            with torch.no_grad():
                param[idx] += eps
            up = min_energy()[2]
            with torch.no_grad():
                param[idx] -= 2 * eps
            down = min_energy()[2]
            with torch.no_grad():
                param[idx] += eps
            fd = (up - down) / (2 * eps)
            assert abs(float(param.grad[idx]) - fd) < 1e-6 * (1 + abs(fd)), (idx, float(param.grad[idx]), fd)


def test_fenchel_bp_aligns_with_backprop_on_a_random_conv_net():
    """Fenchel BP's per-layer cosine with back-propagation's gradient is ≥ 0.99 at small β on a conv net
    (the finite difference (f(a) − f(a − βg))/β is f'(a)g away from the kinks)."""
    from inferlearn.diagnostics import gradient_alignment
    from inferlearn.models import conv_net as build

    model = build((1, 8, 8), [4, 6], [16], 10, seed=0)
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)
    rows = gradient_alignment(make_rule("fenchel-bp", {"beta": 0.01}), model, x, labels)
    assert min(r["cosine"] for r in rows) > 0.99, rows


@pytest.mark.parametrize("name,floor", [("eqprop", 0.9), ("contrastive", 0.8)])
def test_contrastive_rules_align_with_backprop_on_a_random_conv_net_in_float32(name, floor):
    """At default options in float32, EqProp's and contrastive learning's per-layer gradients on a conv
    net align with back-propagation's as on the MLP. Guards against losing the small difference of the
    two phases' gradients to float32 rounding in the sums over pixels (conv-layer cosine ≈ 0 before the
    envelope gradient was evaluated in float64)."""
    from inferlearn.diagnostics import gradient_alignment
    from inferlearn.models import conv_net as build

    model = build((1, 16, 16), [4, 8], [32], 10, seed=0)
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    rows = gradient_alignment(make_rule(name), model, x, labels)
    assert min(r["cosine"] for r in rows) > floor, [round(r["cosine"], 3) for r in rows]
