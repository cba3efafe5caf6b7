//! The profiler's device clock: CUDA events on the compute stream of a GPU
//! (with the `cuda` feature); nothing on the CPU, where kernels run
//! synchronously and host time is device time.

use redline_core::Device;
use redline_profile::DeviceClock;

/// The clock for `device`, if it has a queue of its own.
pub fn for_device(device: &Device) -> Option<Box<dyn DeviceClock>> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = device.candle() {
        return Some(Box::new(cuda::Events::new(d)));
    }
    let _ = device;
    None
}

#[cfg(feature = "cuda")]
mod cuda {
    use redline_core::cuda::EventTimer;
    use redline_profile::{Action, DeviceClock};

    /// Tag of a pause (no action).
    const PAUSED: usize = usize::MAX;

    /// Events recorded at every switch, elapsed times read at log points.
    pub struct Events(EventTimer);

    impl Events {
        pub fn new(dev: &candle_core::CudaDevice) -> Self {
            Self(EventTimer::new(dev))
        }
    }

    impl DeviceClock for Events {
        fn mark(&mut self, action: Option<Action>) -> Result<(), String> {
            self.0
                .mark(action.map_or(PAUSED, Action::index))
                .map_err(|e| e.to_string())
        }

        fn drain(&mut self) -> Result<Vec<(Option<Action>, f64)>, String> {
            let out = self.0.drain().map_err(|e| e.to_string())?;
            Ok(out
                .into_iter()
                .map(|(tag, ms)| (Action::ALL.get(tag).copied(), ms))
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_no_device_clock() {
        assert!(for_device(&Device::cpu()).is_none());
    }
}
