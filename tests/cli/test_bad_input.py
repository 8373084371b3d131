"""Bad inputs give clear errors, from the library and from the CLI."""
import pytest
import torch

from inferlearn.cli import main
from inferlearn.models import MLP
from inferlearn.rules import RULES, make_rule


@pytest.mark.parametrize("name", sorted(RULES))
def test_wrong_input_width(name):
    rule = make_rule(name)
    model = MLP([6, 5, 3])
    with pytest.raises(ValueError, match=r"Expected input of shape \(batch, 6\)"):
        rule.backward(model, torch.rand(4, 7), torch.tensor([0, 1, 2, 0]))


@pytest.mark.parametrize("name", sorted(RULES))
def test_labels_out_of_range(name):
    rule = make_rule(name)
    model = MLP([6, 5, 3])
    with pytest.raises(ValueError, match="Labels out of range"):
        rule.backward(model, torch.rand(4, 6), torch.tensor([0, 1, 3, 0]))


@pytest.mark.parametrize("name", sorted(RULES))
def test_nan_input(name):
    rule = make_rule(name)
    model = MLP([6, 5, 3])
    x = torch.rand(4, 6)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        rule.backward(model, x, torch.tensor([0, 1, 2, 0]))


def test_unknown_rule_and_option():
    with pytest.raises(ValueError, match="Unknown rule 'foo'"):
        make_rule("foo")
    with pytest.raises(ValueError, match="Unknown option 'gama' for rule 'backprop'"):
        make_rule("backprop", {"gama": "1"})


def test_unknown_units():
    with pytest.raises(ValueError, match="Unknown unit type 'sigmoidish'"):
        MLP("4-3-2", "sigmoidish")


@pytest.mark.parametrize("argv, msg", [
    (["train", "--data", "digits", "--arch", "64-10", "--lr", "-1"], "Invalid learning rate: -1.0"),
    (["train", "--data", "nope", "--arch", "64-10"], "Unknown dataset 'nope'"),
    (["train", "--data", "digits", "--arch", "64-10", "--rule", "magic"], "Unknown rule 'magic'"),
    (["train", "--data", "digits", "--arch", "64-8-10", "--act", "soft"], "Unknown unit type 'soft'"),
    (["compare", "--data", "digits", "--arch", "64-10", "--rule-opt", "bogus"], "Invalid rule option"),
])
def test_cli_errors_are_clear(argv, msg, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(RULES))
def test_empty_batch_is_refused(name):
    """An empty batch used to give NaN, a RuntimeError or a ZeroDivisionError depending on the rule."""
    with pytest.raises(ValueError, match="non-empty batch"):
        make_rule(name).backward(MLP([6, 5, 3]), torch.rand(0, 6), torch.zeros(0, dtype=torch.long))


# ---- the Python API cases of issue 22: each one clear ValueError, never a raw torch error ---------------------
@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_or_bool_inputs_are_refused(name, dtype):
    """Two rules failed in torch.finfo with a TypeError."""
    x = torch.ones(4, 6, dtype=dtype)
    with pytest.raises(ValueError, match=f"Expected floating-point inputs, got {dtype}"):
        make_rule(name).backward(MLP([6, 5, 3]), x, torch.tensor([0, 1, 2, 0]))


@pytest.mark.parametrize("name", sorted(RULES))
def test_labels_as_a_list_are_refused(name):
    with pytest.raises(ValueError, match=r"got list; convert them, e.g. torch.as_tensor\(labels\)"):
        make_rule(name).backward(MLP([6, 5, 3]), torch.rand(4, 6), [0, 1, 2, 0])


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("model", ["frozen", "no parameters"])
def test_a_model_with_nothing_to_learn_is_refused(name, model):
    """PC and MAC failed with "stack expects a non-empty TensorList"; the others did nothing, silently."""
    if model == "frozen":
        net = MLP([6, 5, 3])
        for p in net.parameters():
            p.requires_grad_(False)
    else:
        net = torch.nn.Sequential(torch.nn.AdaptiveAvgPool1d(3))
    with pytest.raises(ValueError, match="has no trainable parameters"):
        make_rule(name).backward(net, torch.rand(4, 6), torch.tensor([0, 1, 2, 0]))


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_non_finite_grad_left_from_before_is_named(name):
    """PC and MAC blamed their step size for a NaN that was in .grad before they ran."""
    model = MLP([6, 5, 3])
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(ValueError, match=r"already holds NaN or inf before the rule ran; call optimizer.zero_grad"):
        make_rule(name).backward(model, torch.rand(4, 6), torch.tensor([0, 1, 2, 0]))


def test_argmin_layer_input_of_the_wrong_width():
    from inferlearn.bilevel import ArgminLayer, Box, LeastSquaresEnergy

    layer = ArgminLayer(LeastSquaresEnergy(torch.randn(5, 3)), Box.nonnegative())
    with pytest.raises(ValueError, match=r"inputs of shapes \(4, 6\) do not fit its energy LeastSquaresEnergy"):
        layer(torch.randn(4, 6))


@pytest.mark.parametrize("name, options", [("contrastive", {"gamma": 1e-81}), ("eqprop", {"gamma": 1e-30, "beta": 1e-20})])
def test_two_phase_signal_below_the_dtype_is_refused(name, options):
    """Found by the options property test: γ^(L-1) below float32's smallest normal gave inf/NaN gradients silently.
    Refused in float32 with the fix; in float64 the same signal is representable and the gradients are finite."""
    x, labels = torch.rand(4, 6), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError, match=r"Invalid gamma: .* underflows float32 .*float64"):
        make_rule(name, options).backward(MLP("6-5-3", "relu", seed=0), x, labels)
    model = MLP("6-5-3", "relu", seed=0).double()
    make_rule(name, options).backward(model, x.double(), labels)   # the differential phases resolve it
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
