//! Device selection: parse `auto | cpu | cuda:N` and resolve it against what exists.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The best device present: the first GPU if any, else the CPU.
    #[default]
    Auto,
    /// The host CPU.
    Cpu,
    /// The NVIDIA GPU with this ordinal.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Self::Cuda)
                .ok_or_else(|| Error::BadDeviceSpec {
                    spec: s.to_string(),
                }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What this build and machine offer for GPUs, as far as selection needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAvailability {
    /// Whether this binary was built with the `cuda` feature.
    pub cuda_built: bool,
    /// GPUs the CUDA driver reports, or why it could not be asked.
    pub count: std::result::Result<usize, String>,
}

impl GpuAvailability {
    /// What this process sees: the build's feature and, in a CUDA build, the
    /// driver's device count (a missing driver reads as an error string).
    pub fn probe() -> Self {
        Self {
            cuda_built: cfg!(feature = "cuda"),
            count: gpu_count(),
        }
    }

    fn existing(&self) -> String {
        match &self.count {
            Ok(0) | Err(_) => "cpu".into(),
            Ok(1) => "cpu, cuda:0".into(),
            Ok(n) => format!("cpu, cuda:0 .. cuda:{}", n - 1),
        }
    }
}

#[cfg(feature = "cuda")]
fn gpu_count() -> std::result::Result<usize, String> {
    crate::cuda::device_count()
}

#[cfg(not(feature = "cuda"))]
fn gpu_count() -> std::result::Result<usize, String> {
    Err("this build has no CUDA support".into())
}

/// How to get a GPU build, for error hints.
pub const CUDA_BUILD_HINT: &str =
    "build with GPU support: eval \"$(scripts/cuda-toolchain.sh)\" && \
     cargo build --release --features cuda (README, \"GPU build\"), or use --device cpu";

/// Picks the device `spec` names on a machine and build with `gpus`: `auto`
/// takes `cuda:0` when a GPU is usable, else the CPU; an explicit GPU that this
/// build cannot drive, or that does not exist, is an error saying what exists.
pub fn select(spec: DeviceSpec, gpus: &GpuAvailability) -> Result<DeviceSpec> {
    match spec {
        DeviceSpec::Cpu => Ok(DeviceSpec::Cpu),
        DeviceSpec::Auto => Ok(match (gpus.cuda_built, &gpus.count) {
            (true, Ok(n)) if *n > 0 => DeviceSpec::Cuda(0),
            _ => DeviceSpec::Cpu,
        }),
        DeviceSpec::Cuda(n) if !gpus.cuda_built => Err(Error::DeviceUnavailable {
            requested: spec.to_string(),
            reason: format!(
                "this redline was built without CUDA support, so cuda:{n} cannot be used \
                 (devices this build can use: cpu; `redline devices` lists the GPUs NVML sees)"
            ),
            hint: CUDA_BUILD_HINT.into(),
        }),
        DeviceSpec::Cuda(n) => match &gpus.count {
            Ok(count) if n < *count => Ok(spec),
            Ok(count) => Err(Error::DeviceUnavailable {
                requested: spec.to_string(),
                reason: format!(
                    "this machine has {count} GPU{} (devices: {})",
                    if *count == 1 { "" } else { "s" },
                    gpus.existing()
                ),
                hint: if *count == 0 {
                    "use --device cpu (or auto)".into()
                } else {
                    format!("pick one of {} or use --device auto", gpus.existing())
                },
            }),
            Err(why) => Err(Error::DeviceUnavailable {
                requested: spec.to_string(),
                reason: format!("the CUDA driver could not be asked for GPUs: {why}"),
                hint: "check `nvidia-smi` works (driver installed, GPU visible to this \
                       container), or use --device cpu"
                    .into(),
            }),
        },
    }
}

/// A resolved device: the candle device plus the name the user sees.
#[derive(Debug, Clone)]
pub struct Device {
    spec: DeviceSpec,
    inner: candle_core::Device,
    /// Seconds spent loading the GPU kernels when the device was opened.
    kernels_s: Option<f64>,
}

impl Device {
    /// The host CPU.
    pub fn cpu() -> Self {
        Self {
            spec: DeviceSpec::Cpu,
            inner: candle_core::Device::Cpu,
            kernels_s: None,
        }
    }

    /// Resolves a spec against this machine and build (see [`select`]) and opens it.
    pub fn resolve(spec: DeviceSpec) -> Result<Self> {
        match select(spec, &GpuAvailability::probe())? {
            // A CPU build's `select` never picks a GPU.
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(n) => Self::open_cuda(n),
            _ => Ok(Self::cpu()),
        }
    }

    #[cfg(feature = "cuda")]
    fn open_cuda(n: usize) -> Result<Self> {
        let inner = candle_core::Device::new_cuda(n).map_err(|e| Error::DeviceUnavailable {
            requested: format!("cuda:{n}"),
            reason: format!("opening the GPU failed: {e}"),
            hint: "check `nvidia-smi`; another process may hold the GPU in exclusive mode".into(),
        })?;
        let mut kernels_s = None;
        if let candle_core::Device::Cuda(d) = &inner {
            crate::cuda::enable_pool_caching(d)?;
            // SAFETY: every buffer made from here on skips cudarc's two
            // events per allocation (created and destroyed on the host with
            // each buffer; recorded and waited on only in cudarc's
            // multi-stream mode). Redline runs all device work on this
            // device's one stream, and its copy stream is a raw driver stream
            // that orders itself with explicit events (redline-data's
            // cuda_stage.rs), so the context never enters that mode.
            unsafe { d.disable_event_tracking() };
            let start = std::time::Instant::now();
            crate::cuda::load_kernels(d)?;
            kernels_s = Some(start.elapsed().as_secs_f64());
        }
        Ok(Self {
            spec: DeviceSpec::Cuda(n),
            inner,
            kernels_s,
        })
    }

    /// On a GPU, its name as the driver gives it and its compute
    /// capability (or why they could not be read); `None` on the CPU.
    pub fn gpu_identity(&self) -> Option<std::result::Result<crate::peak::GpuId, String>> {
        match &self.inner {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(d) => Some(
                crate::cuda::identity(d)
                    .map(|(name, capability)| crate::peak::GpuId { name, capability })
                    .map_err(|e| e.to_string()),
            ),
            _ => None,
        }
    }

    /// On a GPU, the seconds its opening spent loading candle's kernel
    /// modules: on the first run on a machine the driver compiles them for
    /// the GPU here (tens of seconds), not inside the first timed step; later
    /// runs load the driver's cached code. `None` on the CPU.
    pub fn kernels_load_s(&self) -> Option<f64> {
        self.kernels_s
    }

    /// Which spec this device satisfies (`cpu`, `cuda:0`, ...).
    pub fn spec(&self) -> DeviceSpec {
        self.spec
    }

    /// The candle device, for creating tensors directly on it.
    pub fn candle(&self) -> &candle_core::Device {
        &self.inner
    }

    /// True for the host CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self.spec, DeviceSpec::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!("auto".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Auto));
        assert_eq!("CPU".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cpu));
        assert_eq!(
            "cuda:3".parse::<DeviceSpec>().ok(),
            Some(DeviceSpec::Cuda(3))
        );
        assert_eq!("cuda".parse::<DeviceSpec>().ok(), Some(DeviceSpec::Cuda(0)));
        for bad in ["", "cuda:", "cuda:x", "tpu", "cuda:-1"] {
            let err = bad.parse::<DeviceSpec>().err().map(|e| e.to_string());
            assert!(
                err.is_some_and(|m| m.contains("expected `auto`")),
                "{bad:?}"
            );
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn auto_and_cpu_resolve_to_cpu_without_gpu() -> Result<()> {
        assert!(Device::resolve(DeviceSpec::Auto)?.is_cpu());
        assert!(Device::resolve(DeviceSpec::Cpu)?.is_cpu());
        Ok(())
    }

    fn gpus(cuda_built: bool, count: std::result::Result<usize, String>) -> GpuAvailability {
        GpuAvailability { cuda_built, count }
    }

    #[test]
    fn auto_takes_the_first_gpu_only_when_one_is_usable() -> Result<()> {
        let auto = DeviceSpec::Auto;
        assert_eq!(select(auto, &gpus(true, Ok(2)))?, DeviceSpec::Cuda(0));
        assert_eq!(select(auto, &gpus(true, Ok(0)))?, DeviceSpec::Cpu);
        assert_eq!(
            select(auto, &gpus(true, Err("no driver".into())))?,
            DeviceSpec::Cpu
        );
        // GPUs on the machine, but a CPU build cannot drive them.
        assert_eq!(select(auto, &gpus(false, Ok(4)))?, DeviceSpec::Cpu);
        assert_eq!(
            select(DeviceSpec::Cpu, &gpus(true, Ok(1)))?,
            DeviceSpec::Cpu
        );
        Ok(())
    }

    #[test]
    fn explicit_gpus_are_checked_against_the_count() -> Result<()> {
        assert_eq!(
            select(DeviceSpec::Cuda(1), &gpus(true, Ok(2)))?,
            DeviceSpec::Cuda(1)
        );
        let msg = |spec, g: GpuAvailability| {
            select(spec, &g)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let beyond = msg(DeviceSpec::Cuda(2), gpus(true, Ok(2)));
        assert!(beyond.contains("--device cuda:2"), "{beyond}");
        assert!(
            beyond.contains("has 2 GPUs (devices: cpu, cuda:0 .. cuda:1)"),
            "{beyond}"
        );
        let none = msg(DeviceSpec::Cuda(0), gpus(true, Ok(0)));
        assert!(none.contains("has 0 GPUs (devices: cpu)"), "{none}");
        let driver = msg(
            DeviceSpec::Cuda(0),
            gpus(true, Err("libcuda.so.1 missing".into())),
        );
        assert!(driver.contains("libcuda.so.1 missing") && driver.contains("nvidia-smi"));
        let cpu_build = msg(DeviceSpec::Cuda(0), gpus(false, Ok(8)));
        assert!(cpu_build.contains("built without CUDA"), "{cpu_build}");
        assert!(cpu_build.contains("--features cuda"), "{cpu_build}");
        Ok(())
    }

    #[test]
    fn missing_gpu_is_a_clear_error() {
        let msg = Device::resolve(DeviceSpec::Cuda(1))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("cuda:1"), "{msg}");
        assert!(msg.contains("HINT"), "{msg}");
    }
}
