"""Oracles of the graph engine: models with skip connections and branches, read by torch.fx.

* Reading: the traced graph computes the model's own forward; its nodes and edges are the expected
  ones; what cannot be read is refused in one line naming the node.
* On chains, the general graph paths (sums over a node's children, per-edge step bounds, autograd weight
  gradients) equal today's chain and fused paths to 1e-10 in float64, for every energy rule.
* A residual conv net's lifted minimiser (free and clamped) equals the minimiser of the unrolled energy
  found by an independent solver (scipy's bounded least squares, BVLS) on the Jacobians of its maps.
* Weight gradients of a residual net equal central differences of the re-solved minimum energy.
* Predictive coding on a graph equals a few-line autograd predictive coding written from the model.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import lsq_linear
from torch import nn

from inferlearn import NodeSpec, read_graph
from inferlearn.engine.problems import LayeredEnergy, LayeredProblem
from inferlearn.engine.solvers import ReferenceSolver
from inferlearn.models import MLP
from inferlearn.rules import make_rule
from inferlearn.units import Clamp

DT = torch.float64
TIGHT = {"tol": 1e-12, "max_iter": 20000, "on_fail": "raise"}


class ResConv(nn.Module):
    """conv → relu → conv → relu → relu(conv + skip) → avgpool → linear: one residual block."""

    def __init__(self, seed=0, scale=1.0):
        super().__init__()
        torch.manual_seed(seed)
        self.c0, self.r0 = nn.Conv2d(1, 2, 3, padding=1), nn.ReLU()
        self.c1, self.r1 = nn.Conv2d(2, 2, 3, padding=1), Clamp("hard-sigmoid")
        self.c2, self.r2 = nn.Conv2d(2, 2, 3, padding=1), nn.ReLU()
        self.pool, self.fc = nn.AvgPool2d(2), nn.Linear(8, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.mul_(scale)

    def forward(self, x):
        h = self.r0(self.c0(x.view(x.size(0), 1, 4, 4)))
        u = self.r1(self.c1(h))
        h = self.r2(self.c2(u) + h)
        return self.fc(self.pool(h).flatten(1))


class Branches(nn.Module):
    """Two branches concatenated (functional activations), then a scaled skip from the input."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 5), nn.Linear(16, 3)
        self.mix, self.skip, self.out = nn.Linear(8, 4), nn.Linear(16, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.cat([F.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
        g = F.hardtanh(self.mix(h) + 0.5 * self.skip(x))
        return self.out(g)


class ResidualMLP(nn.Module):
    """A residual stream h ← h + s·W relu(h): the sums feed two operations, so they become value nodes."""

    def __init__(self, depth=3, width=6, s=0.5):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.acts = nn.ModuleList(nn.ReLU() for _ in range(depth + 1))
        self.out, self.s = nn.Linear(width, 3), s

    def forward(self, x):
        h = self.inp(x)
        for lin, act in zip(self.blocks, self.acts):
            h = h + self.s * lin(act(h))
        return self.out(self.acts[-1](h))


def _data(n=6, d=16, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=DT), torch.randint(0, classes, (n,), generator=g)


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return [p.grad.clone() for p in model.parameters()]


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize("make", [ResConv, Branches, ResidualMLP])
def test_traced_graph_computes_the_models_forward(make):
    """Guards against a mis-read edge (a lost skip, a wrong concatenation slot or scaling)."""
    model = make().to(DT)
    x, _ = _data()
    chain = read_graph(model, example=x)
    assert not chain.is_chain
    torch.testing.assert_close(chain.forward_all(x)[0][-1], model(x), rtol=0, atol=1e-14)


def test_graph_structure_of_a_residual_block_and_a_residual_stream():
    """Node k's pre-activation is the sum of its edges: the block's output reads the branch and the skip;
    a residual stream used twice becomes a linear value node (levels: longest paths)."""
    chain = read_graph(ResConv())
    assert [link.sources for link in chain.nodes] == [(0,), (1,), (2, 1), (3,)]
    assert chain.levels == (0, 1, 2, 3, 4)
    assert [len(e.maps) for e in chain.nodes[2].edges] == [1, 0]   # conv branch, identity skip
    res = read_graph(ResidualMLP(depth=2))
    # relu(inp x); the stream h1 = inp x + s W relu(·) feeds two operations: a node with a linear unit;
    # relu(h1); the last sum h2 feeds only the final relu, whose node reads h1 and the branch directly
    assert [type(link.activation).__name__ for link in res.nodes] == ["ReLU", "Identity", "ReLU", "ReLU", "NoneType"]
    assert [link.sources for link in res.nodes] == [(0,), (0, 1), (2,), (2, 3), (4,)]


def test_protocol_graph_equals_traced_graph():
    """The graph protocol (inferlearn_graph) gives the same nodes, forward and gradients as tracing."""
    class Declared(ResConv):
        def forward(self, x):   # not traceable: data-dependent control flow
            if float(x.sum()) > 1e9:
                return x
            return super().forward(x)

        def inferlearn_graph(self):
            return [NodeSpec([(0, [nn.Unflatten(1, (1, 4, 4)), self.c0])], self.r0), NodeSpec([(1, self.c1)], self.r1),
                    NodeSpec([(2, self.c2), (1, ())], self.r2), NodeSpec([(3, [self.pool, nn.Flatten(), self.fc])])]

    traced, declared = ResConv(seed=2).to(DT), Declared(seed=2).to(DT)
    x, labels = _data(seed=1)
    assert [l.sources for l in read_graph(declared).nodes] == [l.sources for l in read_graph(traced).nodes]
    for name in ["contrastive", "pc"]:
        for a, b in zip(_grads(make_rule(name), traced, x, labels), _grads(make_rule(name), declared, x, labels)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


class _Dynamic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


class _RawWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 3))

    def forward(self, x):
        return x @ self.w


class _Dead(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.r = nn.Linear(16, 3), nn.Linear(16, 3), nn.ReLU()

    def forward(self, x):
        self.r(self.b(x))
        return self.a(x)


@pytest.mark.parametrize("model,match", [
    (_Dynamic(), r"Cannot read _Dynamic as a graph: torch.fx cannot trace its forward .*inferlearn_graph"),
    (_RawWeight(), r"node 'w' .*uses a tensor attribute"),
    (_Dead(), r"value after 'b' \(node 1\) is not used"),
])
def test_unreadable_models_are_refused_in_one_line_naming_the_node(model, match):
    with pytest.raises(ValueError, match=match) as err:
        make_rule("pc").backward(model, torch.rand(4, 16), torch.tensor([0, 1, 2, 0]))
    assert "\n" not in str(err.value)


def test_backprop_takes_an_untraceable_model():
    model = _Dynamic()
    make_rule("backprop").backward(model, torch.rand(4, 16), torch.tensor([0, 1, 2, 0]))
    assert model.fc.weight.grad is not None


# ---------------------------------------------------------------- chains: graph paths = chain paths


def _general(model, x):
    """Read ``model`` and force the general graph paths on its chain (no chain or dense specialisations)."""
    chain = read_graph(model, example=x)
    chain.__dict__["is_chain"] = False
    chain.__dict__["is_dense"] = False
    return chain


RULE_OPTS = [("contrastive", {"gamma": 0.25} | TIGHT), ("lifted-j0", {"gamma": 0.5} | TIGHT),
             ("eqprop", {"nudging": "symmetric"} | TIGHT), ("eqprop", {"nudging": "positive", "beta": 0.3} | TIGHT),
             ("lifted-fenchel", {"steps": 200}), ("lpom", {"sweeps": 6, "mu": 2.0}),
             ("pc", {"steps": 20, "step_size": 0.2}), ("mac", {})]


@pytest.mark.parametrize("model_name", ["mlp", "conv"])
@pytest.mark.parametrize("name,opts", RULE_OPTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(RULE_OPTS)])
def test_graph_paths_equal_chain_paths_on_chains_in_float64(name, opts, model_name):
    """Guards against the graph generalisation changing what chains compute (a dropped child, a wrong
    per-edge ratio or step bound)."""
    def build():
        if model_name == "mlp":
            return MLP("16-6-5-3", "hard-sigmoid", seed=1, dtype=DT, init_scale=1.5)
        torch.manual_seed(0)
        return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                             nn.Conv2d(2, 3, 2), Clamp("hard-sigmoid"), nn.Flatten(), nn.Linear(3, 3)).to(DT)
    x, labels = _data(n=8)
    reference = _grads(make_rule(name, opts), build(), x, labels)
    general_model = build()
    _general(general_model, x)
    general = _grads(make_rule(name, opts | ({"engine": "generic"} if "engine" in _fields(name) else {})),
                     general_model, x, labels)
    for r, g in zip(reference, general):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def _fields(name):
    import dataclasses
    from inferlearn.rules import RULES
    return {f.name for f in dataclasses.fields(RULES[name])}


# ---------------------------------------------------------------- residual nets: independent oracles


def _unrolled(chain, x_row_shape):
    """Per edge: its Jacobian matrix and offset (the map is affine), from the chain's own forward shapes."""
    zs, _ = chain.forward_all(torch.zeros(1, *x_row_shape, dtype=DT))
    shapes = [tuple(z.shape[1:]) for z in zs]
    mats = []
    for link in chain.nodes:
        row = []
        for e in link.edges:
            shape = shapes[e.source]
            n = int(np.prod(shape))
            zero = torch.zeros(n, dtype=DT)
            J = torch.autograd.functional.jacobian(lambda v, e=e, shape=shape: e.map(v.reshape(1, *shape)).reshape(-1),
                                                   zero)
            with torch.no_grad():
                off = e.map(zero.reshape(1, *shape)).reshape(-1)
            row.append((e.source, J.detach().numpy(), off.numpy()))
        mats.append(row)
    return mats, [int(np.prod(s)) for s in shapes]


def _bvls_minimiser(model, x, y, gamma):
    """``min ½ Σ_k w_k ‖z_k − Σ_e (W_e z_s + o_e)‖²`` over boxes, per row, by scipy's BVLS (an active-set
    bounded least-squares solver), on the unrolled network."""
    chain = read_graph(model)
    mats, sizes = _unrolled(chain, x.shape[1:])
    L = chain.depth
    w = [gamma ** (chain.levels[k] - 1) for k in range(L + 1)]
    offs = np.cumsum([0] + sizes[1:L])
    n = int(offs[-1])
    lo = np.concatenate([np.full(sizes[k], chain.nodes[k - 1].units.lower) for k in range(1, L)])
    hi = np.concatenate([np.full(sizes[k], chain.nodes[k - 1].units.upper) for k in range(1, L)])
    out = []
    for i in range(x.shape[0]):
        xi = x[i].reshape(-1).numpy()
        rows, rhs = [], []
        for k in range(1, L + 1):
            if k == L and y is None:
                continue   # a free output is eliminated: its term is zero
            A = np.zeros((sizes[k], n))
            d = np.zeros(sizes[k])
            if k < L:
                A[:, offs[k - 1]:offs[k]] = np.eye(sizes[k])
            else:
                d -= y[i].numpy()
            for s, J, o in mats[k - 1]:
                d += o
                if s == 0:
                    d += J @ xi
                else:
                    A[:, offs[s - 1]:offs[s]] -= J
            rows.append(np.sqrt(w[k]) * A)
            rhs.append(np.sqrt(w[k]) * d)
        res = lsq_linear(np.vstack(rows), np.concatenate(rhs), bounds=(lo, hi), method="bvls", tol=1e-14)
        out.append(res.x)
    return np.array(out), offs


@pytest.mark.parametrize("clamped", [False, True])
def test_residual_conv_lifted_minimiser_matches_bounded_least_squares(clamped):
    """Guards against a wrong sum of edges, adjoint of a skip, term weight or step bound on a graph: the
    engine's solve of a residual conv net's lifted energy is the minimiser BVLS finds for the unrolled net."""
    model = ResConv(seed=3, scale=2.0).to(DT)
    x, labels = _data(n=4, seed=4)
    y = F.one_hot(labels, 3).to(DT)
    gamma = 0.5
    problem = LayeredProblem(LayeredEnergy.lifted(read_graph(model), gamma), x, target=y if clamped else None)
    hidden, info = ReferenceSolver().solve(problem)
    assert info.residual < 1e-9
    ref, offs = _bvls_minimiser(model, x, y if clamped else None, gamma)
    mine = torch.cat([h.reshape(h.shape[0], -1) for h in hidden], 1).numpy()
    np.testing.assert_allclose(mine, ref, rtol=0, atol=1e-8)
    at_bound = sum(int(((h == u.lower) | (h == u.upper)).sum()) for u, h in
                   zip([l.units for l in read_graph(model).nodes], hidden))
    assert at_bound > 10   # the boxes are active: not the unconstrained linear solve


def test_residual_weight_gradients_match_finite_differences_of_the_minimum():
    """Envelope theorem on a residual net: the accumulated ∇_θ min_z E equals central differences of the
    minimum, re-solved to machine precision for each perturbation."""
    model = ResConv(seed=1, scale=1.5).to(DT)
    x, labels = _data(n=5, seed=5)
    y = F.one_hot(labels, 3).to(DT)

    def min_energy():
        p = LayeredProblem(LayeredEnergy.lifted(read_graph(model), 0.5), x, target=y)
        h, _ = ReferenceSolver().solve(p)
        return p, h, float(p.value(h, fresh_a1=False).sum().detach())

    p, h, _ = min_energy()
    model.zero_grad(set_to_none=True)
    p.accumulate_weight_grads(h, 1.0)
    eps = 1e-6
    for param in [model.c0.weight, model.c1.bias, model.c2.weight, model.fc.weight]:
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


def _few_line_pc(model, x, y, steps, eta):
    """Predictive coding written from the model's own modules: value nodes h (after relu), u, g; the
    residual block's prediction is relu(c2(u) + h)."""
    r = lambda v: v.view(v.size(0), 1, 4, 4)   # noqa: E731
    with torch.no_grad():
        h = model.r0(model.c0(r(x)))
        u = model.r1(model.c1(h))
        g = model.r2(model.c2(u) + h)
    zs = [v.clone().requires_grad_(True) for v in (h, u, g)]

    def energy(zs, params=False):
        h, u, g = zs
        e = 0.5 * (h - model.r0(model.c0(r(x)))).pow(2).sum()
        e = e + 0.5 * (u - model.r1(model.c1(h))).pow(2).sum()
        e = e + 0.5 * (g - model.r2(model.c2(u) + h)).pow(2).sum()
        return e + 0.5 * (y - model.fc(model.pool(g).flatten(1))).pow(2).sum()

    for _ in range(steps):
        grads = torch.autograd.grad(energy(zs), zs)
        with torch.no_grad():
            for z, gz in zip(zs, grads):
                z -= eta * gz
    model.zero_grad(set_to_none=True)
    (energy([z.detach() for z in zs]) / x.shape[0]).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_pc_on_a_graph_equals_few_line_autograd_pc():
    """Guards against a wrong sum of predictions, a dropped skip in the energy's gradient or a wrong
    envelope gradient of predictive coding on a residual net."""
    model = ResConv(seed=4, scale=1.5).to(DT)
    x, labels = _data(n=7, seed=6)
    y = F.one_hot(labels, 3).to(DT)
    ref = _few_line_pc(model, x, y, steps=12, eta=0.1)
    mine = _grads(make_rule("pc", {"steps": 12, "step_size": 0.1}), model, x, labels)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


class PooledResConv(ResConv):
    """ResConv with max pooling before the head: a map that is not affine, so predictive coding's value-node
    gradients take the vector–Jacobian-product path instead of the closed form."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.pool = nn.MaxPool2d(2)


def _energy_autograd(problem, hidden):
    with torch.enable_grad():
        hs = [h.detach().requires_grad_(True) for h in hidden]
        return list(torch.autograd.grad(problem.value(hs, fresh_a1=False).sum(), hs))


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize("case", ["se", "ce", "nudged-se", "nudged-ce"])
def test_pc_value_node_gradients_equal_autograd_of_the_energy(case, layout):
    """Guards the hand-written backward of the squared terms (a dropped own term ``w_k ε_k``, a wrong sign or
    weight of a child's error, a wrong cross-entropy or nudge gradient): it must equal autograd of the energy's
    value, on a residual net with max pooling, in either memory layout."""
    from inferlearn.engine.problems import NudgedOutputProblem
    from inferlearn.models.build import channels_last
    from inferlearn.engine.graph import DIFFERENTIABLE
    from inferlearn.rules.predictive_coding import penalty_energy

    model = PooledResConv(seed=3).to(DT)
    if layout == "channels-last":
        channels_last(model)
        assert model.c0.weight.is_contiguous(memory_format=torch.channels_last)
    x, labels = _data(n=5, seed=2)
    g = torch.Generator().manual_seed(1)
    y = 1.5 * torch.softmax(torch.randn(5, 3, generator=g, dtype=DT), 1)   # not summing to 1: the CE factor Σ_j y_j shows
    chain = read_graph(model, DIFFERENTIABLE, "pc", example=x)
    if case.startswith("nudged"):
        signs = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0], dtype=DT)
        problem = NudgedOutputProblem(penalty_energy(chain, 0.7, "se"), x, y, signs, 0.3, case[-2:])
    else:
        problem = LayeredProblem(penalty_energy(chain, 0.7, case), x, y)
    assert not problem._closed_form() and problem._vjp_form()
    hidden = [z + 0.3 * torch.randn(z.shape, generator=g, dtype=DT) for z in problem.forward_state()[0]]
    for mine, ref in zip(problem.gradients(hidden), _energy_autograd(problem, hidden), strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-13)


def test_zoo_conv_models_are_channels_last_and_mlps_untouched():
    from inferlearn.models import build_model

    vgg = build_model("vgg5:width=0.125", "relu", 3072, 10, (3, 32, 32))
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in vgg.parameters() if p.dim() == 4)
    assert vgg(torch.rand(2, 3072)).shape == (2, 10)
    mlp = build_model("784-8-10", "relu", 784, 10, (1, 28, 28))
    assert all(p.is_contiguous() for p in mlp.parameters())


@pytest.mark.parametrize("name", ["contrastive", "eqprop"])
def test_contrastive_rules_on_a_residual_net_approach_backprop_at_small_gamma(name):
    """As on chains, the two-phase rules on a residual net approximate back-propagation's gradient as the
    feedback weight γ (and EqProp's β) shrink: every edge carries a ratio ≤ γ."""
    model = ResConv(seed=5, scale=1.5).to(DT)
    x, labels = _data(n=8, seed=7)
    bp = torch.cat([g.reshape(-1) for g in _grads(make_rule("backprop"), model, x, labels)])
    opts = {"gamma": 1 / 64} | TIGHT | ({"beta": 1e-3} if name == "eqprop" else {})
    mine = torch.cat([g.reshape(-1) for g in _grads(make_rule(name, opts), model, x, labels)])
    assert float((mine - bp).norm() / bp.norm()) < 0.1


def test_fenchel_bp_on_functional_activations_approaches_backprop():
    """Activations called as functions (F.relu, F.hardtanh) cannot be converted as modules: Fenchel BP runs
    through the traced graph instead, and its gradient tends to back-propagation's as β → 0."""
    torch.manual_seed(0)
    model = Branches().to(DT)
    x, labels = _data(n=8, seed=8)
    bp = torch.cat([g.reshape(-1) for g in _grads(make_rule("backprop"), model, x, labels)])
    errors = []
    for beta in (10.0, 1e-6):   # a large β crosses the kinks: not back-propagation
        fb = torch.cat([g.reshape(-1) for g in _grads(make_rule("fenchel-bp", {"beta": beta}), model, x, labels)])
        errors.append(float((fb - bp).norm() / bp.norm()))
    assert errors[1] < 1e-6 < errors[0], errors
