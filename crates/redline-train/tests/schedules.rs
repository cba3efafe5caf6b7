//! Learning-rate schedules against `torch.optim.lr_scheduler`, step by step:
//! `testdata/golden/schedules.json`, made by
//! `tools/reference/make_golden_schedules.py` (each case is a Redline
//! `--lr-schedule` spec and the rates torch's scheduler gave its steps).

mod common;

use common::trace;
use redline_train::LrSchedule;

#[test]
fn every_schedule_equals_torch_step_by_step() {
    let g = trace("schedules.json");
    let base = g["base_lr"].as_f64().unwrap();
    let steps = g["steps"].as_u64().unwrap() as usize;
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let spec = case["spec"].as_str().unwrap();
        let sched: LrSchedule = spec.parse().unwrap();
        let want: Vec<f64> = case["lrs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(want.len(), steps);
        for (t, w) in want.iter().enumerate() {
            // The epoch argument is unused per step.
            let got = sched.lr(base, t, 999, steps, 1);
            // torch's chainable forms round a little differently from the
            // closed forms; 1e-9 of the base rate is far below any effect.
            assert!(
                (got - w).abs() <= 1e-9 * base,
                "{spec}: step {t}: redline {got}, torch {w}"
            );
        }
    }
}

#[test]
fn per_epoch_schedules_step_with_the_epoch_only() {
    let sched: LrSchedule = "step:size=1:gamma=0.5".parse().unwrap();
    // Any step count within epoch 2 (0-based 1) gives the same rate.
    for step in [0, 17, 400] {
        assert_eq!(sched.lr(1.0, step, 1, 1000, 4), 0.5);
    }
}
