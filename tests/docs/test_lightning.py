"""A rule inside a PyTorch Lightning module (``examples/lightning_pc.py``, manual optimisation) trains exactly as the
plain loop does: the oracle is the same rule, optimiser and batches in a for-loop. Skipped where Lightning is not
installed (it is not a dependency of inferlearn: ``pip install lightning``)."""
import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from lightning_pc import RuleModule, loaders  # noqa: E402

from inferlearn.rules import make_rule  # noqa: E402


@pytest.mark.parametrize("rule", ["pc", "epc", "backprop"])
def test_a_rule_in_a_lightning_module_trains_as_the_plain_loop(rule):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    plain = copy.deepcopy(model)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0)
    train, _ = loaders(batch_size=64, limit=256)
    trainer.fit(RuleModule(model, rule, lr=1e-3), train)

    r = make_rule(rule, {})
    opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    train, _ = loaders(batch_size=64, limit=256)   # the same seeded order
    for x, labels in train:
        opt.zero_grad()
        r.backward(plain, x, labels)
        opt.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert trainer.global_step == 4 and torch.isfinite(trainer.callback_metrics["train_loss"])
