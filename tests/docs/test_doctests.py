"""Every ``>>>`` example in ``src`` runs and prints what it says (doctest), so a docstring's example cannot rot."""
import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MODULES = sorted(".".join(p.relative_to(SRC).with_suffix("").parts) for p in (SRC / "inferlearn").rglob("*.py")
                 if ">>> " in p.read_text())


def test_the_examples_are_found():
    assert {"inferlearn.tensors", "inferlearn.diagnostics", "inferlearn.rules.base", "inferlearn.bilevel.layer",
            "inferlearn.engine.graph.reader", "inferlearn.admm.trainer"} <= set(MODULES)   # the public entry points


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
