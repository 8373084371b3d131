"""Every code block of the README and the docs runs: each ```python block is executed (on small generated data
that its page's prelude below provides, in a temporary folder), each other block is marked as what it is (a shell
command: ```bash; a file layout or output: ```text; a file: ```json)."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from inferlearn.errors import ConvergenceWarning

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
KINDS = {"python", "bash", "text", "json"}

#: what every page's blocks may use: a small MLP and rule, MNIST-shaped random data, a loader of one batch
COMMON = """
import torch
from torch import nn
from inferlearn.losses import one_hot
from inferlearn.models import MLP
from inferlearn.rules import make_rule
torch.manual_seed(0)
x, labels = torch.rand(16, 784), torch.randint(0, 10, (16,))
y = one_hot(labels, 10)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, labels), batch_size=16)
model = MLP("784-16-10", "relu")
rule = make_rule("pc", {"steps": 3})
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
n_train, epochs, batches, checkpoint = 16, 1, [torch.arange(16)], {}
"""
#: a page's own names, after COMMON
PRELUDES = {
    "docs/concepts/rule-contract.md": "rule = make_rule('mac')\n",
    "docs/papers/admm.md": "x_train, y_train = torch.rand(32, 1, 28, 28), torch.randint(0, 10, (32,))\n"
                           "x_test, y_test = x_train[:8], y_train[:8]\n",
    "docs/tutorials/admm-nmf.md": "train_x, train_y = torch.rand(32, 64), torch.randint(0, 10, (32,))\n"
                                  "test_x, test_y = train_x[:8], train_y[:8]\n",
    "docs/tutorials/argmin-layer.md": "x = torch.rand(8, 64)\nlabels = labels[:8]\n",
    "docs/papers/bilevel.md": "from inferlearn.bilevel import Box, ProximalEnergy\nD0 = 0.3 * torch.rand(64, 24)\n"
                              "energy, box = ProximalEnergy(), Box(0, 1)\nQ, c = 2 * torch.eye(3), torch.rand(4, 3)\n"
                              "A, b, r = torch.eye(3), torch.ones(1, 3), torch.tensor([[2.0]])\n",
}


def _blocks():
    for page in PAGES:
        for i, m in enumerate(BLOCK.finditer(page.read_text())):
            yield pytest.param(page.relative_to(ROOT).as_posix(), m.group(1), m.group(2),
                               id=f"{page.relative_to(ROOT).as_posix()}#{i}")


@pytest.mark.parametrize("page, kind, code", list(_blocks()))
def test_every_code_block_runs_or_is_marked(page, kind, code, tmp_path, monkeypatch):
    assert kind in KINDS, f"{page}: a code block marked {kind or 'nothing'!r}; mark it python (it runs here), " \
                          "bash, text or json"
    if kind != "python":
        return
    if "import lightning" in code:
        pytest.importorskip("lightning")   # not a dependency of inferlearn
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():   # tiny data: a rule may say its inference is far from equilibrium; docs run
        warnings.simplefilter("ignore", ConvergenceWarning)   # with every other warning an error (a stale name's)
        exec(compile(COMMON + PRELUDES.get(page, ""), "prelude", "exec"), namespace)
        exec(compile(code, page, "exec"), namespace)


def test_the_block_reader_sees_every_page_with_code():
    pages = {p for p, _, _ in (param.values for param in _blocks())}
    assert "README.md" in pages and "docs/tutorials/pc-conv.md" in pages and len(pages) >= 10
