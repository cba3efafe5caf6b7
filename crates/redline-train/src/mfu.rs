//! Model FLOPs utilisation: the FLOPs the model's training needs per
//! second, over what the devices could do (PaLM's MFU). The model counts its
//! own FLOPs ([`redline_models::Model::flops`]); the peak comes from the
//! caller ([`crate::TrainerBuilder::peak`]): a GPU's data sheet, a CPU's
//! measured GEMM rate, or `--peak-flops`. Where either is unknown no MFU is
//! reported, never a guess.

use redline_core::peak::Peak;
use redline_models::Flops;
use serde::{Deserialize, Serialize};

/// The peak the run is measured against, or why there is none.
pub type PeakResult = std::result::Result<Peak, String>;

/// What a fit's training FLOPs came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlopsSummary {
    /// FLOPs of one training sample (forward and backward).
    pub train_per_sample: u64,
    /// FLOPs of one optimizer step (all ranks' samples).
    pub per_step: f64,
    /// Training FLOPs per second over the fit's training time (all ranks).
    pub achieved_per_s: f64,
    /// The devices' peak FLOP/s (one device's times the ranks), when known.
    pub peak_per_s: Option<f64>,
    /// Where the peak came from, or why it is unknown.
    pub peak_source: String,
    /// `achieved_per_s / peak_per_s`, when the peak is known.
    pub mfu: Option<f64>,
}

impl FlopsSummary {
    /// The fit's figures: `samples` trained over `train_s` seconds in
    /// `steps` optimizer steps, by `world` ranks each on a device of `peak`.
    pub fn new(
        per_sample: Flops,
        peak: &PeakResult,
        (samples, steps, train_s): (usize, usize, f64),
        world: usize,
    ) -> Self {
        let per_sample_f = per_sample.train() as f64;
        let achieved = if train_s > 0.0 {
            per_sample_f * samples as f64 / train_s
        } else {
            0.0
        };
        let peak_per_s = peak.as_ref().ok().map(|p| p.per_s * world.max(1) as f64);
        Self {
            train_per_sample: per_sample.train(),
            per_step: per_sample_f * samples as f64 / steps.max(1) as f64,
            achieved_per_s: achieved,
            peak_per_s,
            peak_source: match peak {
                Ok(p) if world > 1 => format!("{} x {world} ranks", p.source),
                Ok(p) => p.source.clone(),
                Err(why) => why.clone(),
            },
            mfu: peak_per_s.map(|p| achieved / p),
        }
    }

    /// The summary line's part: `MFU 12.3% (3.21 TFLOP/s of 26.1, measured ...)`,
    /// or the achieved rate and why there is no MFU.
    pub fn line(&self) -> String {
        match (self.mfu, self.peak_per_s) {
            (Some(m), Some(p)) => format!(
                "MFU {:.1}% ({} of {} peak: {})",
                100.0 * m,
                rate(self.achieved_per_s),
                rate(p),
                self.peak_source
            ),
            _ => format!(
                "MFU: not shown, {} ({} achieved)",
                self.peak_source,
                rate(self.achieved_per_s)
            ),
        }
    }
}

/// FLOP/s for people: `3.21 TFLOP/s`, `870 GFLOP/s`.
pub fn rate(per_s: f64) -> String {
    let (v, unit) = match per_s {
        x if x >= 1e15 => (x / 1e15, "PFLOP/s"),
        x if x >= 1e12 => (x / 1e12, "TFLOP/s"),
        x if x >= 1e9 => (x / 1e9, "GFLOP/s"),
        x => (x / 1e6, "MFLOP/s"),
    };
    format!("{} {unit}", three_digits(v))
}

/// FLOPs for people: `2.13 GFLOP`, `409 kFLOP`.
pub fn amount(n: f64) -> String {
    let (v, unit) = match n {
        x if x >= 1e15 => (x / 1e15, "PFLOP"),
        x if x >= 1e12 => (x / 1e12, "TFLOP"),
        x if x >= 1e9 => (x / 1e9, "GFLOP"),
        x if x >= 1e6 => (x / 1e6, "MFLOP"),
        x if x >= 1e3 => (x / 1e3, "kFLOP"),
        x => (x, "FLOP"),
    };
    format!("{} {unit}", three_digits(v))
}

/// `v` with three significant digits for values from 1 to 999.
fn three_digits(v: f64) -> String {
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}")
}

/// The MFU of a window that trained `samples_per_s` (all ranks), or `None`
/// where the model's FLOPs or the peak are unknown.
pub(crate) fn window_mfu(
    per_sample: Option<Flops>,
    peak: Option<&PeakResult>,
    samples_per_s: f64,
    world: usize,
) -> (Option<f64>, Option<f64>) {
    let Some(f) = per_sample else {
        return (None, None);
    };
    let achieved = f.train() as f64 * samples_per_s;
    let achieved = achieved.is_finite().then_some(achieved);
    let mfu = match (achieved, peak) {
        (Some(a), Some(Ok(p))) => Some(a / (p.per_s * world.max(1) as f64)),
        _ => None,
    };
    (achieved, mfu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peak(per_s: f64) -> PeakResult {
        Ok(Peak {
            per_s,
            source: "measured".into(),
        })
    }

    #[test]
    fn mfu_is_achieved_over_the_ranks_peak() {
        let f = Flops {
            forward: 100,
            backward: 200,
        };
        // 1000 samples of 300 FLOPs in 2 s over 10 steps, 2 ranks of 1e5.
        let s = FlopsSummary::new(f, &peak(1e5), (1000, 10, 2.0), 2);
        assert_eq!(s.train_per_sample, 300);
        assert_eq!(s.per_step, 30_000.0);
        assert_eq!(s.achieved_per_s, 150_000.0);
        assert_eq!(s.peak_per_s, Some(2e5));
        assert_eq!(s.mfu, Some(0.75));
        assert_eq!(s.peak_source, "measured x 2 ranks");
    }

    #[test]
    fn an_unknown_peak_leaves_mfu_out_and_says_why() {
        let f = Flops {
            forward: 1,
            backward: 2,
        };
        let s = FlopsSummary::new(
            f,
            &Err("GPU \"X\" not in the table".into()),
            (10, 1, 1.0),
            1,
        );
        assert_eq!((s.mfu, s.peak_per_s), (None, None));
        assert!(s.line().contains("not in the table"), "{}", s.line());
        let (achieved, mfu) = window_mfu(Some(f), None, 10.0, 1);
        assert_eq!((achieved, mfu), (Some(30.0), None));
        assert_eq!(window_mfu(None, Some(&peak(1.0)), 10.0, 1), (None, None));
    }

    #[test]
    fn rates_read_in_the_right_unit() {
        assert_eq!(rate(3.214e12), "3.21 TFLOP/s");
        assert_eq!(rate(870e9), "870 GFLOP/s");
        assert_eq!(rate(989.4e12), "989 TFLOP/s");
        assert_eq!(rate(1.5e15), "1.50 PFLOP/s");
        assert_eq!(amount(409_088.0), "409 kFLOP");
        assert_eq!(amount(2.13e9), "2.13 GFLOP");
    }
}
