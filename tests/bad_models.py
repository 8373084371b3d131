"""Model builders that are wrong in the ways a user's can be (``--arch bad_models:NAME``), for the bad-input
tables: each must be refused in one line that says it is the model."""
import torch
from torch import nn


def raising():
    raise RuntimeError("my builder is broken")


class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        raise KeyError("my forward is broken")


def forward_raises():
    return _Raises()


def wrong_width():
    return nn.Sequential(nn.Linear(100, 16), nn.ReLU(), nn.Linear(16, 10))


def wrong_outputs():
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 7))


def on_meta():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def frozen():
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def no_parameters():
    return nn.Sequential(nn.Flatten(), nn.AdaptiveAvgPool1d(10))   # (batch, 64) -> (batch, 10), nothing to learn


def strided_1x1_channels_last():
    """A strided 1×1 convolution on 3 channels after a 3×3 one, all channels-last: oneDNN's faulty kernel (NCHW is
    right)."""
    return nn.Sequential(nn.Unflatten(1, (3, 8, 8)), nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 6, 1, stride=2),
                         nn.Flatten(), nn.Linear(6 * 4 * 4, 10)).to(memory_format=torch.channels_last)


def strided_1x1_channels_last_gray():
    """The same on one input channel, whose 3×3 kernel is contiguous in both layouts (only its strides tell)."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 8, 1, stride=2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 10)).to(memory_format=torch.channels_last)
