//! `--strategy auto|single|ddp|dp`: which rank this process is (from the
//! launcher's environment: `mpirun`, `srun`, `torchrun`-style variables), the
//! communicator that joins the ranks, and the device and thread count each
//! rank takes. Lightning's `strategy=` with its cluster plugins.

use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use redline_dist::{Launch, Launcher};
use redline_train::Strategy;

/// `--strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyFlag {
    /// Data-parallel when a launcher started several ranks, else one process.
    Auto,
    /// One process (refuses a launch of several ranks).
    Single,
    /// DistributedDataParallel over the launcher's ranks.
    Ddp,
}

impl FromStr for StrategyFlag {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "auto" => Self::Auto,
            "single" | "single_device" => Self::Single,
            "ddp" => Self::Ddp,
            "dp" => bail!(
                "--strategy dp (DataParallel) is not built: it runs one process that scatters each \
                 batch over the GPUs and gathers every gradient back onto one of them, so that \
                 device funnels all traffic and the GIL-free Rust loop gains nothing from it \
                 (Lightning 2.x removed it for the same reasons)\nHINT: use --strategy ddp, one \
                 process per device: `mpirun -n 4 redline train --strategy ddp`"
            ),
            other => bail!("--strategy {other}: give auto, single or ddp"),
        })
    }
}

/// This process's place in the job and how it joins the others.
pub struct Ranks {
    /// What the launcher said.
    pub launch: Launch,
    /// The strategy the trainer runs (a world of one for a single process).
    pub strategy: Strategy,
    /// The line the startup prints about it (none for a plain single run).
    pub line: Option<String>,
    /// `--dist-timeout`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub timeout: Duration,
}

impl Ranks {
    /// Whether this is rank 0 (the rank that prints and writes the run folder).
    pub fn is_global_zero(&self) -> bool {
        self.launch.rank == 0
    }

    /// Whether there are several ranks.
    pub fn is_distributed(&self) -> bool {
        self.launch.world_size > 1
    }

    /// Compute threads for this rank when `--threads` is not given: the
    /// machine's `online` cores shared among the ranks on it (as torchrun's
    /// `OMP_NUM_THREADS` advice), and no more than the `usable` cores the
    /// launcher bound this rank to; at least one. `None` for a lone rank.
    pub fn default_threads(&self, usable: usize, online: usize) -> Option<usize> {
        let local = self.local_ranks();
        (local > 1).then(|| usable.min(online / local).max(1))
    }

    /// Ranks on this machine.
    pub fn local_ranks(&self) -> usize {
        self.launch
            .local_world_size
            .unwrap_or(self.launch.world_size)
            .max(1)
    }
}

/// Reads the launcher's environment and joins the ranks for `--strategy`.
/// `timeout` bounds every collective; `stop` is the signal flag (a rank
/// waiting in a collective after it is set gives up: the launcher is
/// tearing the job down).
pub fn join(flag: &str, timeout: f64, stop: &Arc<AtomicBool>) -> anyhow::Result<Ranks> {
    let flag: StrategyFlag = flag.parse()?;
    // Above 0: a rank that may not wait at all cannot meet the others.
    if !(timeout > 0.0 && timeout <= crate::cli::MAX_INTERVAL_S) {
        bail!(
            "--dist-timeout {timeout:?}: give the seconds a rank may wait for the others, above \
             0 and at most {} (a day); the default is 60",
            crate::cli::MAX_INTERVAL_S
        );
    }
    let timeout = Duration::from_secs_f64(timeout);
    let launch = Launch::detect()?;
    let (rank, world) = (launch.rank, launch.world_size);
    let line = match (flag, world) {
        (StrategyFlag::Single, n) if n > 1 => bail!(
            "--strategy single, but {} started {n} ranks (this is rank {rank})\nHINT: use \
             --strategy ddp (or auto) to train data-parallel, or start one process",
            launch.launcher.name()
        ),
        (StrategyFlag::Ddp, 1) => Some(match launch.launcher {
            Launcher::None => "strategy: ddp with a world of one (no launcher): one process, \
                               nothing to reduce; start ranks with `mpirun -n N redline train \
                               --strategy ddp`"
                .to_string(),
            l => format!(
                "strategy: ddp with a world of one ({} started 1 rank): one process",
                l.name()
            ),
        }),
        (_, 1) => None,
        (_, n) => Some(format!(
            "strategy: ddp, {n} ranks started by {} ({} backend; --batch-size is per rank: a \
             global batch of {n} x the batch; collectives time out after {:.0} s)",
            launch.launcher.name(),
            if redline_dist::MPI_BUILT { "mpi" } else { "no" },
            timeout.as_secs_f64()
        )),
    };
    let mut comm = redline_dist::connect(&launch, timeout)?;
    comm.set_interrupt(Arc::clone(stop));
    Ok(Ranks {
        launch,
        strategy: Strategy::ddp(comm),
        line,
        timeout,
    })
}

impl Ranks {
    /// On a GPU of a build with NCCL (feature `nccl`), under `--strategy
    /// ddp`: the float collectives move to an NCCL communicator on the
    /// device's stream (a world of one gets a real communicator of one),
    /// the rest stay on MPI. Elsewhere a no-op.
    pub fn on_device(&mut self, device: &redline_core::Device) -> anyhow::Result<Option<String>> {
        #[cfg(feature = "nccl")]
        {
            let Ok(cuda) = device.candle().as_cuda_device() else {
                return Ok(None);
            };
            if self.line.is_none() && !self.is_distributed() {
                return Ok(None);
            }
            let host = std::mem::take(&mut self.strategy).into_comm();
            let comm =
                redline_dist::NcclComm::init(redline_core::cuda::stream(cuda), host, self.timeout)?;
            self.strategy = Strategy::ddp(Box::new(comm));
            Ok(Some(format!(
                "  NCCL communicator: rank {} of {} on {device}",
                self.launch.rank, self.launch.world_size
            )))
        }
        #[cfg(not(feature = "nccl"))]
        {
            Ok((!device.is_cpu() && self.is_distributed()).then(|| {
                "  this build has no NCCL: GPU ranks reduce gradients through host memory over \
                 MPI (build with --features redline/nccl for NCCL)"
                    .to_string()
            }))
        }
    }
}

/// The machine's online CPUs (not this process's affinity mask).
pub fn online_cores() -> usize {
    // SAFETY: sysconf reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Sends this process's standard output to /dev/null: ranks other than 0
/// would print the same progress and summaries again (PyTorch's recipes
/// print on rank 0 only). Errors still reach standard error.
pub fn quiet_stdout() -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: dup2 on two open descriptors; stdout (1) is replaced atomically.
    let rc = unsafe { libc::dup2(null.as_raw_fd(), 1) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Runs `f` with this process's standard output sent to standard error:
/// `redline sample` reads its run's plan, whose progress lines would mix
/// into the generated text that a pipe takes from standard output.
pub fn stdout_to_stderr<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    use std::io::Write;
    std::io::stdout().flush()?;
    // SAFETY: dup and dup2 on the process's open standard descriptors.
    let saved = unsafe { libc::dup(1) };
    if saved < 0 || unsafe { libc::dup2(2, 1) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let out = f();
    std::io::stdout().flush()?;
    // SAFETY: as above; `saved` is ours to close.
    let rc = unsafe { libc::dup2(saved, 1) };
    unsafe { libc::close(saved) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies_parse_and_dp_explains_itself() {
        assert_eq!(
            "auto".parse::<StrategyFlag>().ok(),
            Some(StrategyFlag::Auto)
        );
        assert_eq!("ddp".parse::<StrategyFlag>().ok(), Some(StrategyFlag::Ddp));
        assert_eq!(
            "single_device".parse::<StrategyFlag>().ok(),
            Some(StrategyFlag::Single)
        );
        let dp = "dp".parse::<StrategyFlag>().err().map(|e| e.to_string());
        assert!(
            dp.as_deref().is_some_and(|m| m.contains("--strategy ddp")),
            "{dp:?}"
        );
        assert!("fsdp".parse::<StrategyFlag>().is_err());
    }

    /// Before: `--dist-timeout -1` answered "give seconds from 0", and 0 is
    /// refused too.
    #[test]
    fn conflicting_flags_are_named() {
        let stop = Arc::new(AtomicBool::new(false));
        for t in [-1.0, 0.0, f64::NAN, 1e9] {
            let e = join("auto", t, &stop).err().map(|e| e.to_string());
            let e = e.unwrap_or_default();
            assert!(e.contains("above 0 and at most"), "{t}: {e}");
            assert!(!e.contains("from 0"), "{t}: {e}");
        }
    }

    #[test]
    fn threads_are_shared_among_the_ranks_of_a_machine() {
        let ranks = |local| Ranks {
            launch: Launch {
                rank: 0,
                world_size: 4,
                local_rank: 0,
                local_world_size: local,
                launcher: Launcher::OpenMpi,
            },
            strategy: Strategy::single(),
            line: None,
            timeout: Duration::from_secs(1),
        };
        // Unbound: the machine's cores shared.
        assert_eq!(ranks(Some(2)).default_threads(16, 16), Some(8));
        assert_eq!(ranks(Some(4)).default_threads(2, 2), Some(1));
        assert_eq!(ranks(None).default_threads(16, 16), Some(4));
        assert_eq!(ranks(Some(1)).default_threads(16, 16), None);
        // Bound to a core each (mpirun's default for 2 ranks): that core.
        assert_eq!(ranks(Some(2)).default_threads(1, 16), Some(1));
    }
}
