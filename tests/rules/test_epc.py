"""Oracles of error-optimised predictive coding (ePC, ``--rule epc``).

* On a residual conv net, the rule's ``.grad`` equals a few-line autograd ePC written from the model's own modules
  (errors injected into its forward, the state energy at the final errors with the states detached).
* At zero errors, the error-space gradient is back-propagation's delta of the output term at every value node
  (exactly), on a chain and on the residual net.
* Run to convergence, ePC's states equal state-based PC's converged value nodes and its weight gradient PC's at that
  equilibrium (float64, a chain and a residual graph, 1e-8 relative).
* The small-step limit of one iteration: hidden layers get ``η`` times back-propagation's gradient, the output layer
  back-propagation's own, with an ``O(η)`` error; ``K`` small steps scale the hidden layers by ``1 − (1 − η)^K``.
* Bad options are refused in one line.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graph_models import ResidualConvNet
from inferlearn import read_graph
from inferlearn.engine.graph import DIFFERENTIABLE
from inferlearn.engine.problems import ErrorProblem
from inferlearn.engine.problems import LayeredProblem
from inferlearn.rules import make_rule
from inferlearn.rules.predictive_coding import penalty_energy

DT = torch.float64


def _data(n=6, features=16, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, features, generator=g, dtype=DT), torch.randint(0, classes, (n,), generator=g)


def _resnet(seed=0, scale=1.0):
    torch.manual_seed(seed)
    model = ResidualConvNet().to(DT)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def _smooth_resnet(seed=0):
    """The residual conv net with tanh units (state PC's steps settle only on a smooth energy)."""
    model = _resnet(seed)
    model.r0, model.r1, model.r2 = nn.Tanh(), nn.Tanh(), nn.Tanh()
    return model


def _chain(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 3)).to(DT)


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    info = rule.backward(model, x, labels)
    return [p.grad.clone() for p in model.parameters()], info


def _resnet_nodes(model, x, errors=None):
    """The residual net's value nodes h, u, g with errors added (the prediction of each from the nodes before)."""
    e = errors or [0.0, 0.0, 0.0]
    h = model.r0(model.stem(x.view(x.size(0), 1, 4, 4))) + e[0]
    u = model.r1(model.c1(h)) + e[1]
    g = model.r2(model.c2(u) + h) + e[2]
    return h, u, g


def _few_line_epc(model, x, y, steps, eta, output="se"):
    """ePC written from the model: errors e_h, e_u, e_g; E(e) = ½‖e‖² + ℓ(fc(pool(g(e)))); the weight gradient of the
    state energy at the final errors, the states detached."""
    loss = ((lambda o: 0.5 * (o - y).pow(2).sum()) if output == "se"
            else (lambda o: -(y * torch.log_softmax(o, 1)).sum()))
    head = lambda g: model.fc(model.pool(g).flatten(1))   # noqa: E731
    with torch.no_grad():
        shapes = [v.shape for v in _resnet_nodes(model, x)]
    es = [torch.zeros(s, dtype=DT, requires_grad=True) for s in shapes]
    for _ in range(steps):
        energy = 0.5 * sum(e.pow(2).sum() for e in es) + loss(head(_resnet_nodes(model, x, es)[2]))
        grads = torch.autograd.grad(energy, es)
        with torch.no_grad():
            for e, g in zip(es, grads):
                e -= eta * g
    with torch.no_grad():
        h, u, g = _resnet_nodes(model, x, es)
    r = lambda v: v.view(v.size(0), 1, 4, 4)   # noqa: E731
    state = (0.5 * (h - model.r0(model.stem(r(x)))).pow(2).sum() + 0.5 * (u - model.r1(model.c1(h))).pow(2).sum()
             + 0.5 * (g - model.r2(model.c2(u) + h)).pow(2).sum() + loss(head(g)))
    model.zero_grad(set_to_none=True)
    (state / x.shape[0]).backward()
    return [p.grad.clone() for p in model.parameters()], [h, u, g]


@pytest.mark.parametrize("output", ["se", "ce"])
def test_epc_on_a_residual_conv_net_equals_few_line_autograd_epc(output):
    """Guards a wrong injection of the errors (a dropped skip, an error added before the unit), a wrong output
    term's derivative, and a weight gradient read through the states (back-propagation) instead of locally."""
    model = _resnet(seed=4, scale=1.5)
    x, labels = _data(n=7, seed=6)
    y = F.one_hot(labels, 3).to(DT)
    ref, ref_states = _few_line_epc(model, x, y, steps=6, eta=0.1, output=output)
    mine, info = _grads(make_rule("epc", {"steps": 6, "step_size": 0.1, "output": output}), model, x, labels)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(info.extras["hidden"], ref_states, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _error_problem(model, x, labels, output="se", weight=1.0):
    chain = read_graph(model, DIFFERENTIABLE, "epc", example=x)
    free = LayeredProblem(penalty_energy(chain, weight, output), x)
    n_out = free.forward_state()[1][chain.depth].shape[1]
    return ErrorProblem(free.stacked(1, target=F.one_hot(labels, n_out).to(x.dtype)))


@pytest.mark.parametrize("output", ["se", "ce"])
@pytest.mark.parametrize("kind", ["chain", "residual"])
def test_error_gradient_at_zero_errors_is_backpropagations_delta(kind, output):
    """The point of ePC: at e = 0 (the forward pass) ∂E/∂e_k is exactly back-propagation's gradient of the output
    term with respect to node k's activation, for every node at once (state PC's first step sees only the top)."""
    model = _chain(1) if kind == "chain" else _resnet(seed=2, scale=1.5)
    x, labels = _data(n=5, seed=3)
    y = F.one_hot(labels, 3).to(DT)
    pi = 0.7
    problem = _error_problem(model, x, labels, output, pi)
    zero = problem.forward_state()[0]
    mine = problem.gradients(zero)
    with torch.enable_grad():
        if kind == "chain":
            h1 = model[1](model[0](x))
            h2 = model[3](model[2](h1))
            nodes, out = [h1, h2], model[4](h2)
        else:
            nodes = list(_resnet_nodes(model, x))
            out = model.fc(model.pool(nodes[2]).flatten(1))
        loss = 0.5 * (out - y).pow(2).sum() if output == "se" else -(y * torch.log_softmax(out, 1)).sum()
        deltas = torch.autograd.grad(pi * loss, nodes)
    assert len(mine) == len(deltas)
    for a, b in zip(mine, deltas):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["chain", "residual"])
def test_converged_epc_is_state_pcs_equilibrium(kind):
    """Guards the claim that only the coordinates change: run to convergence, the states of ePC are the value nodes of
    state-based PC's equilibrium and the weight gradients are equal (float64, 1e-8 relative)."""
    model = _chain(3) if kind == "chain" else _smooth_resnet(seed=5)
    x, labels = _data(n=6, seed=7)
    pc = make_rule("pc", {"steps": 40000, "step_size": 0.2, "tol": 1e-14, "engine": "generic"})
    epc = make_rule("epc", {"steps": 40000, "step_size": 0.2, "tol": 1e-14})
    g_pc, i_pc = _grads(pc, model, x, labels)
    g_epc, i_epc = _grads(epc, model, x, labels)
    assert i_pc.extras["converged"] and i_epc.extras["converged"]
    for a, b in zip(i_epc.extras["hidden"], i_pc.extras["hidden"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    for a, b in zip(g_epc, g_pc, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    assert i_epc.extras["inference_steps"] < i_pc.extras["inference_steps"]


def _split(model, grads):
    """(hidden layers' gradients, output layer's gradients): the readout is the last Linear."""
    names = [n for n, _ in model.named_parameters()]
    top = [i for i, n in enumerate(names) if n.startswith(("4.", "fc."))]
    return [g for i, g in enumerate(grads) if i not in top], [grads[i] for i in top]


def _rel(a, b):
    return max(float((x - y).norm() / y.norm()) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["chain", "residual"])
def test_small_step_limit_is_backprop_scaled_by_eta_on_the_hidden_layers(kind):
    """One iteration of step η from zero errors: e_k = −η δ_k, so a hidden layer's ePC gradient is η times
    back-propagation's and the output layer's is back-propagation's, up to O(η); K steps scale the hidden layers
    by c_K = 1 − (1 − η)^K. Guards the regime the docs state ("BP = ePC / η")."""
    model = _chain(2) if kind == "chain" else _resnet(seed=1, scale=1.5)
    x, labels = _data(n=6, seed=4)
    bp, _ = _grads(make_rule("backprop"), model, x, labels)
    bp_hidden, bp_top = _split(model, bp)
    errs = []
    for eta in (1e-3, 1e-4):
        g, _ = _grads(make_rule("epc", {"steps": 1, "step_size": eta}), model, x, labels)
        hidden, top = _split(model, g)
        errs.append((_rel([h / eta for h in hidden], bp_hidden), _rel(top, bp_top)))
    (h3, t3), (h4, t4) = errs
    assert h4 < 1e-3 and t4 < 1e-3
    assert 5 < h3 / h4 < 20 and 5 < t3 / t4 < 20   # first order in η
    eta, K = 1e-4, 5
    g, _ = _grads(make_rule("epc", {"steps": K, "step_size": eta}), model, x, labels)
    hidden, _ = _split(model, g)
    c = 1 - (1 - eta) ** K
    assert _rel([h / c for h in hidden], bp_hidden) < 1e-3


@pytest.mark.parametrize("opts, match", [
    ({"inference_optimizer": "lbfgs"}, "Invalid inference_optimizer"),
    ({"step_size": 0.0}, "Invalid step_size"),
    ({"step_size": -0.1}, "Invalid step_size"),
    ({"step_size": 2.5}, "Invalid step_size"),
    ({"steps": 0}, "Invalid steps: 0"),
    ({"steps": -3}, "Invalid steps"),
    ({"weight_step": 0.01}, "Invalid weight_step"),
    ({"engine": "fused"}, "Invalid engine"),
    ({"output": "mse"}, "Invalid output"),
    ({"nudging": "sideways"}, "Invalid nudging"),
])
def test_bad_epc_options_are_refused_in_one_line(opts, match):
    with pytest.raises(ValueError, match=match) as exc:
        make_rule("epc", opts)
    assert "\n" not in str(exc.value)


def test_epc_reaches_the_bottom_of_a_deep_residual_mlp_in_float32():
    """The depth failure ePC fixes: on a 64-layer μPC residual MLP in float32, state PC at T = H + 1 leaves the input
    projection without any gradient, while 5 ePC iterations give every weight layer one that points where
    back-propagation's does."""
    from inferlearn.models.build import build_model

    model = build_model("resmlp:depth=64,width=32,param=mupc", "relu", 784, 10, (1, 28, 28))
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
    bp, _ = _grads(make_rule("backprop"), model, x, labels)
    pc, _ = _grads(make_rule("pc", {"steps": 65, "step_size": 0.2}), model, x, labels)
    epc, _ = _grads(make_rule("epc", {"steps": 5, "step_size": 0.01}), model, x, labels)   # the small-step regime
    assert float(pc[0].abs().max()) == 0.0   # state PC: nothing reaches the input projection
    for a, b in zip(epc, bp):
        cos = float((a * b).sum() / (a.norm() * b.norm()))
        assert cos > 0.9


def test_overshooting_error_steps_warn_once_with_the_fix():
    """Where η times the error energy's curvature passes 2 (large weights), the plain steps grow instead of shrinking:
    one ConvergenceWarning per run says they overshoot and to lower step_size (PC's text, "raise steps", would be
    the wrong fix)."""
    import warnings

    from inferlearn.errors import ConvergenceWarning

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 30), nn.ReLU(), nn.Linear(30, 5))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(15.0)
    x, labels = torch.randn(16, 20), torch.randint(0, 5, (16,))
    rule = make_rule("epc", {"step_size": 1e-3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = rule.backward(model, x, labels)
        rule.backward(model, x, labels)
    msgs = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert info.extras["far"] and len(msgs) == 1
    assert "overshoot" in msgs[0] and "lower step_size (now 0.001)" in msgs[0]


@pytest.mark.parametrize("kind", ["chain", "residual"])
def test_rescaled_small_steps_are_backprop_at_every_layer(kind):
    """``rescale=True`` divides the hidden nodes' terms by c_K = 1 − (1 − η)^K: at a small step the whole update is
    back-propagation's (float64 autograd), hidden and output layers alike, to O(η); without it the hidden layers
    are c_K times smaller."""
    model = _chain(2) if kind == "chain" else _resnet(seed=1, scale=1.5)
    x, labels = _data(n=6, seed=4)
    bp, _ = _grads(make_rule("backprop"), model, x, labels)
    g, _ = _grads(make_rule("epc", {"steps": 5, "step_size": 1e-5, "rescale": True}), model, x, labels)
    assert _rel(g, bp) < 1e-3
    plain, _ = _grads(make_rule("epc", {"steps": 5, "step_size": 1e-5}), model, x, labels)
    assert _rel(plain, bp) > 0.5   # the option changes what it claims to change


@pytest.mark.parametrize("opts, match", [
    ({"rescale": "maybe"}, "Invalid value .maybe. for option .rescale."),
    ({"rescale": True, "inference_optimizer": "adam"}, "Invalid rescale with inference_optimizer"),
    ({"rescale": True, "nudging": "symmetric"}, "Invalid rescale with nudging"),
])
def test_bad_rescale_options_are_refused_in_one_line(opts, match):
    with pytest.raises(ValueError, match=match) as exc:
        make_rule("epc", opts)
    assert "\n" not in str(exc.value)
