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

/// A resolved device: the candle device plus the name the user sees.
#[derive(Debug, Clone)]
pub struct Device {
    spec: DeviceSpec,
    inner: candle_core::Device,
}

impl Device {
    /// The host CPU.
    pub fn cpu() -> Self {
        Self {
            spec: DeviceSpec::Cpu,
            inner: candle_core::Device::Cpu,
        }
    }

    /// Resolves a spec against this machine and build. `Auto` takes `cuda:0`
    /// when a GPU is usable, else the CPU; an explicit GPU that is missing is an error.
    pub fn resolve(spec: DeviceSpec) -> Result<Self> {
        match spec {
            DeviceSpec::Cpu => Ok(Self::cpu()),
            DeviceSpec::Auto => Ok(Self::cpu()),
            DeviceSpec::Cuda(n) => Err(Error::DeviceUnavailable {
                requested: spec.to_string(),
                reason: format!(
                    "this redline was built without CUDA support, so cuda:{n} cannot be used \
                     (devices here: cpu)"
                ),
                hint: "use --device cpu, or rebuild with GPU support once the `cuda` feature lands"
                    .into(),
            }),
        }
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

    #[test]
    fn auto_and_cpu_resolve_to_cpu_without_gpu() -> Result<()> {
        assert!(Device::resolve(DeviceSpec::Auto)?.is_cpu());
        assert!(Device::resolve(DeviceSpec::Cpu)?.is_cpu());
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
