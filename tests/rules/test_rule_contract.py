"""The contract every registered rule obeys, on a model zoo (table-driven, like optax's tests).

Models: the library's MLP, a plain ``nn.Sequential`` MLP, a conv net with average pooling, a user
module exposing its chain through the protocol, and three graphs read by torch.fx: a residual conv net,
a branching (concatenation) model and a user module with a residual stream. For each model × rule × {SGD, Adam} × {float32,
float64}: ``.grad`` is filled (finite) for every trainable parameter, the rule never changes
parameters, two calls accumulate, a fixed seed gives the same gradients, and an optimiser step on
the rule's gradient changes the weights. New rules join automatically. Refusals are clear errors.
"""
import copy

import pytest
import torch
from torch import nn

from inferlearn import declare_affine
from inferlearn.models import MLP
from inferlearn.rules import RULES, make_rule
from inferlearn.units import Clamp

from graph_models import GRAPH_MODELS, UserAttention

OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.01), "adam": lambda p: torch.optim.Adam(p, lr=0.01)}


class ProtocolNet(nn.Module):
    """A user module whose forward is not an nn.Sequential: it exposes its chain by the protocol."""

    def __init__(self):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(16, 6), nn.Linear(6, 5), nn.Linear(5, 3)
        self.unit = nn.Hardtanh(0.0, 1.0)   # the hard sigmoid, a box unit
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.out(self.relu(self.hidden(self.unit(self.inp(x)))))

    def inferlearn_chain(self):
        return [self.inp, self.unit, self.hidden, self.relu, self.out]


def conv_net():
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Conv2d(3, 4, 3, padding=1), Clamp("hard-sigmoid"), nn.Flatten(), nn.Linear(16, 5), nn.ReLU(),
                         nn.Linear(5, 3))


ZOO = {
    "mlp": lambda: MLP([16, 5, 5, 3], "relu", seed=3),
    "sequential": lambda: nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 5), nn.Hardtanh(),
                                        nn.Linear(5, 3)),
    "conv": conv_net,
    "protocol": ProtocolNet,
    **GRAPH_MODELS,
}


#: rules with non-default options that change their code paths (PCX's recipes), held to the same contract
VARIANTS = {
    "pc[output=ce,adam]": ("pc", {"output": "ce", "inference_optimizer": "adam"}),
    "pc[momentum]": ("pc", {"inference_optimizer": "momentum"}),
    "pc[nudging=symmetric]": ("pc", {"nudging": "symmetric"}),
    "pc[weight_step=0.1]": ("pc", {"weight_step": 0.1}),
    "eqprop[nudge=loss,ce]": ("eqprop", {"nudge": "loss", "loss": "cross-entropy"}),
}


def _setup(name, model_name, dtype):
    rule = make_rule(*VARIANTS.get(name, (name, {})))
    torch.manual_seed(3)
    model = ZOO[model_name]().to(dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(8, 16, generator=gen, dtype=torch.float64).to(dtype)
    labels = torch.randint(0, 3, (8,), generator=gen)
    return rule, model, x, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("model_name", sorted(ZOO))
@pytest.mark.parametrize("name", sorted(RULES) + [   # the variants' inference is not tuned for the zoo: far warnings
    pytest.param(v, marks=pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")) for v in sorted(VARIANTS)])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_rule_contract(name, opt_name, model_name, dtype):
    """Guards against rules that step themselves, forget a parameter, overwrite instead of accumulate,
    depend on hidden global state, or only work on the library's own MLP."""
    rule, model, x, labels = _setup(name, model_name, dtype)
    before = copy.deepcopy(model.state_dict())
    opt = OPTIMIZERS[opt_name](model.parameters())
    opt.zero_grad(set_to_none=True)
    info = rule.backward(model, x, labels)
    assert info.output.shape == (8, 3)
    assert torch.isfinite(torch.tensor(info.loss))
    for (pname, p) in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert p.grad.dtype == dtype
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient for {pname}"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{name} changed parameter {k}"
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert any(g.abs().sum() > 0 for g in first.values()), f"{name} produced an all-zero gradient"

    rule.backward(model, x, labels)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n], rtol=tol, atol=tol, msg=f"{name} does not accumulate {n}")

    rule2, model2, x2, labels2 = _setup(name, model_name, dtype)
    rule2.backward(model2, x2, labels2)
    for n, p in model2.named_parameters():
        torch.testing.assert_close(p.grad, first[n], rtol=0, atol=0, msg=f"{name} is not deterministic for {n}")

    opt.step()
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _maxpool_sigmoid_net():
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 3, padding=1), nn.Sigmoid(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(12, 3))


@pytest.mark.parametrize("name", ["contrastive", "eqprop", "lifted-j0", "lifted-fenchel", "lpom"])
def test_lifted_rules_refuse_non_affine_maps_and_non_box_units(name):
    """The lifted energies need affine maps and box units: a sigmoid or a max-pooling layer is refused
    with a message naming the module, instead of a silently wrong gradient."""
    rule = make_rule(name)
    x, labels = torch.rand(4, 16), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"activation Sigmoid after '1'.*box units"):
        rule.backward(_maxpool_sigmoid_net(), x, labels)
    net = nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ValueError, match=r"module '3' \(MaxPool2d\): it is not an affine map"):
        rule.backward(net, x, labels)


@pytest.mark.parametrize("name", ["backprop", "fenchel-bp", "pc", "mac"])
def test_differentiable_rules_accept_max_pooling_and_sigmoids(name):
    """Back-propagation, Fenchel BP and predictive coding take any differentiable map and activation."""
    net = _maxpool_sigmoid_net()
    make_rule(name).backward(net, torch.rand(4, 16), torch.tensor([0, 1, 2, 0]))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_declared_affine_module_and_unknown_module():
    """A user's affine module is accepted once declared; an unknown one is refused by name."""

    class Scale(nn.Module):
        def forward(self, x):
            return 2.0 * x

    x, labels = torch.rand(4, 16), torch.tensor([0, 1, 2, 0])
    net = nn.Sequential(nn.Linear(16, 5), nn.ReLU(), Scale(), nn.Linear(5, 3))
    with pytest.raises(ValueError, match=r"Module '2' \(Scale\) is neither a layer map nor a unit"):
        make_rule("contrastive").backward(net, x, labels)
    declare_affine(net[2])
    make_rule("contrastive").backward(net, x, labels)
    assert net[0].weight.grad is not None


def test_chain_structure_errors():
    """Two activations in a row, or a final activation for a lifted rule, are refused clearly."""
    x, labels = torch.rand(4, 16), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match="follows another activation"):
        make_rule("pc").backward(nn.Sequential(nn.Linear(16, 3), nn.ReLU(), nn.ReLU()), x, labels)
    with pytest.raises(ValueError, match="needs a linear output layer"):
        make_rule("contrastive").backward(nn.Sequential(nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU()), x, labels)


def test_lr_scheduler_drives_the_learning_rate():
    """The training loop never writes the learning rate, so a torch.optim.lr_scheduler controls it:
    two epochs of the warm-up schedule run at 0.1 × lr, then 0.3 × lr."""
    from inferlearn.training import TrainConfig, build, run_epoch

    cfg = TrainConfig(data="digits", arch="64-8-10", rule="lifted-j0", epochs=3, lr=0.05, lr_schedule="warmup",
                      limit_train=100)
    s = build(cfg)
    seen = []
    for epoch in range(1, 8):
        seen.append(s.optimizer.param_groups[0]["lr"])
        run_epoch(s, cfg, epoch, progress=False)
    assert seen == pytest.approx([0.005] * 5 + [0.015] * 2)


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_rules_options_cannot_be_set_after_it_is_built(name):
    """Guards against ``rule.tol = 1e-8`` silently ignored (the solver was built from the old value): every
    registered rule refuses it by name, and ``dataclasses.replace`` builds the changed rule."""
    import dataclasses

    rule = make_rule(name, {})
    fields = dataclasses.fields(rule)
    assert fields
    for f in fields:
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"{type(rule).__name__}.{f.name}"):
            setattr(rule, f.name, getattr(rule, f.name))
    if any(f.name == "tol" for f in fields):
        changed = dataclasses.replace(rule, tol=1e-8)
        solver = getattr(changed, "_solver", None)
        assert changed.tol == 1e-8 and (solver is None or getattr(solver, "tol", 1e-8) == 1e-8)


def _zoo(arch):
    from inferlearn.models.zoo import build_zoo_model
    return lambda: build_zoo_model(arch, (1, 4, 4), 3, seed=3)


#: models with nodes of several inputs or batch-coupled layers, and the rules that must take them
COUPLED_ZOO = {
    "vit": (_zoo("vit:depth=1,width=8,heads=2,patch=2,pool=cls,act=gelu"), {"backprop", "fenchel-bp", "pc", "epc", "mac"}),
    "resnet18:bn=train": (_zoo("resnet18:width=1/32,bn=train"), {"backprop", "pc", "epc"}),
    "user-attention": (UserAttention, {"backprop", "fenchel-bp", "pc", "epc", "mac"}),
}


@pytest.mark.filterwarnings("ignore::inferlearn.errors.ConvergenceWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("model_name", sorted(COUPLED_ZOO))
@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_rule_contract_on_attention_and_batchnorm_in_training_mode(name, opt_name, model_name, dtype):
    """Every rule on a transformer, a user's attention block and a ResNet with BatchNorm in training mode: the
    contract (as above, on the parameters: BatchNorm's running statistics move, as back-propagation's do), or a
    refusal in one line; the rules that read such models must not refuse them."""
    make, takes = COUPLED_ZOO[model_name]
    torch.manual_seed(3)
    model = make().to(dtype).train()
    gen = torch.Generator().manual_seed(0)
    x, labels = torch.rand(8, 16, generator=gen, dtype=torch.float64).to(dtype), torch.randint(0, 3, (8,), generator=gen)
    rule = make_rule(name)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = OPTIMIZERS[opt_name](model.parameters())
    opt.zero_grad(set_to_none=True)
    try:
        rule.backward(model, x, labels)
    except ValueError as exc:
        assert name not in takes, f"{name} refused {model_name}: {exc}"
        assert "\n" not in str(exc)
        return
    assert name in takes or name in ("fenchel-bp",), f"{name} took {model_name}"
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == dtype and torch.isfinite(p.grad).all(), (name, n)
        assert torch.equal(p, before[n]), f"{name} changed {n}"
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert any(g.abs().sum() > 0 for g in first.values())
    rule.backward(model, x, labels)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n], rtol=tol, atol=tol, msg=f"{name} does not accumulate {n}")
    opt.step()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
