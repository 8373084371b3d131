"""A vision transformer for MNIST- and CIFAR-sized images (``--arch vit``), readable as a graph with joint maps.

``patches → tokens (+ class token, + positions) → depth × pre-norm block → LayerNorm → class token or mean →
Linear``, where a block is::

    h ← h + Attention(LayerNorm(h))            (multi-head self-attention, softmax(QKᵀ/√d) V)
    h ← h + W₂ act(W₁ LayerNorm(h))

The inference rules read it by ``torch.fx`` tracing (:mod:`inferlearn.engine.graph.tracing`): value nodes sit
after the patch embedding, after each attention block (the attention is one *joint map* of the residual stream:
``q``, ``k`` and ``v`` meet in a product), after the MLP's activation and after each MLP block. Predictive coding,
ePC, MAC, Fenchel BP and BP train it; the lifted energies refuse the attention by name.

References:
    Dosovitskiy et al., *An image is worth 16x16 words* (ICLR 2021) — the architecture, class token and learned
    positions; Xiong et al., *On layer normalization in the transformer architecture* (ICML 2020) — pre-norm.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .activations import make_activation
from .conv import ImageInput, image_dims
from .init import fill_normal_, generator

TOKEN_POOLS = ("cls", "mean")


class PatchEmbedding(nn.Module):
    """Images (or flat rows) → ``(batch, tokens, width)``: non-overlapping ``patch × patch`` patches projected
    linearly (a strided convolution), a learned class token first (``cls_token``), learned positions added.

    Affine in the image and declared one layer map for the engine (no value node inside)."""

    inferlearn_map = True

    def __init__(self, image_shape: Sequence[int], patch: int, width: int, cls_token: bool):
        super().__init__()
        c, h, w = image_dims(image_shape, "vit")
        if h % patch or w % patch:
            raise ValueError(f"vit: patch={patch} must divide the image's height and width ({h}×{w})")
        self.image = ImageInput(1, (c, h, w))
        self.proj = nn.Conv2d(c, width, patch, stride=patch)
        tokens = (h // patch) * (w // patch) + (1 if cls_token else 0)
        self.cls = nn.Parameter(torch.zeros(1, 1, width)) if cls_token else None
        self.pos = nn.Parameter(torch.zeros(1, tokens, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.proj(self.image(x)).flatten(2).transpose(1, 2)
        if self.cls is not None:
            t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1)
        return t + self.pos


class SelfAttention(nn.Module):
    """Multi-head self-attention ``Attention(h) = W_o concat_i softmax(Q_i K_iᵀ/√d) V_i`` with ``[Q, K, V] = W h``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"vit: heads={heads} must divide width={width}")
        self.heads = heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(h).chunk(3, dim=-1)   # unpacked, so that torch.fx traces it
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class Block(nn.Module):
    """One pre-norm transformer block: attention, then an MLP of ``mlp_ratio × width`` hidden units."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, act: str):
        super().__init__()
        self.ln1, self.att = nn.LayerNorm(width), SelfAttention(width, heads)
        self.ln2, self.fc1 = nn.LayerNorm(width), nn.Linear(width, mlp_ratio * width)
        self.act, self.fc2 = make_activation(act), nn.Linear(mlp_ratio * width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.att(self.ln1(h))
        return h + self.fc2(self.act(self.fc1(self.ln2(h))))


class ViT(nn.Module):
    """A vision transformer (module docstring).

    Args:
        image_shape: ``(C, H, W)`` of one image (inputs are flat rows or images).
        n_classes: outputs.
        depth: transformer blocks.
        width: the token dimension.
        heads: attention heads (dividing ``width``).
        patch: the patch side (dividing the image's height and width).
        pool: ``"cls"`` (the class token's final state) or ``"mean"`` (the mean over tokens).
        mlp_ratio: the MLP's hidden units per token dimension.
        act: the MLP's activation (:data:`~inferlearn.models.activations.ACTIVATIONS`).
        seed: initialisation seed: weights ``N(0, 0.02²)``, biases 0, LayerNorm ``(1, 0)``, class token and positions
            ``N(0, 0.02²)`` (ViT's), drawn in registration order.
    """

    def __init__(self, image_shape: Sequence[int], n_classes: int, depth: int = 4, width: int = 64, heads: int = 4,
                 patch: int = 4, pool: str = "cls", mlp_ratio: int = 2, act: str = "gelu", seed: int | None = 0):
        super().__init__()
        if pool not in TOKEN_POOLS:
            raise ValueError(f"vit: pool={pool!r}; choose one of {', '.join(TOKEN_POOLS)}")
        for name, value in (("depth", depth), ("width", width), ("heads", heads), ("patch", patch),
                            ("mlp_ratio", mlp_ratio), ("n_classes", n_classes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"vit: {name}={value!r} must be a positive integer")
        self.pool = pool
        self.embed = PatchEmbedding(image_shape, patch, width, cls_token=pool == "cls")
        self.blocks = nn.Sequential(*(Block(width, heads, mlp_ratio, act) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, n_classes)
        gen = generator(seed)
        for p_name, p in self.named_parameters():
            if p_name.endswith("bias") or ".ln" in p_name or p_name.startswith("norm."):
                with torch.no_grad():
                    p.fill_(1.0 if p_name.endswith("weight") else 0.0)
            else:
                fill_normal_(p, 0.02, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.blocks(self.embed(x)))
        return self.head(h[:, 0] if self.pool == "cls" else h.mean(1))


def vit(image_shape: Sequence[int], n_classes: int, depth: int = 4, width: int = 64, heads: int = 4, patch: int = 4,
        pool: str = "cls", act: str = "gelu", seed: int | None = 0) -> ViT:
    """A vision transformer (``--arch vit:depth=4,width=64,heads=4,patch=4,pool=cls``; :class:`ViT`): 4 blocks of
    width 64 on 4×4 patches is 0.14M parameters for CIFAR-10 (64 tokens and a class token)."""
    return ViT(image_shape, n_classes, depth, width, heads, patch, pool, 2, act, seed)
