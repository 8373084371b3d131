"""Small helpers shared by the oracle tests and by the scripts the distributed tests launch."""
from __future__ import annotations

import json
import os
import sys

import torch


def random_batch(n_in: int, n_out: int, b: int, seed: int = 0, dtype=torch.float64):
    """``b`` standard-normal inputs of width ``n_in`` and uniform labels in ``[0, n_out)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, n_in, generator=gen, dtype=dtype), torch.randint(0, n_out, (b,), generator=gen)


def relative_error(g: dict, ref: dict) -> float:
    """``‖g − ref‖ / ‖ref‖`` over all the entries of two dicts of tensors (the keys of ``ref``)."""
    num = sum(float((g[k] - ref[k]).pow(2).sum()) for k in ref) ** 0.5
    return num / sum(float(ref[k].pow(2).sum()) for k in ref) ** 0.5


def finish_worker(group, errors: dict, out: str) -> None:
    """End a launched test worker: rank 0 writes ``errors`` as JSON to ``out``; then leave at once."""
    if group.is_main:
        with open(out, "w") as f:
            json.dump(errors, f)
    group.close()
    sys.stdout.flush()
    os._exit(0)   # skip the gloo group's destructor, which races with peers that have exited


def assert_same_tree(a, b, path: str = "checkpoint", skip: frozenset = frozenset()) -> int:
    """Assert that two nested checkpoints (dicts, lists, tensors, numbers) are equal, every tensor bit for
    bit; keys in ``skip`` (e.g. timings) are ignored. Returns the number of tensors compared."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path} differs (max |diff| {float((a.double() - b.double()).abs().max()):.3g})"
        return 1
    if isinstance(a, dict):
        assert isinstance(b, dict), path
        ka, kb = set(a) - skip, set(b) - skip
        assert ka == kb, f"{path}: keys {sorted(map(str, ka ^ kb))} in one only"
        return sum(assert_same_tree(a[k], b[k], f"{path}[{k!r}]", skip) for k in ka)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        return sum(assert_same_tree(x, y, f"{path}[{i}]", skip) for i, (x, y) in enumerate(zip(a, b)))
    assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"
    return 0
