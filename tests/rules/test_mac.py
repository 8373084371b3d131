"""MAC (method of auxiliary coordinates): oracles for the Z-step, the W-step gradient, the persistent
per-sample coordinates, the μ schedule, exact resume and the option checks."""
import pytest
import torch
from torch import nn

from inferlearn.rules import make_rule
from inferlearn.training.config import TrainConfig
from inferlearn.training.loop import train


def _data(n=12, d=6, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=torch.float64), torch.randint(0, c, (n,), generator=g)


def _penalty(model_links, x, y, hidden, mu):
    """E_Q / B written out: ½‖y − f_L(a_L)‖² + (μ/2) Σ_k ‖z_k − f_k(a_k)‖², a_k = A_k(z_{k−1})."""
    zs = [x, *hidden]
    total = 0.0
    for k, (lin, act) in enumerate(model_links, start=1):
        a = lin(zs[k - 1])
        f = act(a) if act is not None else a
        if k < len(model_links):
            total = total + 0.5 * mu * (zs[k] - f).pow(2).sum()
        else:
            total = total + 0.5 * (y - f).pow(2).sum()
    return total / x.shape[0]


def _links(net):
    return [(net[0], net[1]), (net[2], net[3]), (net[4], None)]


def _net(act=nn.ReLU):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5), act(), nn.Linear(5, 4), act(), nn.Linear(4, 3)).double()


def _stored(rule, index):
    return [z[index] for z in rule.state_dict()["z"]]


@pytest.mark.parametrize("mu", [0.5, 3.0])
def test_w_step_gradient_is_autograd_of_the_penalty_at_fixed_z(mu):
    """Oracle: float64 autograd of E_Q/B (written out by hand) at the coordinates the Z-step stored; 1e-12."""
    net, (x, labels) = _net(), _data()
    y = torch.nn.functional.one_hot(labels, 3).double()
    rule = make_rule("mac", {"mu0": mu, "steps": 30})
    index = torch.arange(12)
    rule.backward(net, x, labels, index=index)
    grads = [p.grad.clone() for p in net.parameters()]
    hidden = _stored(rule, index)
    ref = torch.autograd.grad(_penalty(_links(net), x, y, hidden, mu), list(net.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_z_step_reaches_the_minimiser_of_the_penalty():
    """Linear units make E_Q a strictly convex quadratic in z: the Z-step (2000 steps) equals the
    minimiser found by float64 L-BFGS to 1e-7; with ReLU units its z-gradient vanishes (1e-8)."""
    for act in (nn.Identity, nn.ReLU):
        net, (x, labels) = _net(act), _data()
        y = torch.nn.functional.one_hot(labels, 3).double()
        mu = 2.0
        rule = make_rule("mac", {"mu0": mu, "steps": 2000, "step_size": 0.2})
        index = torch.arange(12)
        rule.backward(net, x, labels, index=index)
        hidden = [h.clone().requires_grad_(True) for h in _stored(rule, index)]
        grad_z = torch.autograd.grad(_penalty(_links(net), x, y, hidden, mu), hidden)
        assert max(float(g.abs().max()) for g in grad_z) < 1e-8
        if act is nn.Identity:
            with torch.no_grad():
                zs = [net[0](x), net[2](net[1](net[0](x)))]
            zs = [z.clone().requires_grad_(True) for z in zs]
            opt = torch.optim.LBFGS(zs, max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                v = _penalty(_links(net), x, y, zs, mu)
                v.backward()
                return v
            opt.step(closure)
            for h, z in zip(hidden, zs):
                torch.testing.assert_close(h.detach(), z.detach(), rtol=0, atol=1e-7)


def test_coordinates_persist_and_warm_start_the_next_visit():
    """A sample's second visit starts from its stored coordinates (warm_fraction 1); with 0 further
    steps the W-step gradient is exactly the one at the stored coordinates. Unseen samples start from
    the forward pass; a call without index is stateless."""
    net, (x, labels) = _net(), _data()
    rule = make_rule("mac", {"steps": 25})
    index = torch.arange(12)
    info = rule.backward(net, x, labels, index=index)
    assert info.extras["warm_fraction"] == 0.0
    stored = _stored(rule, index)
    with torch.no_grad():
        fwd = [net[1](net[0](x)), net[3](net[2](net[1](net[0](x))))]
    assert all(float((s - f).abs().max()) > 1e-4 for s, f in zip(stored, fwd)), "Z-step should move z"

    frozen = make_rule("mac", {"steps": 0})
    frozen.load_state_dict(rule.state_dict())
    net.zero_grad()
    info = frozen.backward(net, x[:5], labels[:5], index=index[:5])
    assert info.extras["warm_fraction"] == 1.0
    grads = [p.grad.clone() for p in net.parameters()]
    y = torch.nn.functional.one_hot(labels[:5], 3).double()
    ref = torch.autograd.grad(_penalty(_links(net), x[:5], y, [s[:5] for s in stored], 1.0), list(net.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)

    # samples 12 … 15 are new: half the batch warm, half from the forward pass
    x2, labels2 = _data(16, seed=5)
    info = rule.backward(net, x2[8:16], labels2[8:16], index=torch.arange(8, 16))
    assert info.extras["warm_fraction"] == 0.5
    assert rule.state_dict()["seen"].shape[0] == 16 and bool(rule.state_dict()["seen"].all())
    before = [z.clone() for z in rule.state_dict()["z"]]
    rule.backward(net, x, labels)                      # no index: stateless
    assert all(torch.equal(a, b) for a, b in zip(before, rule.state_dict()["z"]))


def test_mu_schedule_grows_geometrically_and_stops_at_mu_max():
    rule = make_rule("mac", {"mu0": "2", "mu_growth": "3", "mu_max": "100"})
    mus = []
    for epoch in range(1, 6):
        rule.begin_epoch(epoch, 10)
        mus.append(rule.mu)
    assert mus == pytest.approx([2, 6, 18, 54, 100])
    assert make_rule("mac", {"mu_growth": 1}).mu_at(50) == 1.0


def test_large_mu_approaches_back_propagation():
    """μ → ∞ is the nested problem: the W-step gradient tends to back-propagation's (float64; relative
    error ≲ 1/μ once the Z-step has converged)."""
    net, (x, labels) = _net(), _data(40)
    errs = []
    for mu in (10.0, 1e3):
        net.zero_grad()
        make_rule("mac", {"mu0": mu, "mu_max": 1e8, "steps": 3000, "step_size": 0.2}).backward(net, x, labels)
        g = torch.cat([p.grad.flatten() for p in net.parameters()])
        net.zero_grad()
        make_rule("backprop").backward(net, x, labels)
        ref = torch.cat([p.grad.flatten() for p in net.parameters()])
        errs.append(float((g - ref).norm() / ref.norm()))
    assert errs[1] < 5e-3 and errs[1] < errs[0] / 20, errs


@pytest.mark.parametrize("opts, msg", [
    ({"mu0": "0"}, "Invalid mu0: 0.0"),
    ({"mu0": "-1"}, "Invalid mu0: -1.0"),
    ({"mu0": "abc"}, "Invalid value 'abc' for option 'mu0'"),
    ({"mu0": "1e300"}, "Invalid mu0"),
    ({"mu_growth": "0.5"}, "Invalid mu_growth: 0.5"),
    ({"mu_max": "0.1", "mu0": "1"}, "Invalid mu_max: 0.1"),
    ({"steps": "-1"}, "Invalid steps"),
    ({"step_size": "0"}, "Invalid step_size"),
])
def test_bad_options_are_one_line_errors(opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule("mac", opts)


def test_bad_index_is_refused():
    net, (x, labels) = _net(), _data()
    rule = make_rule("mac")
    for bad in (torch.arange(11), torch.zeros(12, dtype=torch.long), torch.arange(12.0), -torch.arange(12)):
        with pytest.raises(ValueError, match="Invalid index"):
            rule.backward(net, x, labels, index=bad)


def _cfg(tmp_path, name, **kw):
    base = dict(data="digits", arch="64-16-10", rule="mac", epochs=3, batch_size=64, lr=0.1, seed=3,
                limit_train=400, rule_options={"mu0": "1", "mu_growth": "2"}, out=str(tmp_path / name))
    return TrainConfig(**(base | kw))


def _strip(history):
    return [{k: v for k, v in r.items() if k != "epoch_seconds"} for r in history]


def test_resume_is_exact_with_the_coordinates_in_the_checkpoint(tmp_path):
    """The coordinates (and μ) travel in the checkpoint: 1 + 2 resumed epochs equal 3 epochs exactly.
    Without the restored coordinates the resumed run differs (the state matters)."""
    from inferlearn.rules.mac import MAC

    full = train(_cfg(tmp_path, "full"), progress=False, log=None)
    train(_cfg(tmp_path, "part", epochs=1), progress=False, log=None)
    ckpt = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)
    assert ckpt["rule_state"]["seen"].shape == (400,) and bool(ckpt["rule_state"]["seen"].all())
    resumed = train(_cfg(tmp_path, "part"), progress=False, resume=True, log=None)
    assert _strip(full) == _strip(resumed)

    train(_cfg(tmp_path, "lost", epochs=1), progress=False, log=None)
    saved = MAC.load_state_dict
    MAC.load_state_dict = lambda self, state: None     # simulate a checkpoint without the coordinates
    try:
        lost = train(_cfg(tmp_path, "lost"), progress=False, resume=True, log=None)
    finally:
        MAC.load_state_dict = saved
    assert _strip(lost) != _strip(full)


def test_cold_start_ablation_stores_nothing():
    net, (x, labels) = _net(), _data()
    rule = make_rule("mac", {"warm_start": "false"})
    rule.backward(net, x, labels, index=torch.arange(12))
    assert rule.state_dict()["z"] is None


def test_cli_trains_mac(tmp_path, capsys):
    from inferlearn.cli import main
    assert main(["train", "--data", "digits", "--arch", "64-16-10", "--rule", "mac", "--rule-opt", "mu0=2",
                 "--epochs", "1", "--limit-train", "200", "--out", str(tmp_path / "r"), "--quiet"]) == 0
