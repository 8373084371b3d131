"""Every example script (the tutorials' code) runs end to end at a small size, so the documentation
cannot rot: a renamed function or a changed default breaks this test, not a reader's first try."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = {
    "pc_conv.py": ["--data", "digits", "--epochs", "1", "--limit", "200"],
    "pc_resnet.py": ["--data", "digits", "--epochs", "1", "--limit", "200"],
    "admm_nmf.py": ["--epochs", "1"],
    "nnls_layer.py": ["--epochs", "1"],
    "bilevel_ridge.py": [],
    "lightning_pc.py": ["--epochs", "1", "--limit", "200"],
}
#: examples that need a package inferlearn does not depend on
NEEDS = {"lightning_pc.py": "lightning"}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_example_runs(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    res = subprocess.run([sys.executable, str(EXAMPLES / name), *SMALL[name]], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip()
