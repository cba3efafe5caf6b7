//! The dtype policy: the one place that decides parameter and compute dtypes.

use std::fmt;
use std::str::FromStr;

use candle_core::DType;

use crate::error::{Error, Result};

/// Numeric precision of a run. Mixed modes (bf16/fp16 with fp32 master
/// weights) slot in here later; every layer asks this type, never hard-codes f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Everything in fp32.
    #[default]
    Fp32,
}

impl Precision {
    /// The dtype parameters and optimizer state are stored in.
    pub fn param_dtype(self) -> DType {
        match self {
            Self::Fp32 => DType::F32,
        }
    }

    /// The dtype activations are computed in.
    pub fn compute_dtype(self) -> DType {
        match self {
            Self::Fp32 => DType::F32,
        }
    }
}

impl FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "32" | "fp32" | "32-true" | "f32" => Ok(Self::Fp32),
            _ => Err(Error::BadPrecision(s.to_string())),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fp32 => write!(f, "fp32"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp32_everywhere() -> Result<()> {
        let p: Precision = "32".parse()?;
        assert_eq!(p.param_dtype(), DType::F32);
        assert_eq!(p.compute_dtype(), DType::F32);
        assert!("fp8".parse::<Precision>().is_err());
        Ok(())
    }
}
