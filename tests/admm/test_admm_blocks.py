"""Splitting networks into blocks: exact module sharing, shapes, and clear errors for bad splits."""
import pytest
import torch
from torch import nn

from inferlearn.admm.blocks import check_blocks, conv_net, default_split_points, forward_blocks, mlp, split_sequential


def test_split_shares_modules_and_forward_matches():
    """Guards against blocks that copy modules (training them would not train the user's net) or
    reorder/drop layers (the block forward pass would differ from the network's)."""
    net = conv_net(seed=0)
    blocks = split_sequential(net, [3, 6])
    assert [len(b) for b in blocks] == [3, 3, 2]
    assert default_split_points(net) == [2, 5]
    assert blocks[0][0] is net[0]
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(forward_blocks(blocks, x), net(x), rtol=0, atol=0)
    assert check_blocks(blocks, (1, 28, 28)) == [(16, 14, 14), (32, 7, 7), (10,)]


def test_default_split_points():
    """Default splits put the decoupling variables at pre-activations (unconstrained range) and keep a
    pool with its conv; guards against splits after a ReLU/sigmoid (targets out of the block's range)."""
    assert default_split_points(mlp("784-32-32-10")) == [2, 4]
    assert default_split_points(conv_net()) == [2, 5]
    assert default_split_points([nn.Linear(3, 3), nn.Sigmoid()]) == []  # a trailing activation stays


@pytest.mark.parametrize("points, msg", [([0], "Invalid split point 0"), ([6], "Invalid split point 6"),
                                         ([3, 2], "strictly increasing"), ([2, 2], "strictly increasing"),
                                         ([1], "no trainable parameters")])
def test_bad_split_points(points, msg):
    """Guards against silently accepting split points that do not match the model."""
    with pytest.raises(ValueError, match=msg):
        split_sequential(mlp("8-4-4-2"), points)  # modules: Flatten, Lin, ReLU, Lin, ReLU, Lin


def test_mismatched_block_shapes():
    """Guards against a shape error surfacing deep inside training instead of naming the block."""
    blocks = [nn.Sequential(nn.Linear(8, 4), nn.ReLU()), nn.Linear(5, 2)]
    with pytest.raises(ValueError, match=r"Block 2 .*output of block 1.*\(4,\)"):
        check_blocks(blocks, (8,))
