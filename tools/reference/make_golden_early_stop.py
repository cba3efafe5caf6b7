#!/usr/bin/env python3
"""Golden file of Lightning's `EarlyStopping` decisions, for
`crates/redline-train/src/early_stop.rs`: for each metric sequence and
setting, the epoch (1-based) at which Lightning's callback says stop, or
null. The callback's own criterion (`_evaluate_stopping_criteria`) is fed
one value per epoch, as its `on_validation_end` does.

    ~/.venvs/redline-ref/bin/pip install torch lightning
    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_early_stop.py

(made with lightning 2.6.6, torch 2.15.0)
"""

import json
import math
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../testdata/golden/early_stop.json")

SEQUENCES = {
    "falls-then-flat": [1.0, 0.9, 0.95, 0.91, 0.92, 0.93, 0.94],
    "slow-creep": [1.0, 0.95, 0.92, 0.91, 0.905, 0.9, 0.899, 0.898],
    "restart": [1.0, 0.95, 0.85, 0.84, 0.83, 0.86, 0.9, 0.95],
    "rises": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    "accuracy": [0.5, 0.6, 0.65, 0.64, 0.66, 0.66, 0.659, 0.65, 0.6],
    "nan": [1.0, 0.9, float("nan"), 0.8],
    "inf": [1.0, float("inf"), 0.8],
    "equal": [1.0, 1.0, 1.0, 1.0, 1.0],
}
SETTINGS = [
    ("min", 3, 0.0),
    ("min", 1, 0.0),
    ("min", 2, 0.1),
    ("min", 2, 0.01),
    ("max", 2, 0.0),
    ("max", 3, 0.005),
]

cases = []
for name, seq in SEQUENCES.items():
    for mode, patience, min_delta in SETTINGS:
        es = EarlyStopping(monitor="m", mode=mode, patience=patience, min_delta=min_delta)
        stop = None
        for i, v in enumerate(seq):
            should_stop, _ = es._evaluate_stopping_criteria(torch.tensor(v))
            if should_stop:
                stop = i + 1
                break
        cases.append({
            "name": name, "mode": mode, "patience": patience, "min_delta": min_delta,
            "values": [v if math.isfinite(v) else str(v) for v in seq], "stop_epoch": stop,
        })
with open(OUT, "w") as f:
    json.dump({"lightning": L.__version__, "cases": cases}, f, indent=1)
print(len(cases), "cases;", sum(c["stop_epoch"] is not None for c in cases), "stop")
