"""PCX's recipes as predictive-coding options (Pinchetti et al. 2024), against few-line autograd references (float64).

* ``output="ce"``: the output energy ``π CE(y, softmax(a_L))`` (output error ``y − softmax(a_L)``), on the fused
  dense loop and on the generic engine (closed form and autograd), equal to plain gradient steps on the autograd
  energy;
* ``inference_optimizer="momentum" | "adam"``: ``torch.optim.SGD(momentum)`` / ``torch.optim.Adam`` on the value
  nodes as leaf tensors of the autograd energy; the convergence check reports ``η max|∂F/∂z|`` at the last step's
  start;
* ``nudging``: a free output value node with ``±βℓ(z_L)``, equal to the same steps on the autograd energy, and at
  equilibrium back-propagation's gradient as β → 0 (O(β) one-sided, O(β²) centred);
* ``weight_step`` (iPC): one SGD step on the rule's gradient equals a hand-written iPC loop.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferlearn.errors import ConvergenceWarning
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.rules import make_rule

DT = torch.float64


def _net(act=nn.ReLU):
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(6, 7), act(), nn.Linear(7, 5), nn.Hardtanh(), nn.Linear(5, 3)).to(DT)
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.mul_(1.5)
    return net


def _batch(b=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, 6, generator=g, dtype=DT), torch.randint(0, 3, (b,), generator=g)


def reference_pc(net, x, y, steps, eta, pi=1.0, output="se", optimizer="sgd", mu=0.9):
    """PC by autograd: value nodes as leaves, ``steps`` updates of a torch optimiser on ``F`` (summed over the
    batch), then ``∇_θ F / (Bπ)``. Returns the gradients and ``η max|∂F/∂z|`` at the last update's start."""
    lins, acts = [m for m in net if isinstance(m, nn.Linear)], [m for m in net if not isinstance(m, nn.Linear)]
    with torch.no_grad():
        zs = [x]
        for lin, act in zip(lins[:-1], acts):
            zs.append(act(lin(zs[-1])))
    hidden = [z.clone().requires_grad_(True) for z in zs[1:]]

    def energy():
        zs = [x, *hidden]
        e = sum(0.5 * (zs[k + 1] - act(lin(zs[k]))).pow(2).sum() for k, (lin, act) in enumerate(zip(lins, acts)))
        a = lins[-1](zs[-1])
        top = 0.5 * (y - a).pow(2).sum() if output == "se" else -(y * F.log_softmax(a, dim=1)).sum()
        return e + pi * top

    opt = {"sgd": lambda: torch.optim.SGD(hidden, lr=eta),
           "momentum": lambda: torch.optim.SGD(hidden, lr=eta, momentum=mu),
           "adam": lambda: torch.optim.Adam(hidden, lr=eta, betas=(mu, 0.999))}[optimizer]()
    residual = None
    for _ in range(steps):
        grads = torch.autograd.grad(energy(), hidden)
        residual = eta * max(float(g.abs().max()) for g in grads)
        for h, g in zip(hidden, grads):
            h.grad = g
        opt.step()
    net.zero_grad()
    (energy() / (x.shape[0] * pi)).backward()
    return [p.grad.clone() for p in net.parameters()], residual


def _rule_grads(rule, net, x, labels):
    net.zero_grad(set_to_none=True)
    info = rule.backward(net, x, labels)
    return [p.grad.clone() for p in net.parameters()], info


def _close(got, ref, tol=1e-10):
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("engine", ["fused", "generic"])
@pytest.mark.parametrize("pi", [1.0, 0.5])
def test_cross_entropy_output_energy_equals_autograd_pc(engine, pi):
    """Guards against the squared-error output term, a missing softmax or π in the error sent down, or a fused
    loop and a generic engine that disagree."""
    net, (x, labels) = _net(), _batch()
    y = one_hot(labels, 3, DT)
    ref, _ = reference_pc(net, x, y, 12, 0.2, pi, "ce")
    got, _ = _rule_grads(make_rule("pc", {"steps": 12, "step_size": 0.2, "output_weight": pi, "output": "ce",
                                          "engine": engine}), net, x, labels)
    _close(got, ref)
    se, _ = reference_pc(net, x, y, 12, 0.2, pi, "se")   # the test can fail: the two energies differ
    assert max(float((a - b).abs().max()) for a, b in zip(se, ref)) > 1e-3


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
def test_cross_entropy_output_on_the_autograd_path():
    """A sigmoid unit takes the generic engine's autograd gradients (no closed form)."""
    net, (x, labels) = _net(nn.Sigmoid), _batch()
    ref, _ = reference_pc(net, x, one_hot(labels, 3, DT), 10, 0.2, 1.0, "ce")
    got, _ = _rule_grads(make_rule("pc", {"steps": 10, "step_size": 0.2, "output": "ce"}), net, x, labels)
    _close(got, ref)


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("act", [nn.ReLU, nn.Sigmoid], ids=["closed-form", "autograd"])
@pytest.mark.parametrize("optimizer,output", [("momentum", "se"), ("adam", "se"), ("adam", "ce")])
def test_value_node_optimisers_equal_torch_optim_on_leaf_value_nodes(optimizer, output, act):
    """Guards against a wrong momentum buffer, missing bias corrections or ε, a state carried across batches, and
    a residual that measures the optimiser's step instead of the gradient."""
    net, (x, labels) = _net(act), _batch()
    rule = make_rule("pc", {"steps": 9, "step_size": 0.05, "output": output, "inference_optimizer": optimizer,
                            "inference_momentum": 0.8})
    ref, residual = reference_pc(net, x, one_hot(labels, 3, DT), 9, 0.05, 1.0, output, optimizer, 0.8)
    for _ in range(2):   # a fresh optimiser state on every batch
        got, info = _rule_grads(rule, net, x, labels)
        _close(got, ref)
    assert info.extras["solver_residual"] == pytest.approx(residual, rel=1e-10)
    plain, _ = reference_pc(net, x, one_hot(labels, 3, DT), 9, 0.05, 1.0, output)
    assert max(float((a - b).abs().max()) for a, b in zip(plain, ref)) > 1e-4


def test_momentum_inference_converges_and_says_so():
    """Run long with a tolerance, heavy-ball inference reaches the equilibrium of plain steps (the same convex
    problem for linear units) and reports converged; two steps are far from it (the output error has not reached
    the first layer) and warn."""
    net, (x, labels) = MLP("6-7-5-3", units="linear", seed=2, dtype=DT), _batch()
    long = dict(steps=3000, step_size=0.1, tol=1e-12)
    plain, _ = _rule_grads(make_rule("pc", long), net, x, labels)
    heavy, info = _rule_grads(make_rule("pc", long | {"inference_optimizer": "momentum"}), net, x, labels)
    assert info.extras["converged"] and 5 < info.extras["inference_steps"] < 3000
    _close(heavy, plain, 1e-8)
    with pytest.warns(ConvergenceWarning, match="far from equilibrium after 2 steps"):
        _, short = _rule_grads(make_rule("pc", {"steps": 2, "inference_optimizer": "momentum"}), net, x, labels)
    assert not short.extras["converged"] and short.extras["far"]


@pytest.mark.parametrize("opts,msg", [
    ({"output": "mse"}, "Invalid output: 'mse'"),
    ({"inference_optimizer": "rmsprop"}, "Invalid inference_optimizer: 'rmsprop'"),
    ({"inference_optimizer": "adam", "inference_momentum": 1.0}, "Invalid inference_momentum: 1.0"),
    ({"inference_optimizer": "adam", "engine": "fused"}, "Invalid engine: 'fused'"),
    ({"nudging": "centred"}, "Invalid nudging: 'centred'"),
    ({"nudging": "symmetric", "beta": 0}, "Invalid beta: 0"),
    ({"weight_step": 0}, "Invalid weight_step: 0"),
    ({"weight_step": 0.1, "inference_optimizer": "momentum"}, "Invalid weight_step"),
    ({"weight_step": 0.1, "tol": 1e-6}, "Invalid weight_step"),
])
def test_bad_recipe_options(opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule("pc", opts)


def reference_nudged_pc(net, x, y, steps, eta, beta, nudging, loss="se"):
    """Nudged PC by autograd: the output a free value node at ``a_L``, ``steps`` plain steps on
    ``F + sβℓ(z_L)`` per phase, then ``Σ weight · ∇_θ F / (Bβ)`` (the free phase's ``∇_θ F`` is zero)."""
    lins, acts = [m for m in net if isinstance(m, nn.Linear)], [m for m in net if not isinstance(m, nn.Linear)]
    acts = acts + [nn.Identity()]
    with torch.no_grad():
        zs = [x]
        for lin, act in zip(lins, acts):
            zs.append(act(lin(zs[-1])))

    def energy(z):
        z = [x, *z]
        return sum(0.5 * (z[k + 1] - act(lin(z[k]))).pow(2).sum() for k, (lin, act) in enumerate(zip(lins, acts)))

    def ell(z):
        return 0.5 * (z - y).pow(2).sum() if loss == "se" else -(y * F.log_softmax(z, dim=1)).sum()

    phases = {"positive": ((1, 1.0),), "negative": ((-1, -1.0),), "symmetric": ((1, 0.5), (-1, -0.5))}[nudging]
    out = [torch.zeros_like(p) for p in net.parameters()]
    for s, weight in phases:
        z = [v.clone() for v in zs[1:]]
        for _ in range(steps):
            z = [v.detach().requires_grad_(True) for v in z]
            grads = torch.autograd.grad(energy(z) + s * beta * ell(z[-1]), z)
            z = [v - eta * g for v, g in zip(z, grads)]
        net.zero_grad()
        energy([v.detach() for v in z]).backward()
        out = [o + weight * p.grad / (x.shape[0] * beta) for o, p in zip(out, net.parameters())]
    return out


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("nudging,output", [("positive", "se"), ("negative", "ce"), ("symmetric", "se"),
                                            ("symmetric", "ce")])
def test_nudged_pc_equals_autograd_reference(nudging, output):
    """Guards against a clamped (not free) output node, a wrong phase sign or weight, the nudge's loss in the
    weight gradient, or a missing 1/β."""
    net, (x, labels) = _net(), _batch()
    ref = reference_nudged_pc(net, x, one_hot(labels, 3, DT), 15, 0.2, 0.3, nudging, output)
    got, info = _rule_grads(make_rule("pc", {"steps": 15, "step_size": 0.2, "nudging": nudging, "beta": 0.3,
                                             "output": output}), net, x, labels)
    _close(got, ref)
    assert info.output.shape == (8, 3)


def test_centred_nudged_pc_at_equilibrium_is_backprop_as_beta_vanishes():
    """Without the nudge the equilibrium is the forward pass, so as β → 0 the nudged estimate is back-propagation's
    gradient exactly (not the clamp's filtered deltas): error O(β²) centred, O(β) positive (float64, converged).
    Guards against a nudge on the pre-activation instead of the output node, or a wrong scale of either phase."""
    from inferlearn.rules import BackProp

    torch.manual_seed(1)   # smooth units: with kinks (ReLU, hard tanh) the plain steps stall near the equilibrium
    model = nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3)).to(DT)
    x, labels = _batch()
    for output, loss in (("se", "quadratic"), ("ce", "cross-entropy")):
        bp, _ = _rule_grads(BackProp(loss=loss, fused=False), model, x, labels)
        errs = {}
        for nudging in ("positive", "symmetric"):
            for beta in (2e-2, 1e-2):
                rule = make_rule("pc", {"steps": 5000, "step_size": 0.3, "tol": 1e-14, "nudging": nudging,
                                        "beta": beta, "output": output})
                got, info = _rule_grads(rule, model, x, labels)
                assert info.extras["converged"]
                num = sum(float((g - b).pow(2).sum()) for g, b in zip(got, bp)) ** 0.5
                errs[nudging, beta] = num / sum(float(b.pow(2).sum()) for b in bp) ** 0.5
        assert errs["symmetric", 1e-2] < 1e-3 and 3.3 < errs["symmetric", 2e-2] / errs["symmetric", 1e-2] < 4.7, errs
        assert 1.7 < errs["positive", 2e-2] / errs["positive", 1e-2] < 2.3, errs


def reference_ipc(net, x, y, steps, eta, alpha):
    """iPC by hand (Salvatori et al. 2024, Algorithm 1): every step updates the value nodes by autograd of ``F``
    (summed over the batch), then the weights by ``α ∇_θ F / B``, on a copy of the network. Returns ``θ_T``."""
    import copy

    net = copy.deepcopy(net)
    lins, acts = [m for m in net if isinstance(m, nn.Linear)], [m for m in net if not isinstance(m, nn.Linear)]
    with torch.no_grad():
        z = [x]
        for lin, act in zip(lins[:-1], acts):
            z.append(act(lin(z[-1])))
    z = z[1:]

    def energy(z):
        zs = [x, *z, y]
        fs = acts + [nn.Identity()]
        return sum(0.5 * (zs[k + 1] - f(lin(zs[k]))).pow(2).sum() for k, (lin, f) in enumerate(zip(lins, fs)))

    for _ in range(steps):
        z = [v.detach().requires_grad_(True) for v in z]
        grads = torch.autograd.grad(energy(z), z)
        z = [(v - eta * g).detach() for v, g in zip(z, grads)]
        net.zero_grad()
        (energy(z) / x.shape[0]).backward()
        with torch.no_grad():
            for p in net.parameters():
                p.sub_(alpha * p.grad)
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("act", [nn.ReLU, nn.Sigmoid], ids=["closed-form", "autograd"])
def test_incremental_pc_with_one_sgd_step_reproduces_hand_written_ipc(act):
    """Guards against weights moved once instead of at every step, the value update read at stale weights, a
    model left changed, and a .grad that overwrites instead of accumulating."""
    net, (x, labels) = _net(act), _batch()
    alpha = 0.3
    ipc = reference_ipc(net, x, one_hot(labels, 3, DT), 8, 0.2, alpha)
    before = [p.detach().clone() for p in net.parameters()]
    rule = make_rule("pc", {"steps": 8, "step_size": 0.2, "weight_step": alpha})
    net.zero_grad(set_to_none=True)
    rule.backward(net, x, labels)
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    first = [p.grad.clone() for p in net.parameters()]
    torch.optim.SGD(net.parameters(), lr=alpha).step()
    _close([p.detach() for p in net.parameters()], ipc)
    with torch.no_grad():
        for p, b in zip(net.parameters(), before):
            p.copy_(b)
    rule.backward(net, x, labels)   # accumulates
    _close([p.grad for p in net.parameters()], [2 * g for g in first])
    plain, _ = _rule_grads(make_rule("pc", {"steps": 8, "step_size": 0.2}), net, x, labels)
    assert max(float((a - b).abs().max()) for a, b in zip(plain, first)) > 1e-3   # not standard PC


def test_training_defaults_the_sgd_rate_to_the_ipc_weight_step():
    """Without --lr an iPC run steps at its weight_step (the recommended 0.4 on a sum of T gradients diverges)."""
    from inferlearn.training import TrainConfig

    cfg = TrainConfig(data="digits", arch="64-8-10", rule="pc", rule_options={"weight_step": "0.05"})
    assert cfg.resolved().lr == 0.05
    assert TrainConfig(data="digits", arch="64-8-10", rule="pc").resolved().lr == 0.4


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("beta", [1.0, 0.3, -0.2])
@pytest.mark.parametrize("output,optimizer", [("se", "momentum"), ("ce", "momentum"), ("se", "sgd")])
def test_target_nudging_is_pcx_output_vode(beta, output, optimizer):
    """PCX's output vode: the output clamped to ``u₀ + β (y − u₀)`` (``u₀`` the forward pass's output), PCX's
    momentum on the value nodes, the weight gradient × 1/β: the autograd reference at that target, divided by β.
    Guards against the label used as the target (β ignored), a missing or inverted 1/β, and the target moving with
    the inference (it is frozen at the forward pass's output)."""
    net, (x, labels) = _net(), _batch()
    with torch.no_grad():
        u0 = net(x)
    y = one_hot(labels, 3, DT)
    ref, _ = reference_pc(net, x, u0 + beta * (y - u0), 7, 0.05, 1.0, output, optimizer, 0.3)
    ref = [g / beta for g in ref]
    opts = {"steps": 7, "step_size": 0.05, "output": output, "inference_optimizer": optimizer,
            "nudging": "target", "beta": beta} | ({"inference_momentum": 0.3} if optimizer != "sgd" else {})
    got, _ = _rule_grads(make_rule("pc", opts), net, x, labels)
    _close(got, ref)
    if beta == 1:   # the clamp itself
        clamp, _ = _rule_grads(make_rule("pc", {k: v for k, v in opts.items() if k not in ("nudging", "beta")}),
                               net, x, labels)
        _close(got, clamp)
    else:
        label, _ = reference_pc(net, x, y, 7, 0.05, 1.0, output, optimizer, 0.3)
        assert max(float((a - b).abs().max()) for a, b in zip(label, got)) > 1e-3


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
def test_beta_schedule_sets_beta_per_epoch():
    """``beta_schedule`` gives epoch e its value (1-based, the last one repeated): the gradient in each epoch equals
    the fixed-β rule's."""
    net, (x, labels) = _net(), _batch()
    rule = make_rule("pc", {"steps": 5, "nudging": "target", "beta_schedule": "0.9,-0.9,0.5"})
    for epoch, beta in ((1, 0.9), (2, -0.9), (3, 0.5), (7, 0.5)):
        rule.begin_epoch(epoch, 8)
        got, _ = _rule_grads(rule, net, x, labels)
        fixed, _ = _rule_grads(make_rule("pc", {"steps": 5, "nudging": "target", "beta": beta}), net, x, labels)
        _close(got, fixed, 0)


@pytest.mark.parametrize("opts,msg", [
    ({"nudging": "target", "beta": 0}, "Invalid beta 0"),
    ({"nudging": "target", "beta": 1.5}, "Invalid beta 1.5"),
    ({"nudging": "target", "beta_schedule": "0.9,x"}, "Invalid beta nan"),
    ({"nudging": "target", "beta_schedule": "0.9,0"}, "Invalid beta 0.0"),
    ({"beta_schedule": "0.9"}, "needs nudging='target'"),
])
def test_bad_target_nudging_options(opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule("pc", opts)
