//! The precision of fp32 matrix products on a GPU, PyTorch's
//! `torch.set_float32_matmul_precision`: `highest` computes them in full fp32
//! (the default, and what the golden tests check against PyTorch), `high`
//! lets the GPU's tensor cores use TF32 inputs (10-bit mantissa, fp32
//! accumulation): faster, about 1e-3 relative error per product.
//!
//! A process-wide setting, as PyTorch's is. It reaches candle's cuBLAS
//! products (its matmuls and the GEMMs of its im2col convolutions) and
//! Redline's cuBLASLt linear layers; Redline's implicit-GEMM convolution
//! (`--fused-kernels`) computes in fp32 either way. It has no effect on the
//! CPU, whose products are always full fp32.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// How fp32 matrix products are computed on a GPU (`--matmul-precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulPrecision {
    /// Full fp32 products (`CUBLAS_COMPUTE_32F`).
    #[default]
    Highest,
    /// TF32 tensor-core products with fp32 accumulation
    /// (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    High,
}

impl MatmulPrecision {
    /// Whether products may round their inputs to TF32.
    pub fn tf32(self) -> bool {
        self == Self::High
    }

    /// What the setting means, for a run's summary.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Highest => "highest (fp32 products)",
            Self::High => "high (TF32 products, fp32 accumulation)",
        }
    }
}

impl FromStr for MatmulPrecision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "highest" | "fp32" => Ok(Self::Highest),
            "high" | "tf32" => Ok(Self::High),
            _ => Err(Error::BadMatmulPrecision(s.to_string())),
        }
    }
}

impl fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Highest => "highest",
            Self::High => "high",
        })
    }
}

static TF32: AtomicBool = AtomicBool::new(false);

/// Sets the precision of every fp32 matrix product the process runs on a GPU
/// from now on (candle's and Redline's).
pub fn set_matmul_precision(p: MatmulPrecision) {
    TF32.store(p.tf32(), Ordering::Relaxed);
    #[cfg(feature = "cuda")]
    candle_core::cuda_backend::set_gemm_reduced_precision_f32(p.tf32());
}

/// The precision set by [`set_matmul_precision`] (`Highest` until then).
pub fn matmul_precision() -> MatmulPrecision {
    if TF32.load(Ordering::Relaxed) {
        MatmulPrecision::High
    } else {
        MatmulPrecision::Highest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() -> Result<()> {
        for (name, want) in [
            ("highest", MatmulPrecision::Highest),
            ("FP32", MatmulPrecision::Highest),
            (" high ", MatmulPrecision::High),
            ("tf32", MatmulPrecision::High),
        ] {
            assert_eq!(name.parse::<MatmulPrecision>()?, want);
        }
        assert_eq!(MatmulPrecision::High.to_string(), "high");
        assert_eq!("highest".parse::<MatmulPrecision>()?.to_string(), "highest");
        let e = "medium".parse::<MatmulPrecision>().unwrap_err().to_string();
        assert!(e.contains("medium") && e.contains("highest"), "{e}");
        Ok(())
    }

    #[test]
    fn the_setting_is_process_wide() {
        // The only test in this crate that sets it.
        assert_eq!(matmul_precision(), MatmulPrecision::Highest);
        set_matmul_precision(MatmulPrecision::High);
        assert_eq!(matmul_precision(), MatmulPrecision::High);
        assert!(matmul_precision().tf32());
        set_matmul_precision(MatmulPrecision::Highest);
        assert_eq!(matmul_precision(), MatmulPrecision::Highest);
    }
}
