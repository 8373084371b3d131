"""A learning rule inside a PyTorch Lightning module: predictive coding (or any registered rule) with manual
optimisation.

A rule fills ``.grad`` of the model (``rule.backward(model, x, labels)``) instead of ``loss.backward()``, so the
module turns Lightning's automatic optimisation off and steps its optimiser itself; everything else (the trainer,
its loop, logging, callbacks, devices) is Lightning's. The rule's ``StepInfo`` gives the loss and the forward
output to log.

Run:  python examples/lightning_pc.py                     # digits (ships with scikit-learn), 3 epochs
      python examples/lightning_pc.py --rule epc --epochs 1
Needs ``pip install lightning`` (not a dependency of inferlearn).
"""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from inferlearn.data import load_dataset
from inferlearn.rules import make_rule


class RuleModule(L.LightningModule):
    """A model trained by an inference-learning rule: ``training_step`` is the rule's step and an optimiser step."""

    def __init__(self, model: nn.Module, rule: str = "pc", options: dict | None = None, lr: float = 1e-3):
        super().__init__()
        self.model, self.rule, self.lr = model, make_rule(rule, options or {}), lr
        self.automatic_optimization = False   # the rule fills .grad; this module steps the optimiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, labels = batch
        opt = self.optimizers()
        opt.zero_grad()
        info = self.rule.backward(self.model, x, labels)
        opt.step()
        self.log("train_loss", info.loss, prog_bar=True)
        self.log("train_acc", (info.output.argmax(1) == labels).float().mean(), prog_bar=True)

    def validation_step(self, batch, batch_idx):
        x, labels = batch
        self.log("val_acc", (self.model(x).argmax(1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)


def loaders(batch_size: int = 64, limit: int | None = None):
    """Digits (8×8 images, 10 classes) as training and test loaders."""
    data = load_dataset("digits")
    train = TensorDataset(data.train_x[:limit], data.train_y[:limit])
    test = TensorDataset(data.test_x, data.test_y)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)),
            DataLoader(test, batch_size=256))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rule", default="pc")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="training images used")
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    train, test = loaders(limit=args.limit)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_model_summary=False)
    module = RuleModule(model, args.rule)
    trainer.fit(module, train, test)
    print(f"{args.rule}: validation accuracy {float(trainer.callback_metrics['val_acc']):.4f}")


if __name__ == "__main__":
    main()
