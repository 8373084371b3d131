"""Input transforms of the training loop: per-channel standardisation and crop-and-flip augmentation.

Both work in torch on the flat ``(N, C·H·W)`` rows the models take, viewed as ``(N, C, H, W)``.

**Standardisation** (``--standardize``). With ``μ_c`` and ``σ_c`` the mean and the (population, ``ddof=0``)
standard deviation of channel ``c`` over every image and pixel of the *training split the run fits*
(after ``--val`` and ``--limit-train``; never the validation or test images), every input becomes
``x'_{c,i,j} = (x_{c,i,j} − μ_c) / σ_c``, in the training, validation and test splits alike. It is an affine
map per channel, so applying it once to the stored splits equals applying it to each mini-batch. A
constant channel (``σ_c = 0``) is only centred.

**Augmentation** (``--augment crop-flip``), the CIFAR recipe of He et al. (2016): each training image of a
mini-batch is padded with ``p = 4`` pixels of black (raw value 0, i.e. ``−μ_c/σ_c`` once standardised: the
same as torchvision's ``RandomCrop(32, padding=4)`` before ``Normalize``), an ``H × W`` window is cut at an
offset ``(dy, dx)`` uniform on ``{0, …, 2p}²``, and the window is mirrored left-right with probability ½:

``y_{c,i,j} = x̃_{c, dy+i, dx+j}`` (no flip) or ``x̃_{c, dy+i, dx+W−1−j}`` (flip), ``x̃`` the padded image.

The offsets and flips are drawn, per mini-batch, from one :class:`torch.Generator` on the CPU seeded from the
run's seed, so they do not depend on the device; its state is saved in every checkpoint, so a resumed run
draws what the uninterrupted one would have. Evaluation never augments. Digits are not flip-invariant, so
``crop-flip`` is refused on :data:`MIRROR_SENSITIVE` sets unless given as ``crop-flip:force``.
"""
from __future__ import annotations

import torch

#: ``--standardize`` and ``--augment`` values
STANDARDIZE = ("auto", "on", "off")
AUGMENT = ("none", "crop-flip", "crop-flip:force")
#: ``--augment crop-flip:force``: crop-flip on a data set of :data:`MIRROR_SENSITIVE`, explicitly
FORCE_FLIP = "crop-flip:force"
#: the data sets whose classes a left-right flip does not keep (a mirrored digit is another digit or none): crop-flip
#: is refused on them unless forced
MIRROR_SENSITIVE = ("digits", "mnist")
#: the colour natural-image sets that ``--standardize auto`` standardises (grayscale ``cifar10-gray`` stays raw,
#: as in the lifted paper's Table 4)
COLOUR_SETS = ("cifar10", "cifar100", "tiny-imagenet")
PAD = 4


def resolve_standardize(mode: str, data: str) -> str:
    """``on`` or ``off``: ``auto`` is ``on`` for :data:`COLOUR_SETS`, ``off`` elsewhere."""
    if mode not in STANDARDIZE:
        raise ValueError(f"Unknown standardize mode {mode!r}; choose one of {list(STANDARDIZE)}")
    if mode == "auto":
        return "on" if data in COLOUR_SETS else "off"
    return mode


def channel_stats(x: torch.Tensor, image_shape: tuple, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and population standard deviation of flat images ``x`` (N, C·H·W), in float64.

    Two passes over chunks of ``chunk`` rows (the mean, then the squared deviations from it), so no float64
    copy of the whole split is made (Tiny ImageNet's would take 10 GB).

    Returns:
        ``(mean, std)``, each of shape ``(C,)``; a zero standard deviation is returned as 1 (the channel is
        then only centred).
    """
    c = image_shape[0]
    per = x.shape[1] // c
    count = x.shape[0] * per

    def total(f):
        acc = torch.zeros(c, dtype=torch.float64)
        for i in range(0, x.shape[0], chunk):
            v = x[i:i + chunk].detach().to(torch.float64).reshape(-1, c, per)
            acc += f(v).sum(dim=(0, 2)).cpu()
        return acc

    mean = total(lambda v: v) / count
    std = (total(lambda v: (v - mean.to(v.device)[None, :, None]) ** 2) / count).sqrt()
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def standardize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, image_shape: tuple) -> torch.Tensor:
    """``(x − μ_c) / σ_c`` per channel of flat images ``x`` (a new tensor of ``x``'s dtype and device)."""
    c = image_shape[0]
    m = mean.to(x.device, x.dtype).reshape(1, c, 1)
    s = std.to(x.device, x.dtype).reshape(1, c, 1)
    return ((x.reshape(x.shape[0], c, -1) - m) / s).reshape(x.shape)


class CropFlip:
    """Random ``PAD``-pixel crop and horizontal flip of flat image rows (module docstring).

    Args:
        image_shape: ``(C, H, W)`` of one row.
        seed: seeds the generator (a function of the run's seed).
        fill: per-channel padding value ``(C,)`` (the standardised black; zeros for raw pixels).
    """

    def __init__(self, image_shape: tuple, seed: int, fill: torch.Tensor | None = None, pad: int = PAD):
        if len(image_shape) != 3:
            raise ValueError(f"--augment crop-flip needs images (C, H, W); the data has shape {image_shape}")
        self.shape, self.pad = tuple(int(s) for s in image_shape), pad
        self.fill = torch.zeros(self.shape[0], dtype=torch.float64) if fill is None else fill.detach().to(torch.float64)
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dy, dx, flip)`` for ``n`` images: offsets in ``0 … 2·pad`` and a boolean per image."""
        offsets = torch.randint(0, 2 * self.pad + 1, (2, n), generator=self.generator)
        flip = torch.rand(n, generator=self.generator) < 0.5
        return offsets[0], offsets[1], flip

    def apply(self, x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
        """Crop each row ``k`` of ``x`` at ``(dy[k], dx[k])`` of its padded image and mirror it where ``flip[k]``."""
        c, h, w = self.shape
        p, n, dev = self.pad, x.shape[0], x.device
        padded = self.fill.to(dev, x.dtype)[None, :, None, None].expand(n, c, h + 2 * p, w + 2 * p).clone()
        padded[:, :, p:p + h, p:p + w] = x.reshape(n, c, h, w)
        rows = dy.to(dev)[:, None] + torch.arange(h, device=dev)                  # (n, H)
        cols = dx.to(dev)[:, None] + torch.arange(w, device=dev)                  # (n, W)
        cols = torch.where(flip.to(dev)[:, None], cols.flip(1), cols)
        k = torch.arange(n, device=dev)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[k, rows[:, :, None], cols[:, None, :]]   # (n, H, W, C)
        return out.permute(0, 3, 1, 2).reshape(n, -1)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
