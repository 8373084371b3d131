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
