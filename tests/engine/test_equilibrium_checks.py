"""How far from equilibrium: the two-phase rules on graphs at small β, and the gradient gap of the fixed-step rules.

* EqProp on a residual conv net, a concatenating graph and a residual stream (float64, default options, β from
  1e-1 to 1e-3): its gradient's directional derivative equals central finite differences of the loss at the
  re-solved free equilibrium (the β → 0 limit, Zach, bilevel paper, Prop. 1) within 1 %, or a warning fired.
* ``diagnostics.equilibrium_gap``: on a linear network PC's equilibrium is a least-squares problem; the gradient
  there (autograd of the energy at the ``lstsq`` minimiser) is the library's at ``equilibrium_options`` and the
  gap at the defaults is the distance from it. ``--check-equilibrium`` records and warns once.
* ePC's overshoot warning: a last step about as large as the first (the small-step regime) is not one.
"""
import copy
import json
import warnings

import pytest
import torch
from test_graph import Branches, ResConv, ResidualMLP, _data

from inferlearn.diagnostics import equilibrium_gap, rule_gradients
from inferlearn.engine.problems import LayeredProblem
from inferlearn.errors import ConvergenceWarning, PrecisionWarning
from inferlearn.losses import one_hot, quadratic_loss
from inferlearn.models import MLP
from inferlearn.rules import make_rule


def _free_loss(model, x, labels, gamma):
    """The quadratic loss at the lifted free equilibrium, solved to 1e-13 (the function EqProp differentiates)."""
    rule = make_rule("eqprop", {"gamma": gamma, "tol": 1e-13, "max_iter": 200000})
    chain, _ = rule.chain(model, x)
    free = LayeredProblem(rule.layered_energy(chain), x)
    hidden, _ = rule._solver.solve(free)
    out = free.full(hidden)[-1].detach()
    return float(quadratic_loss(out, one_hot(labels, out.shape[1], out.dtype)))


GRAPH_CASES = [(make, beta, nudging) for make in (ResConv, Branches, ResidualMLP) for beta in (1e-1, 1e-2, 1e-3)
               for nudging in ("symmetric", "positive")]


@pytest.mark.parametrize("make,beta,nudging", GRAPH_CASES,
                         ids=[f"{m.__name__}-b{b:g}-{n}" for m, b, n in GRAPH_CASES])
def test_eqprop_on_graphs_matches_finite_differences_of_the_free_loss_or_warns(make, beta, nudging):
    """The oracle matrix's graph rows: guards against a nudged phase on the generic engine stopped at a tolerance
    comparable to its signal β γ^{L-1} (the error then grows as β shrinks, with no warning)."""
    model, (x, labels), gamma = make().double(), _data(n=8), 1 / 8
    g = torch.Generator().manual_seed(5)
    direction = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in model.parameters()]

    def loss_at(t):
        moved = copy.deepcopy(model)
        with torch.no_grad():
            for p, v in zip(moved.parameters(), direction):
                p.add_(t * v)
        return _free_loss(moved, x, labels, gamma)

    fd = (loss_at(1e-5) - loss_at(-1e-5)) / 2e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = rule_gradients(make_rule("eqprop", {"gamma": gamma, "beta": beta, "nudging": nudging}), model, x, labels)
    warned = any(issubclass(w.category, (PrecisionWarning, ConvergenceWarning)) for w in caught)
    mine = sum(float((grads[n] * v).sum()) for (n, _), v in zip(model.named_parameters(), direction))
    assert abs(mine - fd) < 0.01 * abs(fd) or warned, (mine, fd)


def _least_squares_pc_gradient(model, x, y):
    """PC's weight gradient at the exact equilibrium of a linear MLP (clamped output, output weight 1): the value
    nodes minimise ``Σ_k ½‖z_k − W_k z_{k−1} − b_k‖² + ½‖y − W_L z_{L−1} − b_L‖²``, an affine least-squares problem
    in ``z`` (solved by ``torch.linalg.lstsq`` on its dense matrix); the gradient is autograd of that energy at the
    minimiser with respect to the weights, over the batch size."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    widths = [m.out_features for m in layers[:-1]]
    n = sum(widths)

    def residual(z_flat, x_row, y_row):
        zs, at = [x_row], 0
        for w in widths:
            zs.append(z_flat[at:at + w])
            at += w
        parts = [zs[k + 1] - layers[k](zs[k]) for k in range(len(widths))]
        return torch.cat(parts + [y_row - layers[-1](zs[-1])])

    with torch.no_grad():
        solutions = []
        for x_row, y_row in zip(x, y):
            r0 = residual(torch.zeros(n, dtype=x.dtype), x_row, y_row)
            J = torch.autograd.functional.jacobian(lambda z: residual(z, x_row, y_row), torch.zeros(n, dtype=x.dtype))
            solutions.append(torch.linalg.lstsq(J, -r0.unsqueeze(1)).solution.squeeze(1))
    energy = sum(0.5 * residual(z, xr, yr).pow(2).sum() for z, xr, yr in zip(solutions, x, y)) / x.shape[0]
    return dict(zip([n for n, _ in model.named_parameters()], torch.autograd.grad(energy, list(model.parameters()))))


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
def test_equilibrium_gap_is_the_distance_from_the_least_squares_equilibrium_of_a_linear_net():
    """Guards against an equilibrium counterpart that does not reach the equilibrium, or a gap on other terms."""
    model = MLP("12-8-8-3", "linear", seed=0).double()
    g = torch.Generator().manual_seed(0)
    x, labels = torch.rand(6, 12, generator=g, dtype=torch.float64), torch.arange(6) % 3
    exact = _least_squares_pc_gradient(model, x, one_hot(labels, 3, torch.float64))
    rule = make_rule("pc", {"steps": 5})
    settled = rule_gradients(make_rule("pc", rule.equilibrium_options() | {"steps": 3000}), model, x, labels)
    at_steps = rule_gradients(rule, model, x, labels)
    norm = lambda d: float(torch.stack([t.norm() for t in d.values()]).norm())  # noqa: E731
    assert norm({k: settled[k] - exact[k] for k in exact}) < 1e-9 * norm(exact)
    expected = norm({k: at_steps[k] - exact[k] for k in exact}) / norm(exact)
    assert expected > 0.05
    assert equilibrium_gap(rule, model, x, labels) == pytest.approx(expected, rel=1e-6)
    assert equilibrium_gap(make_rule("backprop"), model, x, labels) is None
    assert equilibrium_gap(make_rule("epc"), model, x, labels) is None


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("name", ["pc", "mac", "lpom", "lifted-fenchel"])
def test_equilibrium_gap_shrinks_with_the_steps_and_leaves_model_and_rule_as_they_were(name):
    """Guards against a diagnostic that trains the model, or moves a rule's per-sample state, as it measures."""
    model = MLP("12-8-8-3", "relu", seed=1)
    g = torch.Generator().manual_seed(1)
    x, labels = torch.rand(8, 12, generator=g), torch.arange(8) % 3
    key = "sweeps" if name == "lpom" else "steps"
    before = copy.deepcopy(model.state_dict())
    few, many = make_rule(name, {key: 2}), make_rule(name, {key: 200})
    gap_few, gap_many = equilibrium_gap(few, model, x, labels), equilibrium_gap(many, model, x, labels)
    assert gap_many < gap_few and gap_few > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_check_equilibrium_records_the_gap_every_epoch_and_warns_once(tmp_path, capsys):
    from inferlearn.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("always")   # the command prints its warnings, one line each
        code = main(["train", "--data", "digits", "--rule", "pc", "--epochs", "2",
                     "--check-equilibrium", "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 0
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0.1 < line["equilibrium_gap"] < 1.5 for line in lines)
    msgs = [s for s in capsys.readouterr().err.splitlines() if "from the one at its inference's equilibrium" in s]
    assert len(msgs) == 1 and "after epoch 1" in msgs[0]
    assert main(["train", "--data", "digits", "--rule", "backprop", "--epochs", "1", "--check-equilibrium",
                 "--out", str(tmp_path / "bp"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--check-equilibrium with --rule backprop" in err[0]


@pytest.mark.parametrize("growth,warns", [(1.007, False), (1.4, False), (2.0, True)])
def test_epc_calls_only_a_real_growth_of_its_steps_an_overshoot(growth, warns):
    """VGG-5 at ePC's defaults (η = 1e-4) ends its 5 steps 1.007× the first: the small-step regime, where the steps
    barely change, not an overshoot; the warning used to fire in every such run."""
    solver = make_rule("epc")._solver
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = solver.report(5, growth * 1e-3, 1e-3, None, 1e-12)
    assert info.far is warns and (len(caught) == 1) is warns
