"""Shared fixtures. Tests run on CPU in float64 where they compare against an oracle."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
#: read once at start: the autouse fixture below removes the variable so that tests see a clean search path.
ENV_DATA = os.environ.get("INFERLEARN_DATA")


@pytest.fixture
def mnist_dir():
    """The offline MNIST copy (``../shared/data``) or ``$INFERLEARN_DATA``; skip when neither has it."""
    from inferlearn.data import locate

    for root in (ENV_DATA, SHARED_DATA):
        if root and locate("mnist", root)[0]:
            return str(root)
    pytest.skip("MNIST files not available offline (set INFERLEARN_DATA)")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep tests away from the user's cache and $INFERLEARN_DATA so resolution-order tests are reproducible."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("INFERLEARN_DATA", raising=False)
    from inferlearn.data.datasets import _load_cached

    _load_cached.cache_clear()
    yield
    _load_cached.cache_clear()
