//! Ranks and collectives for data-parallel training (Redline's
//! `--strategy ddp`).
//!
//! - [`Launch`]: which rank this process is, from the launcher's environment
//!   (`mpirun`, `mpiexec`, `torchrun`, `srun`);
//! - [`Collectives`]: the all-reduce, broadcast, all-gather and barrier the
//!   training loop needs, with a timeout that turns a dead or hung rank into
//!   an error naming where the job stopped;
//! - backends: [`Single`] (a world of one, free) and, with the `mpi` feature,
//!   [`MpiComm`] over the system's MPI (OpenMPI on Debian).

mod comm;
mod error;
mod launch;
#[cfg(feature = "mpi")]
mod mpi_comm;
#[cfg(feature = "nccl")]
mod nccl_comm;

pub use comm::{Collectives, Single};
pub use error::{Error, Result};
pub use launch::{Launch, Launcher};
#[cfg(feature = "mpi")]
pub use mpi_comm::MpiComm;
#[cfg(feature = "nccl")]
pub use nccl_comm::NcclComm;

/// Whether this build has the NCCL backend (the `nccl` feature).
pub const NCCL_BUILT: bool = cfg!(feature = "nccl");

/// Whether this build can join several ranks (the `mpi` feature).
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// The version text of the MPI library this build was linked with
/// (`Open MPI v4.1.4, ...`; `MPI_Get_library_version`, which MPI allows
/// before initialization), or `None` for a build without MPI.
pub fn mpi_library_version() -> Option<String> {
    #[cfg(feature = "mpi")]
    {
        Some(MpiComm::library_version())
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}

/// The communicator for `launch`: [`Single`] for a world of one; MPI for
/// several ranks (an error naming the fix when this build has no MPI).
pub fn connect(launch: &Launch, timeout: std::time::Duration) -> Result<Box<dyn Collectives>> {
    if launch.world_size == 1 {
        return Ok(Box::new(Single));
    }
    #[cfg(feature = "mpi")]
    {
        Ok(Box::new(MpiComm::init(launch, timeout)?))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = timeout;
        Err(Error::Unsupported {
            what: format!(
                "{} started {} ranks, but this redline was built without MPI",
                launch.launcher.name(),
                launch.world_size
            ),
            hint: "build with `cargo build --release --features redline/mpi` (Debian: \
                   apt-get install libopenmpi-dev openmpi-bin libclang-dev)"
                .into(),
        })
    }
}
