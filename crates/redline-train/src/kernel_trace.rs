//! The kernel trace behind GPU busy %: on a CUDA device, CUPTI records when
//! every kernel ran, and the fit reports the time kernels ran over wall time
//! ([`GpuBusy`]). CUPTI is loaded at run time, so a machine without it trains
//! as before and says why the figure is missing. The arithmetic is
//! [`redline_profile::KernelTally`], tested on the CPU.

use redline_core::Device;
use redline_profile::GpuBusy;

/// What the fit reports about the GPU's kernel time: nothing on the CPU,
/// the figure, or why it was not measured.
pub type GpuBusyResult = Option<std::result::Result<GpuBusy, String>>;

/// A fit's kernel trace.
pub(crate) enum KernelTrace {
    /// Not a GPU: nothing to measure.
    Cpu,
    /// A GPU, but no trace (why).
    Unavailable(String),
    /// Recording.
    #[cfg(feature = "cuda")]
    Running(cupti::Trace),
}

impl KernelTrace {
    /// Starts tracing `device`'s kernels when `enabled`.
    pub(crate) fn start(device: &Device, enabled: bool) -> Self {
        if device.is_cpu() {
            return Self::Cpu;
        }
        if !enabled {
            return Self::Unavailable(
                "the kernel trace was turned off (--kernel-trace off)".into(),
            );
        }
        #[cfg(feature = "cuda")]
        {
            match cupti::Trace::start() {
                Ok(t) => Self::Running(t),
                Err(why) => Self::Unavailable(why),
            }
        }
        #[cfg(not(feature = "cuda"))]
        Self::Unavailable("this build has no CUDA support".into())
    }

    /// Stops the trace after `steps` optimizer steps (waiting for the
    /// device to finish its queued work first).
    pub(crate) fn finish(self, device: &Device, steps: usize) -> GpuBusyResult {
        #[cfg(not(feature = "cuda"))]
        let _ = (device, steps);
        match self {
            Self::Cpu => None,
            Self::Unavailable(why) => Some(Err(why)),
            #[cfg(feature = "cuda")]
            Self::Running(t) => Some(
                device
                    .candle()
                    .synchronize()
                    .map_err(|e| format!("device synchronize: {e}"))
                    .and_then(|()| t.finish(steps)),
            ),
        }
    }
}

#[cfg(feature = "cuda")]
mod cupti;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_no_gpu_figure() {
        let t = KernelTrace::start(&Device::cpu(), true);
        assert!(matches!(t, KernelTrace::Cpu));
        assert!(t.finish(&Device::cpu(), 10).is_none());
    }
}
