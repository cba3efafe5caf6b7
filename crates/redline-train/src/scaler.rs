//! The dynamic loss scaler of `--precision 16-mixed`: PyTorch's
//! `torch.amp.GradScaler` (which Lightning's `16-mixed` plugin drives),
//! with its defaults and its arithmetic.
//!
//! fp16 keeps 5 exponent bits: gradients below 6e-8 flush to zero and above
//! 65504 overflow. The loss is multiplied by a scale before the backward,
//! so the 16-bit gradients sit in fp16's range; the fp32 master gradients
//! are divided by it before clipping and the update. A step whose gradients
//! hold an inf or NaN is skipped and the scale halves; after `interval`
//! clean steps in a row it doubles.
//!
//! Everything lives on the device as scalars (the scale, the run of clean
//! steps, the skipped-step count, the step's overflow flag) and is updated
//! by device ops: no value is read back per step, so a step with the scaler
//! can be captured and replayed. The host reads them only for checkpoints
//! and the summary ([`GradScaler::state`]).

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Tensor, Var};
use redline_kernels::grad::Param;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The scaler's settings (`--loss-scale`; PyTorch's `GradScaler` arguments
/// and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The first scale (`init_scale`, 2^16).
    pub init: f64,
    /// The factor after `interval` clean steps (`growth_factor`, 2).
    pub growth: f64,
    /// The factor after a step that overflowed (`backoff_factor`, 0.5).
    pub backoff: f64,
    /// Clean steps in a row before the scale grows (`growth_interval`, 2000).
    pub interval: u32,
}

impl Default for LossScale {
    fn default() -> Self {
        Self {
            init: 65536.0,
            growth: 2.0,
            backoff: 0.5,
            interval: 2000,
        }
    }
}

impl LossScale {
    /// Refuses what `GradScaler` refuses (and a scale that is not finite).
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(format!("--loss-scale {self}: {why}")));
        // The scale is an fp32 on the device: 1e40 would be inf there, and
        // every step would be skipped as an overflow.
        if !(self.init > 0.0 && self.init <= f64::from(f32::MAX)) {
            return bad(format!(
                "init must be a finite fp32 number > 0 (at most {:e})",
                f32::MAX
            ));
        }
        if !(self.growth.is_finite() && self.growth > 1.0) {
            return bad("growth must be a finite number > 1".into());
        }
        if !(self.backoff > 0.0 && self.backoff < 1.0) {
            return bad("backoff must be between 0 and 1".into());
        }
        if self.interval == 0 {
            return bad("interval must be at least 1".into());
        }
        Ok(())
    }
}

/// `dynamic[:init=F][:growth=F][:backoff=F][:interval=N]`.
impl FromStr for LossScale {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let usage = |why: String| {
            Error::Config(format!(
                "--loss-scale {s:?}: {why}\nHINT: dynamic[:init=65536][:growth=2][:backoff=0.5]\
                 [:interval=2000] (PyTorch's GradScaler settings)"
            ))
        };
        let mut parts = s.trim().split(':');
        if parts.next().map(str::trim) != Some("dynamic") {
            return Err(usage("the scaler is `dynamic`".into()));
        }
        let mut out = Self::default();
        for part in parts {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| usage(format!("{part:?} is not key=value")))?;
            let num = |v: &str| -> Result<f64> {
                v.trim()
                    .parse::<f64>()
                    .map_err(|_| usage(format!("{k}={v}: not a number")))
            };
            match k.trim() {
                "init" => out.init = num(v)?,
                "growth" => out.growth = num(v)?,
                "backoff" => out.backoff = num(v)?,
                "interval" => {
                    out.interval = v
                        .trim()
                        .parse()
                        .map_err(|_| usage(format!("interval={v}: not a whole number")))?
                }
                other => return Err(usage(format!("unknown setting {other:?}"))),
            }
        }
        out.check()?;
        Ok(out)
    }
}

impl fmt::Display for LossScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dynamic:init={}:growth={}:backoff={}:interval={}",
            self.init, self.growth, self.backoff, self.interval
        )
    }
}

/// The scaler's standing, read back: what a checkpoint keeps and the
/// summary shows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerState {
    /// The current scale.
    pub scale: f64,
    /// Clean steps since the last growth or overflow.
    pub growth_tracker: u32,
    /// Optimizer steps skipped because their gradients overflowed.
    pub skipped_steps: u64,
}

/// The scaler's device state.
pub struct GradScaler {
    cfg: LossScale,
    /// f32, as PyTorch's `_scale`.
    scale: Var,
    /// f32 count of clean steps in a row.
    tracker: Var,
    /// f64 count of skipped steps.
    skipped: Var,
}

impl GradScaler {
    /// A scaler at `cfg.init` on `device`.
    pub fn new(cfg: LossScale, device: &candle_core::Device) -> Result<Self> {
        cfg.check()?;
        Ok(Self {
            cfg,
            scale: Var::from_tensor(&Tensor::new(cfg.init as f32, device)?)?,
            tracker: Var::from_tensor(&Tensor::new(0f32, device)?)?,
            skipped: Var::from_tensor(&Tensor::new(0f64, device)?)?,
        })
    }

    /// The settings.
    pub fn config(&self) -> LossScale {
        self.cfg
    }

    /// `loss * scale`, what the backward starts from (`scaler.scale(loss)`).
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        let s = self.scale.as_tensor().to_dtype(loss.dtype())?;
        Ok(loss.broadcast_mul(&s)?)
    }

    /// Divides every gradient by the scale and returns whether any held an
    /// inf or NaN, as an f32 scalar (1 or 0) on the scaler's device
    /// (`scaler.unscale_(optimizer)`). The inverse is taken in f64 and
    /// rounded to f32, as PyTorch's.
    pub fn unscale(&self, params: &[&Param]) -> Result<Tensor> {
        let inv = self
            .scale
            .as_tensor()
            .to_dtype(DType::F64)?
            .recip()?
            .to_dtype(DType::F32)?;
        let dev = self.scale.device();
        let mut found: Option<Tensor> = None;
        for p in params {
            let inv = inv.to_device(p.as_tensor().device())?;
            if let Some(bad) = p.grad().unscale(&inv)? {
                let bad = bad.to_device(dev)?;
                found = Some(match found {
                    None => bad,
                    Some(f) => f.maximum(&bad)?,
                });
            }
        }
        match found {
            Some(f) => Ok(f),
            None => Ok(Tensor::new(0f32, dev)?),
        }
    }

    /// The scale after a step (`scaler.update()`, PyTorch's
    /// `_amp_update_scale_`): backoff and a new run of clean steps after an
    /// overflow (`found_inf` 1); else one more clean step, and growth (when
    /// the grown scale is finite) once the run reaches the interval. Device
    /// ops on scalars; the factors are applied in f64 and rounded to f32,
    /// as PyTorch's float-times-double.
    pub fn update(&self, found_inf: &Tensor) -> Result<()> {
        let f = found_inf.to_dtype(DType::F32)?;
        let clean = f.affine(-1.0, 1.0)?;
        // (tracker + 1) on a clean step, 0 after an overflow.
        let run = self.tracker.as_tensor().affine(1.0, 1.0)?.mul(&clean)?;
        let grow = run
            .ge(f64::from(self.cfg.interval) as f32)?
            .to_dtype(DType::F64)?;
        let scale = self.scale.as_tensor().to_dtype(DType::F64)?;
        let grown = scale.affine(self.cfg.growth, 0.0)?.to_dtype(DType::F32)?;
        // |x| <= f32::MAX holds for every finite x, not for inf or NaN.
        let finite = grown.abs()?.le(f32::MAX)?.to_dtype(DType::F64)?;
        let (f64f, clean64) = (f.to_dtype(DType::F64)?, clean.to_dtype(DType::F64)?);
        // overflow: backoff; clean: growth - 1 more when growing (and finite).
        let factor = (f64f.affine(self.cfg.backoff, 0.0)?
            + clean64.mul(&grow.mul(&finite)?.affine(self.cfg.growth - 1.0, 1.0)?)?)?;
        self.scale.set(&scale.mul(&factor)?.to_dtype(DType::F32)?)?;
        let kept = grow.to_dtype(DType::F32)?.affine(-1.0, 1.0)?;
        self.tracker.set(&run.mul(&kept)?)?;
        self.skipped
            .set(&(self.skipped.as_tensor() + f.to_dtype(DType::F64)?)?)?;
        Ok(())
    }

    /// The scale now, read back through `reads` (a log point's read).
    pub fn read_scale(&self, reads: &redline_core::host::HostReads) -> Result<f64> {
        Ok(f64::from(reads.scalar::<f32>(self.scale.as_tensor())?))
    }

    /// The standing, read back (a device sync: checkpoints and summaries).
    pub fn state(&self) -> Result<ScalerState> {
        let read = |v: &Var| -> Result<f64> {
            Ok(v.as_tensor().to_dtype(DType::F64)?.to_scalar::<f64>()?)
        };
        Ok(ScalerState {
            scale: read(&self.scale)?,
            growth_tracker: read(&self.tracker)? as u32,
            skipped_steps: read(&self.skipped)? as u64,
        })
    }

    /// Puts a [`GradScaler::state`] back (a resumed run).
    pub fn load_state(&mut self, st: &ScalerState) -> Result<()> {
        // Held as f32: a value past f32's range would become inf.
        let scale = st.scale as f32;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::Config(format!(
                "loss scaler state: scale {} is not a finite f32 number > 0",
                st.scale
            )));
        }
        let dev = self.scale.device().clone();
        self.scale.set(&Tensor::new(scale, &dev)?)?;
        self.tracker
            .set(&Tensor::new(st.growth_tracker as f32, &dev)?)?;
        self.skipped
            .set(&Tensor::new(st.skipped_steps as f64, &dev)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// PyTorch's `_amp_update_scale_` on the host, for comparison.
    fn reference(cfg: LossScale, found: &[bool]) -> Vec<(f32, u32)> {
        let (mut scale, mut tracker) = (cfg.init as f32, 0u32);
        let mut out = Vec::new();
        for &f in found {
            if f {
                scale = (f64::from(scale) * cfg.backoff) as f32;
                tracker = 0;
            } else {
                let successful = tracker + 1;
                if successful == cfg.interval {
                    let grown = (f64::from(scale) * cfg.growth) as f32;
                    if grown.is_finite() {
                        scale = grown;
                    }
                    tracker = 0;
                } else {
                    tracker = successful;
                }
            }
            out.push((scale, tracker));
        }
        out
    }

    #[test]
    fn the_scale_follows_pytorchs_update() -> Result<()> {
        let dev = Device::Cpu;
        // Overflows, clean runs to growth, growth to inf refused.
        let found: Vec<bool> = "xxx...x....xx.........."
            .chars()
            .map(|c| c == 'x')
            .collect();
        for cfg in [
            LossScale {
                interval: 3,
                ..LossScale::default()
            },
            LossScale {
                init: 3.0e38,
                growth: 1.7,
                backoff: 0.3,
                interval: 2,
            },
        ] {
            let s = GradScaler::new(cfg, &dev)?;
            for (i, (&f, want)) in found.iter().zip(reference(cfg, &found)).enumerate() {
                s.update(&Tensor::new(f32::from(u8::from(f)), &dev)?)?;
                let st = s.state()?;
                assert_eq!((st.scale as f32, st.growth_tracker), want, "{cfg} step {i}");
            }
            let skipped = found.iter().filter(|f| **f).count() as u64;
            assert_eq!(s.state()?.skipped_steps, skipped);
        }
        Ok(())
    }

    #[test]
    fn unscale_divides_and_flags_across_parameters() -> Result<()> {
        let dev = Device::Cpu;
        let s = GradScaler::new(
            LossScale {
                init: 8.0,
                ..LossScale::default()
            },
            &dev,
        )?;
        let p = |g: &[f32]| -> Result<Param> {
            let p = Param::new(Var::zeros(g.len(), DType::F32, &dev)?);
            p.grad().absorb(&Tensor::new(g, &dev)?)?;
            Ok(p)
        };
        let (a, b) = (p(&[8.0, -16.0])?, p(&[4.0])?);
        let loss = s.scale_loss(&Tensor::new(1.5f32, &dev)?)?;
        assert_eq!(loss.to_scalar::<f32>()?, 12.0);
        assert_eq!(s.unscale(&[&a, &b])?.to_scalar::<f32>()?, 0.0);
        let ga = a.grad().to_tensor(a.as_tensor())?;
        assert_eq!(
            ga.map(|g| g.to_vec1::<f32>()).transpose()?,
            Some(vec![1.0, -2.0])
        );
        let c = p(&[f32::INFINITY])?;
        assert_eq!(s.unscale(&[&a, &c, &b])?.to_scalar::<f32>()?, 1.0);
        assert_eq!(s.unscale(&[])?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn settings_parse_print_and_are_checked() -> Result<()> {
        assert_eq!("dynamic".parse::<LossScale>()?, LossScale::default());
        let c: LossScale = "dynamic:init=1024:interval=3:growth=4:backoff=0.25".parse()?;
        assert_eq!(
            (c.init, c.interval, c.growth, c.backoff),
            (1024.0, 3, 4.0, 0.25)
        );
        assert_eq!(c.to_string().parse::<LossScale>()?, c);
        for bad in [
            "static",
            "dynamic:init=0",
            // Above fp32's largest: inf on the device, every step skipped.
            "dynamic:init=1e40",
            "dynamic:init=inf",
            "dynamic:growth=1",
            "dynamic:backoff=1",
            "dynamic:interval=0",
            "dynamic:interval=1.5",
            "dynamic:speed=3",
            "dynamic:init",
        ] {
            assert!(bad.parse::<LossScale>().is_err(), "{bad}");
        }
        let mut s = GradScaler::new(LossScale::default(), &Device::Cpu)?;
        let st = ScalerState {
            scale: 512.0,
            growth_tracker: 7,
            skipped_steps: 3,
        };
        s.load_state(&st)?;
        assert_eq!(s.state()?, st);
        for bad in [f64::INFINITY, 1e39, 0.0, -2.0, f64::NAN] {
            let refused = s.load_state(&ScalerState { scale: bad, ..st });
            assert!(refused.is_err(), "{bad}");
        }
        assert_eq!(s.state()?, st, "a refused state changes nothing");
        Ok(())
    }
}
