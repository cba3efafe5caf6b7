//! The peak a run's MFU is read against: `--peak-flops`, else a GPU's
//! data-sheet figure for the math the run does (by name and compute
//! capability), else, on the CPU, the GEMM the run's products take,
//! measured once per machine, thread count and dtype, and cached.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use redline_core::peak::{self, GpuId, MathDtype, Peak, Unknown};
use redline_core::{DType, Device, MatmulPrecision, Precision};
use redline_train::mfu::PeakResult;
use serde::{Deserialize, Serialize};

use crate::cli::TrainArgs;

/// How long the CPU probe times products for, per dtype.
const PROBE_BUDGET: Duration = Duration::from_millis(250);

/// How long the load is sampled before the probe, to tell a quiet machine.
const LOAD_WINDOW: Duration = Duration::from_millis(100);

/// The cache file's name in the cache folder (v2: entries say which build
/// measured them; v1's did not, and a debug build's low peak was read by
/// release builds).
const CACHE_FILE: &str = "cpu-peak-flops-v2.json";

/// The largest cache file read (it holds a line per machine setting).
const MAX_CACHE: u64 = 1 << 20;

/// `--peak-flops`, parsed and checked (before any data is read).
pub fn flag(args: &TrainArgs) -> anyhow::Result<Option<f64>> {
    args.peak_flops
        .as_deref()
        .map(|t| peak::parse_peak(t).map_err(|e| anyhow::anyhow!("--peak-flops {e}")))
        .transpose()
}

/// The peak of `redline train`'s run: rank 0's (the one that reports
/// MFU); `None` on the other ranks, which need none.
pub fn for_run(args: &TrainArgs, plan: &crate::plan::Plan) -> anyhow::Result<Option<PeakResult>> {
    if !plan.ranks.is_global_zero() {
        return Ok(None);
    }
    let flag = flag(args)?;
    Ok(Some(resolve(
        flag,
        &plan.device,
        plan.precision,
        plan.threads,
    )))
}

/// The run's peak on `device` at `precision` with `threads` compute
/// threads, or why there is none (then no MFU is shown).
pub fn resolve(
    flag: Option<f64>,
    device: &Device,
    precision: Precision,
    threads: usize,
) -> PeakResult {
    if let Some(per_s) = flag {
        return Ok(Peak {
            per_s,
            source: "--peak-flops".into(),
        });
    }
    match device.gpu_identity() {
        Some(id) => gpu(id, precision),
        None => Ok(cpu(precision, threads)),
    }
}

/// A GPU's data-sheet peak, or why it is unknown, with the fix.
fn gpu(id: Result<GpuId, String>, precision: Precision) -> PeakResult {
    let GpuId {
        name,
        capability: cc,
    } = id.map_err(|e| format!("the GPU's name could not be read ({e})"))?;
    let tf32 = redline_core::matmul_precision() == MatmulPrecision::High;
    let math = MathDtype::of(precision, tf32);
    let hint = "give its dense peak for this math from its data sheet with --peak-flops";
    peak::gpu(&name, cc, math).map_err(|why| match why {
        Unknown::Name => format!(
            "\"{name}\" (sm_{}{}) is not in Redline's table of GPUs: {hint}",
            cc.0, cc.1
        ),
        Unknown::Capability { expected } => format!(
            "\"{name}\" reports compute capability {}.{}, but the table's GPU of that name is \
             {}.{}: {hint}",
            cc.0, cc.1, expected.0, expected.1
        ),
        Unknown::Math => format!(
            "\"{name}\" has no {} tensor cores in its data sheet: {hint}",
            math.name()
        ),
    })
}

/// The GEMM a CPU run's products take at `precision`.
fn cpu_gemm(precision: Precision) -> DType {
    let dtype = match precision {
        Precision::Fp32 => DType::F32,
        Precision::Fp16Mixed => DType::F16,
        Precision::Bf16Mixed | Precision::Bf16True => DType::BF16,
    };
    redline_kernels::gemm_bf16::route(dtype)
}

/// The GEMM's name in the cache's keys and the peak's source.
fn gemm_name(gemm: DType) -> &'static str {
    if gemm == DType::BF16 {
        "bf16"
    } else {
        "fp32"
    }
}

/// One cached measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Measured {
    /// FLOP/s.
    flops_per_s: f64,
    /// When it was measured (seconds since the Unix epoch).
    measured_unix: u64,
}

/// The CPU's measured peak for `precision`'s GEMM on `threads` threads:
/// from the cache when this machine measured it before, else measured now,
/// and cached when the machine was quiet (other work on its cores would
/// make the peak read low, and every later MFU high). A cache that cannot
/// be read or written costs only the measurement.
fn cpu(precision: Precision, threads: usize) -> Peak {
    let gemm = cpu_gemm(precision);
    let gemm_name = gemm_name(gemm);
    let key = cache_key(gemm_name, threads);
    let path = cache_dir().map(|d| d.join(CACHE_FILE));
    let mut cache = path.as_deref().map(read_cache).unwrap_or_default();
    let what = format!("measured: the {gemm_name} GEMM on {threads} threads");
    if let Some(m) = cache
        .get(&key)
        .filter(|m| m.flops_per_s.is_finite() && m.flops_per_s > 0.0)
    {
        return Peak {
            per_s: m.flops_per_s,
            source: format!("{what} (cached)"),
        };
    }
    let free = redline_core::threads::measure_free_cores(LOAD_WINDOW);
    let per_s = redline_kernels::peak_probe::measure(gemm, PROBE_BUDGET);
    if free + 0.5 < threads as f64 {
        return Peak {
            per_s,
            source: format!(
                "{what}, while other work left {free:.1} cores free: not cached, and MFU may \
                 read high"
            ),
        };
    }
    let measured_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    cache.insert(
        key,
        Measured {
            flops_per_s: per_s,
            measured_unix,
        },
    );
    if let Some(p) = &path {
        if let Err(e) = write_cache(p, &cache) {
            tracing::info!("the CPU peak was not cached in {}: {e:#}", p.display());
        }
    }
    Peak {
        per_s,
        source: what,
    }
}

/// The cache's key for this CPU, build, thread count and GEMM.
fn cache_key(gemm_name: &str, threads: usize) -> String {
    let cpu = redline_core::system::devices()
        .first()
        .map_or_else(|| "cpu".to_string(), |d| d.name.clone());
    // A debug build's GEMM runs with debug assertions (a third of the
    // release build's rate here): its peak is its own, never a release's.
    let build = if cfg!(debug_assertions) {
        " debug build"
    } else {
        ""
    };
    format!(
        "{cpu} | {threads} threads | {gemm_name} GEMM | redline {}{build}",
        env!("CARGO_PKG_VERSION")
    )
}

/// After a fit whose math ran faster than the cached CPU peak it was read
/// against (MFU above 1: the peak was measured while other work held the
/// cores), forgets that peak so that the next run measures it again, and
/// says so; `None` when there is nothing to say.
pub fn check_cached(
    fit: &redline_train::FitSummary,
    precision: Precision,
    threads: usize,
) -> Option<String> {
    let Some(Ok(f)) = &fit.flops else {
        return None;
    };
    let mfu = f.mfu?;
    // Only the CPU's measured peaks are cached (and say so).
    if mfu <= 1.0 || !f.peak_source.ends_with("(cached)") {
        return None;
    }
    let path = cache_dir()?.join(CACHE_FILE);
    let mut cache = read_cache(&path);
    cache.remove(&cache_key(gemm_name(cpu_gemm(precision)), threads));
    let _ = write_cache(&path, &cache);
    Some(format!(
        "MFU {:.0}% is above 100%: the cached CPU peak ({}) was measured low, with other work \
         on the cores; it is forgotten and the next run measures it again",
        100.0 * mfu,
        redline_train::mfu::rate(f.peak_per_s.unwrap_or(0.0))
    ))
}

/// Where the measured peaks are kept: `$REDLINE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/redline`, else `~/.cache/redline`.
fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("REDLINE_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("redline")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/redline")))
}

/// The cache's entries; empty when it is missing or unreadable (it is
/// rewritten whole on the next measurement).
fn read_cache(path: &Path) -> BTreeMap<String, Measured> {
    redline_core::files::read_input_text(path, MAX_CACHE)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

fn write_cache(path: &Path, cache: &BTreeMap<String, Measured>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(cache)?;
    redline_core::files::write_atomic(path, text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_the_table_does_not_know_names_the_fix() {
        let id = |name: &str, capability| {
            Ok(GpuId {
                name: name.into(),
                capability,
            })
        };
        let why = gpu(id("NVIDIA B200", (10, 0)), Precision::Bf16Mixed)
            .err()
            .unwrap_or_default();
        assert!(why.contains("\"NVIDIA B200\" (sm_100)"), "{why}");
        assert!(why.contains("--peak-flops"), "{why}");
        let why = gpu(id("Tesla T4", (7, 5)), Precision::Bf16True)
            .err()
            .unwrap_or_default();
        assert!(why.contains("no bf16 tensor cores"), "{why}");
    }

    #[test]
    fn a_known_gpu_takes_the_math_of_the_precision() -> anyhow::Result<()> {
        let id = || {
            Ok(GpuId {
                name: "NVIDIA H100 80GB HBM3".into(),
                capability: (9, 0),
            })
        };
        let p = gpu(id(), Precision::Bf16Mixed).map_err(anyhow::Error::msg)?;
        assert_eq!(p.per_s, 989.4e12);
        let p = gpu(id(), Precision::Fp16Mixed).map_err(anyhow::Error::msg)?;
        assert!(p.source.contains("fp16"), "{}", p.source);
        Ok(())
    }

    #[test]
    fn the_flag_overrides_everything() {
        let p = resolve(Some(1e12), &Device::cpu(), Precision::Fp32, 1);
        assert_eq!(
            p,
            Ok(Peak {
                per_s: 1e12,
                source: "--peak-flops".into()
            })
        );
    }

    #[test]
    fn a_corrupt_cache_is_measured_over() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(CACHE_FILE);
        std::fs::write(&path, "{not json")?;
        assert!(read_cache(&path).is_empty());
        let mut cache = BTreeMap::new();
        cache.insert(
            "k".to_string(),
            Measured {
                flops_per_s: 5e10,
                measured_unix: 1,
            },
        );
        write_cache(&path, &cache)?;
        assert_eq!(
            read_cache(&path).get("k").map(|m| m.flops_per_s),
            Some(5e10)
        );
        Ok(())
    }
}
