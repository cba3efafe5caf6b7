//! Redline monitor: "nvidia-smi for Redline". Samples GPUs (NVML, loaded at run
//! time) and the host (CPU per core, memory, redline processes).
//!
//! * [`Monitor`]: one [`Sample`] on demand; never fails, without a driver it
//!   says why in [`Sample::gpu_note`].
//! * [`Sampler`]: a background thread sampling at an interval, for the trainer.
//! * [`render`]: the text table; [`run`]: the `redline monitor` command.
//!
//! ```no_run
//! let mut monitor = redline_monitor::Monitor::new();
//! std::thread::sleep(redline_monitor::CPU_WINDOW);
//! println!("{}", redline_monitor::render(&monitor.sample(), None));
//! ```

mod cli;
mod csv;
mod error;
mod gpu;
mod host;
mod sample;
mod sampler;
mod view;

pub use cli::{run, run_to, MonitorOptions};
pub use error::{Error, Result};
pub use gpu::{GpuInfo, GpuProcess, GpuSample, Gpus};
pub use host::{HostProcess, HostSample, HostSampler, CPU_WINDOW};
pub use sample::{Monitor, Sample};
pub use sampler::{SampleCallback, Sampler};
pub use view::render;
