"""LPOM: the penalty from the integrals of the activation, the activation updates against a slow
reference solver (scipy L-BFGS-B with the box as bounds, float64), the weight gradient against
autograd of LPOM's objective at fixed activations (float64), and the option checks."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn

from inferlearn.engine.graph import read_graph
from inferlearn.engine.problems import LayeredEnergy, LayeredProblem
from inferlearn.models import MLP
from inferlearn.rules import make_rule
from inferlearn.rules.lpom import integral_potential, lpom_penalty
from inferlearn.units import get_units

UNITS = ["relu", "hard-sigmoid", "hard-tanh"]


@pytest.mark.parametrize("units", UNITS)
def test_integral_potential_is_the_integral_of_the_activation(units):
    """g(a) = ∫_0^a (φ(s) − s) ds, checked by the trapezoid rule on 20001 points (1e-7)."""
    box = get_units(units)
    for a in (-2.5, -0.3, 0.0, 0.4, 0.9, 1.7, 3.0):
        s = torch.linspace(0.0, a, 20001, dtype=torch.float64)
        ref = float(torch.trapezoid(box.project(s) - s, s))
        assert float(integral_potential(box, torch.tensor([a], dtype=torch.float64))) == pytest.approx(ref, abs=1e-7)


@pytest.mark.parametrize("units", UNITS)
def test_penalty_is_a_fenchel_young_gap_zero_at_the_forward_pass(units):
    """h(z, a) ≥ 0 on C, = 0 at z = φ(a), and equals the engine's fenchel term."""
    box = get_units(units)
    g = torch.Generator().manual_seed(0)
    a = 3 * torch.randn(50, 7, generator=g, dtype=torch.float64)
    z = box.project(2 * torch.randn(50, 7, generator=g, dtype=torch.float64))
    assert float(lpom_penalty(box, box.project(a), a).abs().max()) < 1e-14
    assert float(lpom_penalty(box, z, a).min()) >= 0
    net = nn.Sequential(nn.Linear(7, 7), nn.ReLU() if units == "relu" else nn.Hardtanh(*((0.0, 1.0) if units == "hard-sigmoid" else (-1.0, 1.0))), nn.Linear(7, 2)).double()
    energy = LayeredEnergy(read_graph(net), "fenchel", [1.0, 1.0])
    torch.testing.assert_close(energy.term(1, z, a), lpom_penalty(box, z, a), rtol=1e-13, atol=1e-13)


def _setup(units="relu", scale=1.0, seed=0):
    model = MLP([6, 5, 4, 3], units, seed=seed).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=p.dtype))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.rand(7, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (7,), generator=g)
    return model, x, labels


def _block_reference(rule, problem, hidden, k, mu):
    """argmin over z_k ∈ C_k of μ h_k(z_k, A_k z_{k−1}) + μ h_{k+1}(z_{k+1}, A_{k+1} z_k) by L-BFGS-B."""
    e = problem.energy
    links = [e.node(j) for j in range(1, problem.depth + 1)]
    z_below = problem.x if k == 1 else hidden[k - 2]
    z_above = hidden[k] if k < problem.depth - 1 else problem.target
    a_k = links[k - 1].map(z_below).detach()
    units_k = links[k - 1].units
    units_up = links[k].units if k + 1 < problem.depth else None
    shape = hidden[k - 1].shape

    def fun(v):
        z = torch.tensor(v, dtype=torch.float64).reshape(shape).requires_grad_(True)
        val = mu * (lpom_penalty(units_k, z, a_k).sum() + lpom_penalty(units_up, z_above, links[k].map(z)).sum())
        (grad,) = torch.autograd.grad(val, z)
        return float(val.detach()), grad.flatten().numpy()

    lo = units_k.lower if units_k.has_lower else None
    hi = units_k.upper if units_k.has_upper else None
    res = minimize(fun, hidden[k - 1].flatten().numpy(), jac=True, method="L-BFGS-B",
                   bounds=[(lo, hi)] * int(np.prod(shape)), options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 5000})
    return torch.tensor(res.x, dtype=torch.float64).reshape(shape)


@pytest.mark.parametrize("units", ["relu", "hard-sigmoid"])
@pytest.mark.parametrize("scale", [1.0, 0.3], ids=["damped", "fixed-point"])
def test_activation_update_solves_its_subproblem(units, scale):
    """Each hidden layer's update (LPOM's fixed point, t = 1 when ‖A_{k+1}‖² < 1; damped otherwise) run
    to convergence equals the L-BFGS-B minimiser of its block subproblem (1e-6); the output update is
    the closed form argmin ½‖z − y‖² + (μ/2)‖z − a_L‖²."""
    mu = 1.5
    model, x, labels = _setup(units, scale)
    rule = make_rule("lpom", {"mu": mu, "sweeps": 2})
    chain = read_graph(model)
    y = torch.nn.functional.one_hot(labels, 3).double()
    problem = LayeredProblem(rule.energy(chain), x).stacked(1, target=y)
    hidden, _, _, _ = rule.infer(problem, y)       # a point away from the forward pass
    steps = rule.layer_steps(problem, hidden)
    if scale < 1:
        assert steps == [1.0, 1.0], "small weights: LPOM's undamped fixed-point iteration"
    else:
        assert min(steps) < 1.0
    for k in (1, 2):
        ref = _block_reference(rule, problem, hidden, k, mu)
        trial = [h.clone() for h in hidden]
        rule.block_update(problem, trial, k, 3000, steps[k - 1])
        torch.testing.assert_close(trial[k - 1], ref, rtol=0, atol=1e-6)
    a_top = chain.nodes[-1].map(hidden[-1])
    torch.testing.assert_close(rule.output_update(a_top, y), (mu * a_top + y) / (mu + 1), rtol=0, atol=0)
    z = torch.zeros_like(a_top, requires_grad=True)
    opt = torch.optim.LBFGS([z], max_iter=200, tolerance_grad=1e-14, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        v = 0.5 * (z - y).pow(2).sum() + 0.5 * mu * (z - a_top.detach()).pow(2).sum()
        v.backward()
        return v
    opt.step(closure)
    torch.testing.assert_close(rule.output_update(a_top, y), z.detach(), rtol=0, atol=1e-10)


def _objective(chain, x, y, hidden, out, mu):
    """J/B = [½‖z_L − y‖² + μ Σ_k h_k(z_k, A_k z_{k−1})] / B, with h from the integral potentials."""
    zs = [x, *hidden, out]
    total = 0.5 * (out - y).pow(2).sum()
    for k, link in enumerate(chain.nodes, start=1):
        units = link.units if k < chain.depth else None
        total = total + mu * lpom_penalty(units, zs[k], link.map(zs[k - 1])).sum()
    return total / x.shape[0]


def _conv():
    torch.manual_seed(2)
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(8, 5), nn.Hardtanh(0.0, 1.0), nn.Linear(5, 3)).double()


@pytest.mark.parametrize("model_name", ["mlp", "conv"])
@pytest.mark.parametrize("mu", [0.7, 4.0])
def test_weight_gradient_is_autograd_of_the_lpom_objective(model_name, mu):
    """Oracle: float64 autograd of J/B written out from the integral potentials, at the activations the
    rule inferred (held fixed); 1e-12."""
    if model_name == "mlp":
        model, x, labels = _setup("hard-sigmoid")
    else:
        model = _conv()
        g = torch.Generator().manual_seed(4)
        x, labels = torch.rand(6, 16, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    y = torch.nn.functional.one_hot(labels, 3).double()
    info = make_rule("lpom", {"mu": mu, "sweeps": 4}).backward(model, x, labels)
    grads = [p.grad.clone() for p in model.parameters()]
    chain = read_graph(model)
    ref = torch.autograd.grad(_objective(chain, x, y, info.extras["hidden"], info.extras["output"], mu),
                              list(model.parameters()))
    for g_, r in zip(grads, ref):
        torch.testing.assert_close(g_, r, rtol=1e-12, atol=1e-12)
    assert any(float(g_.abs().max()) > 1e-6 for g_ in grads)


def test_sweeps_reach_a_block_fixed_point():
    """Run long enough, no block moves any more: every hidden layer satisfies its fixed-point equation and
    the output its closed form (1e-9), i.e. a point where no block update lowers J."""
    model, x, labels = _setup("relu")
    rule = make_rule("lpom", {"mu": 2.0, "sweeps": 2000, "tol": 1e-12})
    info = rule.backward(model, x, labels)
    assert info.extras["solver_residual"] <= 1e-12
    chain = read_graph(model)
    y = torch.nn.functional.one_hot(labels, 3).double()
    problem = LayeredProblem(rule.energy(chain), x).stacked(1, target=info.extras["output"])
    hidden = [h.clone() for h in info.extras["hidden"]]
    steps = rule.layer_steps(problem, hidden)
    for k in (1, 2):
        assert rule.block_update(problem, hidden, k, 1, steps[k - 1]) < 1e-9
    torch.testing.assert_close(info.extras["output"], rule.output_update(chain.nodes[-1].map(hidden[-1]), y),
                               rtol=0, atol=1e-9)


@pytest.mark.parametrize("opts, msg", [
    ({"mu": "0"}, "Invalid mu: 0.0"),
    ({"mu": "-2"}, "Invalid mu: -2.0"),
    ({"mu": "x"}, "Invalid value 'x' for option 'mu'"),
    ({"mu": "1e300"}, "Invalid mu: 1e\\+300"),
    ({"sweeps": "-1"}, "Invalid sweeps: -1"),
    ({"inner": "0"}, "Invalid inner: 0"),
    ({"tol": "0"}, "Invalid tol"),
])
def test_bad_options_are_one_line_errors(opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule("lpom", opts)


def test_zero_sweeps_keep_the_forward_pass():
    """sweeps = 0: hidden activations are the forward pass (every hidden h_k = 0), only the output moves."""
    model, x, labels = _setup("relu")
    info = make_rule("lpom", {"sweeps": 0}).backward(model, x, labels)
    zs, _ = read_graph(model).forward_all(x)
    for h, z in zip(info.extras["hidden"], zs[1:-1]):
        torch.testing.assert_close(h, z, rtol=0, atol=0)


def test_convergence_verdict_tracks_the_distance_to_the_fixed_point():
    """Without tol the sweeps are judged by the last sweep's move relative to the first's: converged (2000
    sweeps) or not, and far (warned once per run) when 2 sweeps leave the activations visibly away from the
    fixed point — checked against that fixed point itself."""
    from inferlearn.errors import ConvergenceWarning
    from inferlearn.rules.lpom import FAR_RTOL

    model, x, labels = _setup("relu")
    ref = make_rule("lpom", {"mu": 2.0, "sweeps": 2000}).backward(model, x, labels)
    assert ref.extras["converged"] and not ref.extras["far"]
    rule = make_rule("lpom", {"mu": 2.0, "sweeps": 2})
    with pytest.warns(ConvergenceWarning, match="far from its fixed point after 2 sweeps"):
        info = rule.backward(model, x, labels)
    assert info.extras["far"] and not info.extras["converged"]
    gap = max(float((h - r).abs().max()) for h, r in zip(info.extras["hidden"], ref.extras["hidden"]))
    assert gap > FAR_RTOL * info.extras["solver_residual"]   # the move understates the distance, never overstates it
    rule.backward(model, x, labels)   # once per run: no second warning (warnings are errors in the tests)
