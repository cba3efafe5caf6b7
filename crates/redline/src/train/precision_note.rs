//! The summary's `precision_path`: how a run's 16-bit products are
//! computed on this device (which kernels, which instructions), and what the
//! CPU has that Redline does not use yet.

use redline_core::Precision;
use serde_json::{json, Value};

/// The summary's precision fields: `precision`, `precision_path`, and the
/// measured `timing` of a 16-bit precision against fp32 (`precision_timing`,
/// `precision_vs_fp32`, `precision_activations`).
pub(super) fn fields(
    precision: Precision,
    device: &redline_core::Device,
    fused: bool,
    timing: Option<&crate::auto_device::PrecisionTiming>,
) -> Vec<(&'static str, Value)> {
    vec![
        ("precision", json!(precision.name())),
        (
            "precision_path",
            json!(precision_path(precision, device, fused)),
        ),
        ("precision_timing", json!(timing.map(|t| &t.line))),
        ("precision_vs_fp32", json!(timing.map(|t| t.ratio))),
        (
            "precision_activations",
            json!(timing
                .and_then(|t| t.activations)
                .map(|(half, full, batch)| {
                    json!({"bytes": half, "fp32_bytes": full, "batch": batch})
                })),
        ),
    ]
}

/// How this run's 16-bit products are computed, for the summary (`None` in
/// fp32); `fused`: whether `--fused-kernels` admits Redline's 16-bit GPU
/// kernels ([`redline_train::graph::reduced_kernels_on`]).
/// Called after the trainer set the CPU's bf16 GEMM switch.
fn precision_path(
    precision: Precision,
    device: &redline_core::Device,
    fused: bool,
) -> Option<String> {
    if precision == Precision::Fp32 {
        return None;
    }
    let weights = match precision {
        Precision::Bf16True => {
            "bf16 parameters, gradients and optimizer state (each update rounded to bf16 where \
             PyTorch's bf16 ops round)"
        }
        _ => "fp32 master weights",
    };
    if !device.is_cpu() {
        return Some(gpu_precision_path(precision, weights, fused));
    }
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if precision != Precision::Fp16Mixed && redline_kernels::gemm_bf16::enabled() {
        let amx = amx_note(&flags);
        return Some(format!(
            "{precision} on the CPU: {weights}; bf16 GEMMs and convolutions on AVX-512 BF16 \
             (Redline's vdpbf16ps kernel, fp32 accumulation, subnormals flushed), outputs \
             rounded to bf16{amx}"
        ));
    }
    let (ty, why) = match precision {
        Precision::Fp16Mixed => (
            "fp16",
            match ["avx512_fp16", "amx_fp16"].into_iter().find(|f| has(f)) {
                Some(f) => format!("this CPU has {f}, which Redline does not use yet"),
                None => "this CPU has no AVX-512 FP16 or AMX-FP16".into(),
            },
        ),
        _ if redline_kernels::gemm_bf16::available() => (
            "bf16",
            "AVX-512 BF16 is present but --cpu-bf16-gemm off".into(),
        ),
        _ => ("bf16", "this CPU has no AVX-512 BF16".into()),
    };
    let scaler = match precision {
        Precision::Fp16Mixed => {
            "; fp16 weight gradients (inf above 65504) under a dynamic loss scale"
        }
        _ => "",
    };
    Some(format!(
        "{precision} on the CPU: {weights}; fp32 GEMMs and convolutions on {ty}-rounded \
         operands, outputs rounded to {ty} (a {ty} product with fp32 accumulation){scaler}; {why}"
    ))
}

/// What the bf16 path's summary adds on a CPU whose `/proc/cpuinfo` `flags`
/// list AMX-BF16: that the faster instruction is there and not used.
fn amx_note(flags: &str) -> &'static str {
    if flags.split_whitespace().any(|w| w == "amx_bf16") {
        "; this CPU also has AMX-BF16 (tdpbf16ps tiles), which Redline does not use yet"
    } else {
        ""
    }
}

/// [`precision_path`] on a GPU: Redline's tensor-core kernels with the
/// fused kernels (`--fused-kernels auto` or `on`), else candle's 16-bit
/// CUDA ops.
fn gpu_precision_path(precision: Precision, weights: &str, fused: bool) -> String {
    let ty = if precision == Precision::Fp16Mixed {
        "fp16"
    } else {
        "bf16"
    };
    if fused {
        format!(
            "{precision} on the GPU: {weights}; linear layers (cuBLASLt) and convolutions \
             (Redline's implicit GEMMs) on {ty} tensor cores with fp32 accumulation, outputs \
             rounded to {ty} (Redline's fused kernels)"
        )
    } else {
        format!("{precision} on the GPU: {weights}; candle's {ty} CUDA kernels (cuBLAS)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU with AMX-BF16 is told that Redline's bf16 kernel does not use it.
    #[test]
    fn an_amx_cpu_is_told_that_amx_is_not_used() {
        let spr = "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8";
        assert!(amx_note(spr).contains("AMX-BF16"));
        assert_eq!(amx_note("flags\t\t: fpu avx512f avx512_bf16"), "");
        assert_eq!(amx_note("flags: amx_bf16x"), "", "whole words only");
    }

    /// A GPU run's summary names the kernels its 16-bit products take.
    #[test]
    fn the_gpu_precision_path_says_which_kernels_run() {
        let fused = gpu_precision_path(Precision::Bf16Mixed, "fp32 master weights", true);
        assert!(
            fused.contains("bf16 tensor cores") && !fused.contains("candle"),
            "{fused}"
        );
        let plain = gpu_precision_path(Precision::Fp16Mixed, "fp32 master weights", false);
        assert!(
            plain.contains("candle's fp16") && !plain.contains("tensor cores"),
            "{plain}"
        );
    }
}
