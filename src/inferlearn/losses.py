"""Output losses and target encodings.

The lifted-network paper trains with the quadratic loss ``½‖f(x) − y‖²`` on one-hot targets
(docs/maths.md §A), which is what the clamped energy's last term is. Losses here are means over the batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LOSSES = ("quadratic", "cross-entropy")


def check_labels(labels: torch.Tensor, n_classes: int | None, batch: int | None = None) -> None:
    """Raise ``ValueError`` unless ``labels`` is a 1-D integer tensor with values in ``[0, n_classes)``
    (only ``≥ 0`` when ``n_classes`` is ``None``)."""
    if not torch.is_tensor(labels):
        raise ValueError(f"Expected a 1-D integer tensor of class labels, got {type(labels).__name__}; convert them, "
                         "e.g. torch.as_tensor(labels)")
    if labels.dim() != 1 or labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"Expected a 1-D integer tensor of class labels, got shape {tuple(labels.shape)} dtype {labels.dtype}")
    if batch is not None and labels.shape[0] != batch:
        raise ValueError(f"Got {labels.shape[0]} labels for a batch of {batch} inputs")
    if labels.numel() and (int(labels.min()) < 0 or (n_classes is not None and int(labels.max()) >= n_classes)):
        raise ValueError(f"Labels out of range: found values in [{int(labels.min())}, {int(labels.max())}], "
                         f"the network has {n_classes} outputs")


def one_hot(labels: torch.Tensor, n_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One-hot targets ``y`` (batch, n_classes) for integer labels (``ValueError`` for a label ≥ n_classes)."""
    if labels.numel() and int(labels.max()) >= n_classes:
        raise ValueError(f"Labels out of range: found label {int(labels.max())}, the network has {n_classes} outputs")
    return F.one_hot(labels.long(), n_classes).to(dtype)


def quadratic_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``½‖output − target‖²``."""
    return 0.5 * (output - target).pow(2).sum(dim=1).mean()


def output_loss(name: str, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The named loss (``quadratic`` on one-hot targets, or ``cross-entropy``), batch mean."""
    if name == "quadratic":
        return quadratic_loss(output, one_hot(labels, output.shape[1], output.dtype))
    if name == "cross-entropy":
        return F.cross_entropy(output, labels.long())
    raise ValueError(f"Unknown loss {name!r}; choose one of {list(LOSSES)}")


def loss_and_gradient(name: str, output: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch-mean loss and its *per-sample* gradient ``g_i = ∂ℓ(z_i, y_i)/∂z_i`` at the output.

    ``quadratic``: ``g = z − y``; ``cross-entropy``: ``g = softmax(z) − y`` (one-hot ``y``). Checks the
    labels against the output width.
    """
    check_labels(labels, output.shape[1], batch=output.shape[0])
    y = one_hot(labels, output.shape[1], output.dtype)
    if name == "quadratic":
        return quadratic_loss(output, y), output - y
    if name == "cross-entropy":
        return F.cross_entropy(output, labels.long()), torch.softmax(output, dim=1) - y
    raise ValueError(f"Unknown loss {name!r}; choose one of {list(LOSSES)}")


def check_loss(name: str) -> str:
    """Raise ``ValueError`` for an unknown loss name."""
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; choose one of {list(LOSSES)}")
    return name
