"""The one box type (unit sets of the lifted engine = constraint sets of the argmin layer) and the
modules the chain parser reads as units. Oracles: torch.clamp and the definitions."""
import math

import pytest
import torch
from torch import nn

from inferlearn.bilevel import Box as BilevelBox
from inferlearn.units import (HARD_SIGMOID, HARD_TANH, LINEAR, RELU, Box, Clamp, box, get_units,
                              units_of_module)


def test_one_type_for_lifted_units_and_argmin_constraints():
    """Guards against two drifting implementations of the same projection."""
    assert Box is Box and BilevelBox is Box
    assert Box.nonnegative() is RELU and get_units("hardsigmoid") is HARD_SIGMOID
    assert Box(0.0, None).lower == 0.0 and math.isinf(Box(0.0, None).upper)
    a = torch.linspace(-3, 3, 13)
    for u, lo, hi in [(RELU, 0, None), (HARD_SIGMOID, 0, 1), (HARD_TANH, -1, 1)]:
        torch.testing.assert_close(u.project(a), a.clamp(min=lo, max=hi))
    assert torch.equal(LINEAR.project(a), a)


def test_tensor_bounds_project_per_coordinate_and_bad_boxes_are_refused():
    lo, hi = torch.tensor([0.0, -1.0, 2.0]), torch.tensor([1.0, 1.0, 5.0])
    box = Box(lo, hi)
    z = torch.tensor([[-5.0, 0.5, 9.0], [0.5, -2.0, 3.0]])
    torch.testing.assert_close(box.project(z), torch.max(torch.min(z, hi), lo))
    with pytest.raises(ValueError, match="lower bound must be < its upper bound"):
        Box(torch.tensor([1.0]), torch.tensor([0.0]))
    with pytest.raises(ValueError):
        Box(1.0, 1.0)


@pytest.mark.parametrize("module,expected", [
    (nn.ReLU(), RELU), (nn.Hardtanh(0.0, 1.0), HARD_SIGMOID), (nn.Hardtanh(), HARD_TANH), (nn.Identity(), LINEAR),
    (Clamp("hard-sigmoid"), HARD_SIGMOID), (nn.Hardsigmoid(), None), (nn.Sigmoid(), None)])
def test_units_of_module(module, expected):
    """nn.Hardsigmoid is clamp(a/6 + 1/2, 0, 1), not a box projection: it must not be read as one."""
    assert units_of_module(module) == expected


def test_relu6_is_the_box_zero_six():
    u = units_of_module(nn.ReLU6())
    assert (u.lower, u.upper) == (0.0, 6.0)
    a = torch.linspace(-8, 8, 17)
    torch.testing.assert_close(u.project(a), nn.ReLU6()(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("units", ["relu", "hard-sigmoid", "hard-tanh", box(-0.3, 0.7)])
def test_project_has_torch_clamps_values_and_gradient_exactly_at_and_next_to_the_bounds(units, dtype):
    """``Box.project`` differentiates through its own backward (ReLU's kernel with a threshold one number below the
    bound): against ``torch.clamp``'s autograd, values and gradients equal bit for bit, on points exactly at each
    bound, one representable number either side of it, and random points; also differentiated twice."""
    u = get_units(units)
    lo, hi = u.clamp_bounds(torch.zeros((), dtype=dtype))
    pts = [torch.randn(200, generator=torch.Generator().manual_seed(0), dtype=dtype) * 2]
    for b in (lo, hi):
        if b is not None:
            t = torch.tensor([b], dtype=dtype)
            pts += [t, torch.nextafter(t, t - 1), torch.nextafter(t, t + 1)]
    a = torch.cat(pts).requires_grad_(True)
    g = torch.rand(a.shape, generator=torch.Generator().manual_seed(1), dtype=dtype) + 0.5
    out = u.project(a)
    (ga,) = torch.autograd.grad(out, a, g, create_graph=True)
    ref = a.clamp(min=lo, max=hi)
    (gr,) = torch.autograd.grad(ref, a, g, create_graph=True)
    assert torch.equal(out, ref) and torch.equal(ga, gr)
    assert ga.requires_grad   # differentiable again (zero almost everywhere, as the clamp's)
    with torch.no_grad():
        assert torch.equal(u.project(a), ref)
