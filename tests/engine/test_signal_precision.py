"""Two-phase signals resolved in float32: the gradient against the float64 computation of the same rule.

A rule whose gradient is a difference of two nearby states divided by their distance (Fenchel BP's
``(f(a) − f(a − βg))/β``) loses the signal to float32 rounding once ``β|g| ≲ ε|a|`` unless the
difference is formed in higher precision (the differential form). Oracle: the same rule, same weights,
in float64.
"""
import copy
import math

import pytest
import torch
from torch import nn

from inferlearn.models import MLP
from inferlearn.rules import make_rule


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])


def _conv():
    torch.manual_seed(0)
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(64, 16), nn.Hardtanh(0.0, 1.0), nn.Linear(16, 10))


@pytest.mark.parametrize("model_name", ["mlp", "conv"])
@pytest.mark.parametrize("beta", [1e-1, 1e-2, 1e-4, 1e-6])
def test_fenchel_bp_in_float32_matches_float64_at_small_beta(beta, model_name):
    """Guards against Fenchel BP's finite difference drowning in float32 rounding (10.6 % error at β = 1e-6
    on the MNIST MLP before the differential form)."""
    g = torch.Generator().manual_seed(1)
    x, labels = torch.rand(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)
    m32 = MLP("64-32-32-10", "relu", seed=0) if model_name == "mlp" else _conv()
    m64 = copy.deepcopy(m32).double()
    ref = _grads(make_rule("fenchel-bp", {"beta": beta}), m64, x.double(), labels)
    got = _grads(make_rule("fenchel-bp", {"beta": beta}), m32, x, labels)
    assert float((got - ref).norm() / ref.norm()) < 1e-4


def _reference(name, opts, model, x, labels):
    """The float64 rule with its phases solved differentially to a tight relative tolerance and the free
    phase by the float64 reference solver: resolved at every signal size of the matrix below."""
    import inferlearn.engine.differential as differential

    old = differential.RELATIVE_TOL
    differential.RELATIVE_TOL = 1e-10
    try:
        rule = make_rule(name, opts | {"solver": "reference", "phases": "differential"})
        return _grads(rule, copy.deepcopy(model).double(), x.double(), labels)
    finally:
        differential.RELATIVE_TOL = old


CASES = [(hidden, gamma, name, extra) for hidden, gamma in [(3, 1 / 8), (5, 1 / 16), (5, 1 / 64), (7, 1 / 16)]
         for name, extra in [("contrastive", {}), ("eqprop", {"beta": 0.1}),
                             ("eqprop", {"beta": 1e-3, "nudging": "positive"}), ("eqprop", {"beta": 1e-6})]]


@pytest.mark.parametrize("hidden,gamma,name,extra", CASES,
                         ids=[f"{n}-{h}x-g{1 / g:g}-{'-'.join(f'{k}{v}' for k, v in e.items())}" for h, g, n, e in CASES])
def test_two_phase_rules_in_float32_match_float64_or_warn(hidden, gamma, name, extra):
    """The oracle matrix of the two-phase rules (float32 at default options, γ^{L-1} from 2e-3 down to 1e-9, β
    from 1e-1 to 1e-6): the gradient is within 1 % of the float64 computation, or a PrecisionWarning fired.
    Guards against silently wrong gradients where the signal drowns in round-off or in the solver's tolerance
    (differential phases resolve it)."""
    import warnings

    from inferlearn.errors import PrecisionWarning

    model = MLP([30] + [20] * hidden + [5], "relu", seed=0)
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 30, generator=g), torch.randint(0, 5, (64,), generator=g)
    opts = {"gamma": gamma, **extra}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _grads(make_rule(name, opts), model, x, labels)
    warned = any(issubclass(w.category, PrecisionWarning) for w in caught)
    ref = _reference(name, opts, model, x, labels)
    err = float((got - ref).norm() / ref.norm())
    assert err < 0.01 or warned, err


@pytest.mark.parametrize("name", ["contrastive", "eqprop"])
def test_direct_phases_drown_where_differential_ones_do_not(name):
    """The case that motivated differential phases: 5 hidden layers at γ = 1/32 in float32. Solved directly the
    gradient is mostly round-off (and a PrecisionWarning says so); solved differentially it is within 0.1 % of
    the float64 one."""
    import warnings

    model = MLP([30] + [20] * 5 + [5], "relu", seed=0)
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(64, 30, generator=g), torch.randint(0, 5, (64,), generator=g)
    ref = _reference(name, {"gamma": 1 / 32}, model, x, labels)
    errors = {}
    for phases in ("direct", "differential"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _grads(make_rule(name, {"gamma": 1 / 32, "phases": phases}), model, x, labels)
        errors[phases] = float((got - ref).norm() / ref.norm())
    assert errors["direct"] > 0.1 and errors["differential"] < 1e-3, errors


@pytest.mark.parametrize("beta", [1e-1, 1e-3, 1e-5])
def test_eqprop_on_a_conv_net_stops_its_nudged_phase_relative_to_the_signal(beta):
    """The issue's case on the generic engine (Conv 1→2, ReLU, AvgPool, Linear 18→5, ReLU, Linear 5→3, weights ×2,
    γ = 1/8, float64, batch 8): at β = 1e-3 the nudged phase used to stop at the absolute tolerance 1e-5, 0.6 of
    its signal, leaving 8.9 % gradient error with no warning (6.9 % on these weights). Its tolerance now follows
    the signal: within 1 % of the same rule solved to 1e-12."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Unflatten(1, (1, 6, 6)), nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                          nn.Flatten(), nn.Linear(18, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    g = torch.Generator().manual_seed(2)
    x, labels = torch.rand(8, 36, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)
    opts = {"gamma": 1 / 8, "beta": beta}
    got = _grads(make_rule("eqprop", opts), model, x, labels)
    ref = _grads(make_rule("eqprop", opts | {"tol": 1e-12, "max_iter": 100000}), model, x, labels)
    assert float((got - ref).norm() / ref.norm()) < 0.01


def test_argmin_layer_trains_through_float32_stalls_and_warns_once_when_a_solve_stops_short():
    """The issue's case: an NNLS layer (D = 0.3 randn(32, 24), ridge 0.1, z ≥ 0, symmetric nudging, β = 1e-3)
    between two linear layers, Adam 0.01, batch 50 on digits, float32. Its forward solves stall at 3e-6, above
    the float32 floor of the starting point (zeros) and below that of the solution (|z| ≈ 8): training
    stopped with a ConvergenceError in the first epoch for seeds 1 and 2. Now the first epoch runs for seeds
    0-2 without a warning, and a solver cut short (3 iterations, reporting its limit) warns once and carries on."""
    import warnings

    from sklearn.datasets import load_digits
    from torch import nn

    from inferlearn.bilevel import AcceleratedProjectedGradient, ArgminLayer, Box, LeastSquaresEnergy
    from inferlearn.errors import ConvergenceWarning

    X, Y = load_digits(return_X_y=True)
    X, Y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(Y)

    def epoch(seed, solver=None, batches=None):
        torch.manual_seed(seed)
        D = nn.Parameter(torch.randn(32, 24) * 0.3)
        layer = ArgminLayer(LeastSquaresEnergy(D, ridge=0.1), Box.nonnegative(), beta=1e-3, nudging="symmetric",
                            solver=solver)
        model = nn.Sequential(nn.Linear(64, 32), layer, nn.Linear(24, 10))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
        for i in list(range(0, len(X), 50))[:batches]:
            idx = perm[i:i + 50]
            loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss), layer

    for seed in range(3):
        loss, layer = epoch(seed)
        assert loss < 1.0 and layer.last_forward.converged
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss, layer = epoch(0, AcceleratedProjectedGradient(max_iter=3, on_limit="report"), batches=5)
    msgs = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(msgs) == 1 and "stopped after 3 iterations" in msgs[0] and "max_iter" in msgs[0]
    assert math.isfinite(loss) and not layer.last_forward.converged


def _deep_conv():
    """A conv chain with four hidden layers after the conv block (γ^{L-1} down to 1e-8 at γ = 1/64)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))


def _batch(width=64, n=32):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, width, generator=g), torch.randint(0, 5, (n,), generator=g)


CONV_CASES = [(dtype, gamma, name, extra) for dtype in ("float32", "float64") for gamma in (1 / 8, 1 / 64)
              for name, extra in [("contrastive", {}), ("eqprop", {"beta": 0.1}), ("eqprop", {"beta": 1e-6})]]


@pytest.mark.parametrize("dtype,gamma,name,extra", CONV_CASES,
                         ids=[f"{d}-{n}-g{1 / g:g}-{'-'.join(f'{k}{v}' for k, v in e.items())}" for d, g, n, e in CONV_CASES])
def test_two_phase_rules_on_a_conv_net_match_the_float64_reference_or_warn(dtype, gamma, name, extra):
    """The oracle matrix's conv rows, float32 and float64 at default options: within 1 % of the float64 rule
    with both phases solved by the reference solver, or a precision / convergence warning fired. Guards
    against conv nets (direct phases) silently losing the two-phase signal to round-off or to the tolerance."""
    import warnings

    from inferlearn.errors import ConvergenceWarning, PrecisionWarning

    model, (x, labels) = _deep_conv(), _batch()
    opts = {"gamma": gamma, **extra}
    dt = getattr(torch, dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _grads(make_rule(name, opts), copy.deepcopy(model).to(dt), x.to(dt), labels)
    warned = any(issubclass(w.category, (PrecisionWarning, ConvergenceWarning)) for w in caught)
    ref = _grads(make_rule(name, opts | {"solver": "reference"}), copy.deepcopy(model).double(), x.double(), labels)
    err = float((got - ref).norm() / ref.norm())
    assert err < 0.01 or warned, err


#: each one-phase energy rule solved to its minimiser in float64 (the reference of the matrix below)
CONVERGED = {"lifted-j0": {"solver": "reference"}, "lifted-fenchel": {"steps": 3000}, "pc": {"steps": 3000},
             "mac": {"steps": 3000, "warm_start": False}, "lpom": {"sweeps": 2000}}
ONE_PHASE_CASES = [(m, n, o) for m in ("mlp", "conv") for n in CONVERGED
                   for o in ([{"gamma": 1 / 8}, {"gamma": 1 / 64}] if n.startswith("lifted") else [{}])]


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("model_name,name,opts", ONE_PHASE_CASES,
                         ids=[f"{m}-{n}-{'-'.join(f'{k}{v:g}' for k, v in o.items())}" for m, n, o in ONE_PHASE_CASES])
def test_one_phase_energy_rules_match_float64_and_report_how_far_from_the_minimiser(model_name, name, opts):
    """The oracle matrix's one-phase rows (lifted J0, lifted Fenchel, PC, MAC, LPOM on a 5-hidden-layer MLP and
    a deep conv net, default options): float32 equals the same computation in float64 to 1e-5 (no two-phase
    cancellation to lose), and against the rule's minimiser (float64, solved to convergence) the gradient is
    within 1 % or the rule says it is not converged (``extras["converged"]`` False) or warns. Guards against
    a fixed-step solve that claims convergence while its gradient is far from the minimiser's."""
    import warnings

    make = (lambda: MLP([64] + [20] * 5 + [5], "relu", seed=0)) if model_name == "mlp" else _deep_conv
    model, (x, labels) = make(), _batch()
    ref = _grads(make_rule(name, opts | CONVERGED[name]), copy.deepcopy(model).double(), x.double(), labels)
    same64 = _grads(make_rule(name, dict(opts)), copy.deepcopy(model).double(), x.double(), labels)
    m32 = copy.deepcopy(model).float()
    m32.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = make_rule(name, dict(opts)).backward(m32, x, labels)
    got = torch.cat([p.grad.reshape(-1).double() for p in m32.parameters()])
    assert float((got - same64).norm() / same64.norm()) < 1e-5
    err = float((got - ref).norm() / ref.norm())
    reported = info.extras.get("converged") is False or len(caught) > 0
    assert err < 0.01 or reported, (err, info.extras.get("converged"))
