//! The device's peak FLOP/s for the math a run does: the denominator of MFU
//! (model FLOPs utilisation, PaLM's measure; nanoGPT and llm.c print it).
//!
//! GPUs: a table keyed by the device's name and compute capability, with
//! the vendors' data-sheet figures for dense math (no structured sparsity:
//! where a sheet gives only the sparse figure, half of it). A GPU the table
//! does not know is said to be unknown, and MFU is left out rather than
//! guessed (nanoGPT assumes an A100 whatever the GPU; llm.c printed -100%
//! on one it did not know). CPUs are measured instead (redline-kernels'
//! GEMM probe), and `--peak-flops` overrides both.

use serde::{Deserialize, Serialize};

/// The arithmetic a run's matrix products use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MathDtype {
    /// fp32 on the CUDA cores (`--matmul-precision highest`).
    F32,
    /// TF32 tensor cores for fp32 products (`--matmul-precision high`).
    Tf32,
    /// bf16 tensor cores (`bf16-mixed`, `bf16-true`).
    Bf16,
    /// fp16 tensor cores (`16-mixed`).
    F16,
}

impl MathDtype {
    /// The math of a run's products at `precision`; `tf32` says whether a
    /// GPU's fp32 products run on TF32 tensor cores.
    pub fn of(precision: crate::Precision, tf32: bool) -> Self {
        match precision {
            crate::Precision::Fp32 if tf32 => Self::Tf32,
            crate::Precision::Fp32 => Self::F32,
            crate::Precision::Fp16Mixed => Self::F16,
            _ => Self::Bf16,
        }
    }

    /// The name in lines and files: `fp32`, `tf32`, `bf16`, `fp16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Bf16 => "bf16",
            Self::F16 => "fp16",
        }
    }
}

/// A device's peak FLOP/s for one kind of math, and where the figure came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// FLOP/s.
    pub per_s: f64,
    /// Where it came from: the data sheet, `measured ...`, or `--peak-flops`.
    pub source: String,
}

/// A GPU as the peak table keys it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    /// The name as the driver gives it (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (u32, u32),
}

/// One GPU's dense peaks in TFLOP/s: fp32, TF32, bf16, fp16 (`None` where
/// the GPU has no such tensor cores).
struct Sheet {
    /// Lower-case words that must all appear in the device's name.
    words: &'static [&'static str],
    /// Lower-case words that must not (the PCIe card beside the SXM one).
    not: &'static [&'static str],
    /// Compute capability (major, minor).
    cc: (u32, u32),
    tflops: [Option<f64>; 4],
    /// The data sheet the figures are from.
    cite: &'static str,
}

const fn sheet(
    words: &'static [&'static str],
    not: &'static [&'static str],
    cc: (u32, u32),
    tflops: [Option<f64>; 4],
    cite: &'static str,
) -> Sheet {
    Sheet {
        words,
        not,
        cc,
        tflops,
        cite,
    }
}

/// Dense figures, TFLOP/s: [fp32, TF32, bf16, fp16 (fp32 accumulate)].
/// First match wins, so a specific name comes before a general one.
const SHEETS: &[Sheet] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (2023): SXM fp32 67, TF32 989
    // and bf16/fp16 1,979 with sparsity; PCIe 51, 756, 1,513; NVL 60, 835, 1,671.
    sheet(
        &["h100", "pcie"],
        &[],
        (9, 0),
        [Some(51.0), Some(378.0), Some(756.5), Some(756.5)],
        "NVIDIA H100 datasheet, PCIe",
    ),
    sheet(
        &["h100", "nvl"],
        &[],
        (9, 0),
        [Some(60.0), Some(417.5), Some(835.5), Some(835.5)],
        "NVIDIA H100 datasheet, NVL",
    ),
    sheet(
        &["h100"],
        &[],
        (9, 0),
        [Some(67.0), Some(494.7), Some(989.4), Some(989.4)],
        "NVIDIA H100 datasheet, SXM",
    ),
    // NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 SXM's figures.
    sheet(
        &["gh200"],
        &[],
        (9, 0),
        [Some(67.0), Some(494.7), Some(989.4), Some(989.4)],
        "NVIDIA GH200 datasheet",
    ),
    // NVIDIA H200 Tensor Core GPU datasheet (2024): SXM fp32 67, TF32 989,
    // bf16/fp16 1,979 with sparsity; NVL 60, 835, 1,671.
    sheet(
        &["h200", "nvl"],
        &[],
        (9, 0),
        [Some(60.0), Some(417.5), Some(835.5), Some(835.5)],
        "NVIDIA H200 datasheet, NVL",
    ),
    sheet(
        &["h200"],
        &[],
        (9, 0),
        [Some(67.0), Some(494.7), Some(989.4), Some(989.4)],
        "NVIDIA H200 datasheet, SXM",
    ),
    // NVIDIA A100 Tensor Core GPU datasheet (2021): fp32 19.5, TF32 156,
    // bf16/fp16 312 dense, the same for 40 and 80 GB, SXM and PCIe.
    sheet(
        &["a100"],
        &[],
        (8, 0),
        [Some(19.5), Some(156.0), Some(312.0), Some(312.0)],
        "NVIDIA A100 datasheet",
    ),
    // NVIDIA A30 datasheet: fp32 10.3, TF32 82, bf16/fp16 165 dense.
    sheet(
        &["a30"],
        &[],
        (8, 0),
        [Some(10.3), Some(82.0), Some(165.0), Some(165.0)],
        "NVIDIA A30 datasheet",
    ),
    // NVIDIA A10 datasheet: fp32 31.2, TF32 125, bf16/fp16 250 with sparsity.
    sheet(
        &["a10"],
        &["a100", "a10g"],
        (8, 6),
        [Some(31.2), Some(62.5), Some(125.0), Some(125.0)],
        "NVIDIA A10 datasheet",
    ),
    // NVIDIA L4 datasheet: fp32 30.3, TF32 120, bf16/fp16 242 with sparsity.
    sheet(
        &["l4"],
        &["l40"],
        (8, 9),
        [Some(30.3), Some(60.0), Some(121.0), Some(121.0)],
        "NVIDIA L4 datasheet",
    ),
    // NVIDIA L40S datasheet: fp32 91.6, TF32 366, bf16/fp16 733 with sparsity.
    sheet(
        &["l40s"],
        &[],
        (8, 9),
        [Some(91.6), Some(183.0), Some(362.05), Some(362.05)],
        "NVIDIA L40S datasheet",
    ),
    // NVIDIA L40 datasheet: fp32 90.5, TF32 181, bf16/fp16 362 with sparsity.
    sheet(
        &["l40"],
        &["l40s"],
        (8, 9),
        [Some(90.5), Some(90.5), Some(181.0), Some(181.0)],
        "NVIDIA L40 datasheet",
    ),
    // NVIDIA Ada GPU architecture whitepaper, RTX 4090: fp32 82.6, TF32
    // 82.6, fp16/bf16 with fp32 accumulate 165.2 (dense).
    sheet(
        &["rtx", "4090"],
        &[],
        (8, 9),
        [Some(82.6), Some(82.6), Some(165.2), Some(165.2)],
        "NVIDIA Ada architecture whitepaper, RTX 4090",
    ),
    // NVIDIA Ampere GA102 whitepaper, RTX 3090: fp32 35.6, TF32 35.6,
    // fp16/bf16 with fp32 accumulate 71 (dense).
    sheet(
        &["rtx", "3090"],
        &["3090 ti"],
        (8, 6),
        [Some(35.6), Some(35.6), Some(71.0), Some(71.0)],
        "NVIDIA Ampere GA102 whitepaper, RTX 3090",
    ),
    // NVIDIA T4 datasheet: fp32 8.1, fp16 mixed precision 65; no TF32 or bf16.
    sheet(
        &["t4"],
        &[],
        (7, 5),
        [Some(8.1), None, None, Some(65.0)],
        "NVIDIA T4 datasheet",
    ),
    // NVIDIA V100 datasheet: SXM2 fp32 15.7, tensor 125; PCIe 14, 112; no TF32 or bf16.
    sheet(
        &["v100", "pcie"],
        &[],
        (7, 0),
        [Some(14.0), None, None, Some(112.0)],
        "NVIDIA V100 datasheet, PCIe",
    ),
    sheet(
        &["v100"],
        &[],
        (7, 0),
        [Some(15.7), None, None, Some(125.0)],
        "NVIDIA V100 datasheet, SXM2",
    ),
];

/// Why a GPU has no peak from the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Unknown {
    /// No entry names this GPU.
    Name,
    /// The name matched an entry whose compute capability differs (a
    /// newer part under an old name, or a misread): not guessed.
    Capability {
        /// The entry's capability.
        expected: (u32, u32),
    },
    /// The GPU has no tensor cores for this math (a T4's bf16).
    Math,
}

/// The data sheet's dense peak of GPU `name` (as the driver gives it, e.g.
/// `NVIDIA H100 80GB HBM3`) with compute capability `cc` for `math`.
pub fn gpu(name: &str, cc: (u32, u32), math: MathDtype) -> Result<Peak, Unknown> {
    let lower = name.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| {
        if w.contains(' ') {
            lower.contains(w)
        } else {
            words.contains(&w)
        }
    };
    let Some(s) = SHEETS
        .iter()
        .find(|s| s.words.iter().all(|w| has(w)) && !s.not.iter().any(|w| has(w)))
    else {
        return Err(Unknown::Name);
    };
    if s.cc != cc {
        return Err(Unknown::Capability { expected: s.cc });
    }
    let i = match math {
        MathDtype::F32 => 0,
        MathDtype::Tf32 => 1,
        MathDtype::Bf16 => 2,
        MathDtype::F16 => 3,
    };
    let tflops = s.tflops[i].ok_or(Unknown::Math)?;
    Ok(Peak {
        per_s: tflops * 1e12,
        source: format!("{} ({} dense)", s.cite, math.name()),
    })
}

/// The largest peak accepted from `--peak-flops` (1e18, an exaFLOP/s: far
/// beyond any one device), so a typo of many zeros is refused.
pub const MAX_PEAK: f64 = 1e18;

/// Parses `--peak-flops`: FLOP/s as a number (`989e12`, `9.894e14`) or with
/// a unit (`989T`, `989 TFLOPS`, `1.2P`, `500G`).
pub fn parse_peak(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower
        .strip_suffix("flop/s")
        .or_else(|| lower.strip_suffix("flops"))
        .unwrap_or(&lower)
        .trim_end();
    let (num, scale) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 1e3),
        Some('g') => (&stripped[..stripped.len() - 1], 1e9),
        Some('t') => (&stripped[..stripped.len() - 1], 1e12),
        Some('p') => (&stripped[..stripped.len() - 1], 1e15),
        _ => (stripped, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| {
        format!(
            "{:?} is not a number of FLOP/s\nHINT: e.g. --peak-flops 989e12 or --peak-flops 989T \
             (an H100 SXM's dense bf16)",
            crate::text::clip(t, crate::text::MAX_SHOWN)
        )
    })?;
    let v = v * scale;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "{t}: a peak must be a positive, finite number of FLOP/s"
        ));
    }
    if !(1e6..=MAX_PEAK).contains(&v) {
        return Err(format!(
            "{t} is {v:.3e} FLOP/s: outside 1e6 to {MAX_PEAK:.0e} (a device's peak)\nHINT: give \
             FLOP/s, not TFLOP/s: --peak-flops 989e12 or 989T"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_tells_the_sxm_from_the_pcie_card() {
        let sxm = gpu("NVIDIA H100 80GB HBM3", (9, 0), MathDtype::Bf16);
        assert_eq!(sxm.map(|p| p.per_s), Ok(989.4e12));
        let pcie = gpu("NVIDIA H100 PCIe", (9, 0), MathDtype::Bf16);
        assert_eq!(pcie.map(|p| p.per_s), Ok(756.5e12));
        let h200 = gpu("NVIDIA H200", (9, 0), MathDtype::F32).map(|p| p.per_s);
        assert_eq!(h200, Ok(67e12));
        let a100 = gpu("NVIDIA A100-SXM4-80GB", (8, 0), MathDtype::Tf32).map(|p| p.per_s);
        assert_eq!(a100, Ok(156e12));
        // A10 is not A100, L4 not L40S.
        let a10 = gpu("NVIDIA A10", (8, 6), MathDtype::F32).map(|p| p.per_s);
        assert_eq!(a10, Ok(31.2e12));
        let l4 = gpu("NVIDIA L4", (8, 9), MathDtype::Bf16).map(|p| p.per_s);
        assert_eq!(l4, Ok(121e12));
        let l40s = gpu("NVIDIA L40S", (8, 9), MathDtype::Bf16).map(|p| p.per_s);
        assert_eq!(l40s, Ok(362.05e12));
        let rtx = gpu("NVIDIA GeForce RTX 4090", (8, 9), MathDtype::F16).map(|p| p.per_s);
        assert_eq!(rtx, Ok(165.2e12));
    }

    #[test]
    fn an_unknown_gpu_is_not_guessed() {
        assert_eq!(
            gpu("NVIDIA B200", (10, 0), MathDtype::Bf16),
            Err(Unknown::Name)
        );
        // A known name with another capability.
        assert_eq!(
            gpu("NVIDIA H100 80GB HBM3", (10, 0), MathDtype::Bf16),
            Err(Unknown::Capability { expected: (9, 0) })
        );
        // A T4 has no bf16 tensor cores.
        assert_eq!(gpu("Tesla T4", (7, 5), MathDtype::Bf16), Err(Unknown::Math));
        assert!(gpu("Tesla T4", (7, 5), MathDtype::F16).is_ok());
    }

    #[test]
    fn the_source_cites_the_sheet_and_the_math() -> Result<(), Unknown> {
        let p = gpu("NVIDIA H100 80GB HBM3", (9, 0), MathDtype::Tf32)?;
        assert_eq!(p.source, "NVIDIA H100 datasheet, SXM (tf32 dense)");
        Ok(())
    }

    #[test]
    fn peaks_parse_with_and_without_units() {
        for (text, want) in [
            ("989e12", 989e12),
            ("989T", 989e12),
            ("989 TFLOPS", 989e12),
            ("1.2P", 1.2e15),
            ("500g", 500e9),
            ("2.5e11 flop/s", 2.5e11),
        ] {
            let got = parse_peak(text).unwrap_or(f64::NAN);
            assert!((got - want).abs() <= want * 1e-12, "{text}: {got}");
        }
    }

    #[test]
    fn hostile_peaks_are_refused_with_a_hint() {
        for bad in [
            "", "fast", "-5T", "0", "nan", "inf", "1e400", "5", "2e19", "T", "1e12x",
        ] {
            let e = parse_peak(bad).err();
            assert!(e.is_some(), "{bad:?} was accepted");
        }
        let e = parse_peak("989").err().unwrap_or_default();
        assert!(e.contains("HINT: give FLOP/s, not TFLOP/s"), "{e}");
    }
}
