"""Layer-wise β_k in Fenchel back-propagation: equal β_k are the global-β rule exactly, each β_k acts on its
own layer only, every β_k → 0 is back-propagation (float64 autograd), and bad options are clear errors."""
import json

import pytest
import torch
from torch import nn

from inferlearn.models import MLP
from inferlearn.rules import make_rule, rule_options


def _grads(rule, model, x, labels):
    model.zero_grad(set_to_none=True)
    rule.backward(model, x, labels)
    return [p.grad.clone() for p in model.parameters()]


def _data(n=30, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _sigmoid_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.Sigmoid(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 6), nn.ReLU(),
                         nn.Linear(6, 3)).double()


MODELS = {"mlp": lambda: MLP([16, 8, 8, 6, 3], "hard-tanh", seed=1).double(), "sequential": _sigmoid_net}


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_equal_betas_are_the_global_rule_exactly(model_name):
    model, (x, labels) = MODELS[model_name](), _data()
    ref = _grads(make_rule("fenchel-bp", {"beta": 0.3}), model, x, labels)
    for opts in ({"betas": "0.3,0.3,0.3"}, {"betas": [0.3, 0.3, 0.3]}, {"beta": 0.3, "beta_ratio": 1.0}):
        for g, r in zip(_grads(make_rule("fenchel-bp", opts), model, x, labels), ref):
            assert torch.equal(g, r), opts


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_each_beta_acts_on_its_own_layer(model_name):
    """β_k enters δ_k only, and δ_k reaches the weights below layer k only: changing β_1 changes the
    first layer's gradient and nothing else; changing β_3 changes the first three layers' gradients and
    leaves the output layer's."""
    model, (x, labels) = MODELS[model_name](), _data()
    base = _grads(make_rule("fenchel-bp", {"betas": "0.2,0.2,0.2"}), model, x, labels)
    first = _grads(make_rule("fenchel-bp", {"betas": "0.9,0.2,0.2"}), model, x, labels)
    assert not torch.equal(first[0], base[0])
    assert all(torch.equal(a, b) for a, b in zip(first[2:], base[2:]))
    top = _grads(make_rule("fenchel-bp", {"betas": "0.2,0.2,0.9"}), model, x, labels)
    assert not torch.equal(top[4], base[4]) and not torch.equal(top[0], base[0])
    assert all(torch.equal(a, b) for a, b in zip(top[6:], base[6:]))


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_all_betas_to_zero_is_back_propagation(model_name):
    """Relative error to float64 autograd back-propagation falls with max β_k (O(β) for smooth units)
    and the cosine reaches 1 − 1e-9; layer-wise βs of different sizes converge like the global one."""
    model, (x, labels) = MODELS[model_name](), _data()
    model.zero_grad()
    with torch.enable_grad():
        loss = 0.5 * (model(x) - torch.nn.functional.one_hot(labels, 3).double()).pow(2).sum(1).mean()
        ref = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
    errs = []
    for scale in (1e-1, 1e-3, 1e-5):
        g = torch.cat([t.flatten() for t in _grads(make_rule("fenchel-bp", {"betas": f"{scale},{scale / 4},{scale * 3}"}),
                                                 model, x, labels)])
        errs.append(float((g - ref).norm() / ref.norm()))
        cos = float(g @ ref / (g.norm() * ref.norm()))
    assert errs[2] < 1e-4 and errs[1] < errs[0] and errs[2] <= errs[1] + 1e-10, errs   # piecewise-linear units: exact below the kinks
    assert cos > 1 - 1e-9


def test_geometric_schedule():
    rule = make_rule("fenchel-bp", {"beta": "0.4", "beta_ratio": "1/2"})
    assert rule.layer_betas(3) == pytest.approx([0.4, 0.2, 0.1])
    model, (x, labels) = MODELS["mlp"](), _data()
    explicit = _grads(make_rule("fenchel-bp", {"betas": "0.4,0.2,0.1"}), model, x, labels)
    for g, r in zip(_grads(rule, model, x, labels), explicit):
        assert torch.equal(g, r)


def test_options_round_trip_through_the_config():
    rule = make_rule("fenchel-bp", {"betas": [0.1, 0.05]})
    assert rule.betas == "0.1,0.05"
    opts = json.loads(json.dumps(rule_options(rule)))
    assert make_rule("fenchel-bp", {k: str(v) for k, v in opts.items() if v is not None}).layer_betas(2) == [0.1, 0.05]


@pytest.mark.parametrize("opts, msg", [
    ({"betas": "0.1,x"}, "Invalid betas: '0.1,x'"),
    ({"betas": "0.1,0"}, "Invalid betas: '0.1,0'"),
    ({"betas": "0.1,-1"}, "Invalid betas"),
    ({"betas": "0.1,inf"}, "Invalid betas"),
    ({"betas": "0.1,1e300"}, "Invalid betas"),
    ({"beta": "1e300"}, "Invalid beta: 1e\\+300 .*would leave float32"),   # used to be a RuntimeError traceback
    ({"beta": "1e-300"}, "Invalid beta: 1e-300"),                          # used to give NaN gradients
    ({"beta_ratio": "1e-300"}, "Invalid beta_ratio"),
    ({"betas": ""}, "Invalid betas"),
    ({"betas": 0.1}, "Invalid betas: 0.1"),
    ({"betas": [0.1, "a"]}, "Invalid betas"),
    ({"beta_ratio": "0"}, "Invalid beta_ratio: 0.0"),
    ({"beta_ratio": "x"}, "Invalid value 'x' for option 'beta_ratio'"),
    ({"betas": "0.1,0.1", "beta_ratio": "2"}, "Invalid options: give either betas or beta_ratio"),
])
def test_bad_options(opts, msg):
    with pytest.raises(ValueError, match=msg):
        make_rule("fenchel-bp", opts).backward(MODELS["mlp"](), *_data())


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_wrong_number_of_betas_is_refused_when_the_model_is_seen(model_name):
    model, (x, labels) = MODELS[model_name](), _data()
    for betas in ("0.1,0.1", "0.1,0.1,0.1,0.1"):
        with pytest.raises(ValueError, match=r"Invalid betas: \d values .* for a model with 3 activation layers"):
            make_rule("fenchel-bp", {"betas": betas}).backward(model, x, labels)


def test_models_whose_activation_order_is_unknown_are_refused():
    class Swapped(nn.Module):
        """Activations registered in the opposite order to their use."""

        def __init__(self):
            super().__init__()
            self.act2, self.act1 = nn.Tanh(), nn.Sigmoid()
            self.l1, self.l2, self.l3 = nn.Linear(16, 5), nn.Linear(5, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.l3(self.act2(self.l2(self.act1(self.l1(x)))))

        def inferlearn_chain(self):
            return [self.l1, self.act1, self.l2, self.act2, self.l3]

    x, labels = _data()
    with pytest.raises(ValueError, match="Invalid betas for Swapped: its activation modules are registered in another order"):
        make_rule("fenchel-bp", {"betas": "0.1,0.2"}).backward(Swapped().double(), x, labels)
    make_rule("fenchel-bp", {"beta": 0.1}).backward(Swapped().double(), x, labels)   # one global β is fine

    class NoChain(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.act, self.l2 = nn.Linear(16, 5), nn.Tanh(), nn.Linear(5, 3)

        def forward(self, x):
            return self.l2(self.act(self.l1(x)))

    make_rule("fenchel-bp", {"betas": "0.1"}).backward(NoChain().double(), x, labels)   # read by tracing

    class Untraceable(NoChain):
        def forward(self, x):
            return self.l2(self.act(self.l1(x))) if float(x.sum()) < 1e9 else x

    with pytest.raises(ValueError, match="Invalid betas for Untraceable: layer-wise β needs a model read as a graph"):
        make_rule("fenchel-bp", {"betas": "0.1"}).backward(Untraceable().double(), x, labels)
