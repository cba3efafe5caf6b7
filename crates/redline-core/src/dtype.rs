//! The dtype policy: the one place that decides parameter and compute dtypes.

use std::fmt;
use std::str::FromStr;

use candle_core::DType;

use crate::error::{Error, Result};

/// Numeric precision of a run, with Lightning's names (`Trainer(precision=...)`).
/// Every layer asks this type for its dtypes, never hard-codes f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in fp32 (`32-true`).
    #[default]
    Fp32,
    /// fp32 parameters and optimizer state; matrix products and
    /// convolutions (and the activations between them) in bf16; losses,
    /// reductions and the update in fp32 (`bf16-mixed`, PyTorch's CPU/GPU
    /// autocast to bfloat16).
    Bf16Mixed,
    /// As [`Precision::Bf16Mixed`] in fp16, with a dynamic loss scaler
    /// (`16-mixed`).
    Fp16Mixed,
    /// Parameters, optimizer state and everything else in bf16 (`bf16-true`).
    Bf16True,
}

impl Precision {
    /// Every precision, in the order `--precision` lists them.
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Bf16Mixed,
        Precision::Fp16Mixed,
        Precision::Bf16True,
    ];

    /// The dtype parameters and optimizer state are stored in.
    pub fn param_dtype(self) -> DType {
        match self {
            Self::Fp32 | Self::Bf16Mixed | Self::Fp16Mixed => DType::F32,
            Self::Bf16True => DType::BF16,
        }
    }

    /// The dtype matrix products, convolutions and the activations between
    /// them are computed in.
    pub fn compute_dtype(self) -> DType {
        match self {
            Self::Fp32 => DType::F32,
            Self::Bf16Mixed | Self::Bf16True => DType::BF16,
            Self::Fp16Mixed => DType::F16,
        }
    }

    /// Whether master weights stay fp32 while products run in 16 bits.
    pub fn is_mixed(self) -> bool {
        matches!(self, Self::Bf16Mixed | Self::Fp16Mixed)
    }

    /// Lightning's name (`32-true`, `bf16-mixed`, `16-mixed`, `bf16-true`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "32-true",
            Self::Bf16Mixed => "bf16-mixed",
            Self::Fp16Mixed => "16-mixed",
            Self::Bf16True => "bf16-true",
        }
    }
}

impl FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "32" | "fp32" | "32-true" | "f32" => Ok(Self::Fp32),
            "bf16-mixed" | "bf16" => Ok(Self::Bf16Mixed),
            "16-mixed" | "16" | "fp16" => Ok(Self::Fp16Mixed),
            "bf16-true" => Ok(Self::Bf16True),
            _ => Err(Error::BadPrecision(s.to_string())),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lightnings_names_and_their_dtypes() -> Result<()> {
        let p: Precision = "32".parse()?;
        assert_eq!(p.param_dtype(), DType::F32);
        assert_eq!(p.compute_dtype(), DType::F32);
        assert!("fp8".parse::<Precision>().is_err());
        let mixed: Precision = "bf16".parse()?;
        assert_eq!(mixed, Precision::Bf16Mixed);
        assert_eq!(
            (mixed.param_dtype(), mixed.compute_dtype()),
            (DType::F32, DType::BF16)
        );
        assert_eq!("16".parse::<Precision>()?, Precision::Fp16Mixed);
        let pure: Precision = "bf16-true".parse()?;
        assert_eq!(
            (pure.param_dtype(), pure.compute_dtype()),
            (DType::BF16, DType::BF16)
        );
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>()?, p, "{p} round-trips");
        }
        Ok(())
    }
}
