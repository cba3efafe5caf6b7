#!/usr/bin/env python3
"""Golden file of Lightning's learning-rate finder (`Tuner.lr_find`), for
`crates/redline-train/tests/tune.rs`: the rate of each step, the raw loss of
each step (recorded beside Lightning's own callback), Lightning's smoothed
losses, where it stopped, and its suggestion. Redline's range test must give
the same rates, the same smoothed losses from the same raw losses, stop at
the same step and suggest the same point.

    ~/.venvs/redline-ref/bin/pip install torch lightning
    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_lr_finder.py

(made with lightning 2.6.6, torch 2.15.0, CPU)
"""

import json
import os

import lightning as L
import torch
from lightning.pytorch.tuner import Tuner

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../testdata/golden/lr_finder.json")


class Net(L.LightningModule):
    def __init__(self, lr):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        self.raw = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.raw.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def case(name, min_lr, max_lr, num_training, seed):
    torch.manual_seed(seed)
    x = torch.randn(4096, 8)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model = Net(1e-3)
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )
    finder = Tuner(trainer).lr_find(model, train_dataloaders=dl, min_lr=min_lr, max_lr=max_lr,
                                    num_training=num_training)
    lrs, losses = finder.results["lr"], finder.results["loss"]
    return {
        "name": name,
        "min_lr": min_lr,
        "max_lr": max_lr,
        "num_training": num_training,
        "lr": lrs,
        "raw_loss": model.raw[: len(losses)],
        "smoothed_loss": losses,
        "suggestion": finder.suggestion(),
        "suggestion_index": finder._optimal_idx,
    }


cases = [
    case("sgd-1e-6-to-10", 1e-6, 10.0, 100, 0),
    case("sgd-1e-5-to-1-short", 1e-5, 1.0, 40, 1),
    case("sgd-1e-4-to-100-diverges", 1e-4, 100.0, 200, 2),
]
with open(OUT, "w") as f:
    json.dump({"lightning": L.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
for c in cases:
    print(c["name"], len(c["lr"]), "steps, suggestion", c["suggestion"])
