#!/usr/bin/env python3
"""Learning rates of torch.optim.lr_scheduler, step by step, for Redline's
schedule golden test (crates/redline-train/tests/schedules.rs).

Each case pairs Redline's `--lr-schedule` spec (stepped per optimizer step)
with the torch scheduler it must equal: the rate each of `steps` optimizer
steps used (read from the param group before `optimizer.step()`, then
`scheduler.step()`, as a training loop does).

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_schedules.py \
        --out testdata/golden/schedules.json
"""
import argparse
import json

import torch
from torch.optim import lr_scheduler as S

BASE = 0.1
STEPS = 40


def linear_then(opt, warmup, start, after):
    """Redline's `:warmup=N:warmup_start=F`: LinearLR, then the schedule."""
    return S.SequentialLR(
        opt,
        [S.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warmup), after(opt)],
        milestones=[warmup],
    )


CASES = [
    ("constant:interval=step", lambda o: S.ConstantLR(o, factor=1.0, total_iters=0)),
    ("step:size=7:gamma=0.5:interval=step", lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
    (
        "multistep:milestones=5/12/30:gamma=0.3:interval=step",
        lambda o: S.MultiStepLR(o, milestones=[5, 12, 30], gamma=0.3),
    ),
    ("exp:gamma=0.9:interval=step", lambda o: S.ExponentialLR(o, gamma=0.9)),
    (
        "cosine:t_max=15:eta_min=0.0001:interval=step",
        lambda o: S.CosineAnnealingLR(o, T_max=15, eta_min=1e-4),
    ),
    ("cosine:interval=step", lambda o: S.CosineAnnealingLR(o, T_max=STEPS)),
    (
        "cosine-restarts:t0=5:mult=2:eta_min=0.00001:interval=step",
        lambda o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=1e-5),
    ),
    (
        "cosine-restarts:t0=6:interval=step",
        lambda o: S.CosineAnnealingWarmRestarts(o, T_0=6),
    ),
    (
        "onecycle:max_lr=0.5:interval=step",
        lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=STEPS, cycle_momentum=False),
    ),
    (
        "onecycle:pct_start=0.25:div=10:final_div=100:interval=step",
        lambda o: S.OneCycleLR(
            o,
            max_lr=BASE,
            total_steps=STEPS,
            pct_start=0.25,
            div_factor=10,
            final_div_factor=100,
            cycle_momentum=False,
        ),
    ),
    (
        "cosine:warmup=8:warmup_start=0.1:interval=step",
        lambda o: linear_then(o, 8, 0.1, lambda o: S.CosineAnnealingLR(o, T_max=STEPS - 8)),
    ),
    (
        "step:size=5:gamma=0.5:warmup=4:interval=step",
        lambda o: linear_then(o, 4, 0.01, lambda o: S.StepLR(o, step_size=5, gamma=0.5)),
    ),
]


def rates(make):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=BASE)
    sched = make(opt)
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cases = [{"spec": spec, "lrs": rates(make)} for spec, make in CASES]
    with open(args.out, "w") as f:
        json.dump(
            {"torch_version": torch.__version__, "base_lr": BASE, "steps": STEPS, "cases": cases},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
