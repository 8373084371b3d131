"""Shared fixtures. Tests run on CPU in float64 where they compare against an oracle."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def mnist_dir():
    """The offline MNIST copy (``../shared/data``) or ``$INFERLEARN_DATA``; skip when neither has it."""
    from inferlearn.data import locate

    for root in (os.environ.get("INFERLEARN_DATA"), SHARED_DATA):
        if root and locate("mnist", root)[0]:
            return str(root)
    pytest.skip("MNIST files not available offline (set INFERLEARN_DATA)")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep tests away from the user's cache so resolution-order tests are reproducible."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    from inferlearn.data.datasets import _load_cached

    _load_cached.cache_clear()
    yield
    _load_cached.cache_clear()
