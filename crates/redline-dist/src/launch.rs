//! Who launched this process and which rank it is: the environments of
//! OpenMPI's `mpirun`, MPICH's Hydra (`PMI_*`), `torchrun` (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`) and Slurm's `srun` (`SLURM_PROCID`, ...), read
//! in that order of precedence, as Lightning's cluster plugins read them.
//! No launcher: rank 0 of a world of one.

use crate::error::{Error, Result};

/// The launcher whose environment named the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: one process.
    None,
    /// OpenMPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH/Intel MPI Hydra (`PMI_RANK`, `PMI_SIZE`).
    Hydra,
    /// `torchrun` or any launcher setting `RANK`/`WORLD_SIZE`/`LOCAL_RANK`.
    Torchrun,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Slurm,
}

impl Launcher {
    /// The launcher's name as users know it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::OpenMpi => "mpirun (OpenMPI)",
            Self::Hydra => "mpiexec (Hydra)",
            Self::Torchrun => "torchrun-style environment",
            Self::Slurm => "srun (Slurm)",
        }
    }
}

/// This process's place among the ranks, as its launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the ranks on this machine (picks `cuda:<local_rank>`).
    pub local_rank: usize,
    /// Ranks on this machine, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Who said so.
    pub launcher: Launcher,
}

impl Launch {
    /// A world of one, no launcher.
    pub fn single() -> Self {
        Self {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: Some(1),
            launcher: Launcher::None,
        }
    }

    /// Reads this process's environment.
    pub fn detect() -> Result<Self> {
        Self::from_env(|k| std::env::var(k).ok())
    }

    /// Reads the launcher variables through `get` (a map in tests).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        // (launcher, rank, size, local rank, local size): most specific first,
        // so `mpirun` inside a Slurm allocation is read as mpirun.
        const SCHEMES: [(Launcher, &str, &str, &str, &str); 4] = [
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
            ),
            (
                Launcher::Hydra,
                "PMI_RANK",
                "PMI_SIZE",
                "MPI_LOCALRANKID",
                "MPI_LOCALNRANKS",
            ),
            (
                Launcher::Torchrun,
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
            ),
            // SLURM_STEP_NUM_TASKS is set for a step `srun` started; a batch
            // script itself (SLURM_NTASKS alone, no SLURM_PROCID) is no rank.
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_STEP_NUM_TASKS",
                "SLURM_LOCALID",
                "SLURM_STEP_TASKS_PER_NODE",
            ),
        ];
        for (launcher, rank_var, size_var, local_var, local_size_var) in SCHEMES {
            let (Some(rank), Some(size)) = (
                get(rank_var),
                get(size_var).or_else(|| {
                    (launcher == Launcher::Slurm)
                        .then(|| get("SLURM_NTASKS"))
                        .flatten()
                }),
            ) else {
                continue;
            };
            let hint = || {
                format!(
                    "the variables {launcher} sets look edited; launch again with it",
                    launcher = launcher.name()
                )
            };
            let rank = number(rank_var, &rank, hint())?;
            let world_size = number(size_var, &size, hint())?;
            if world_size == 0 || rank >= world_size {
                return Err(Error::Environment {
                    var: rank_var.into(),
                    value: rank.to_string(),
                    why: format!(
                        "rank {rank} is not below the world size {world_size} ({size_var})"
                    ),
                    hint: hint(),
                });
            }
            let local_rank = match get(local_var) {
                Some(v) => number(local_var, &v, hint())?,
                None => 0,
            };
            // Slurm's tasks-per-node reads like "2(x3)": the count before any "(".
            let local_world_size = get(local_size_var).and_then(|v| {
                v.split(['(', ','])
                    .next()
                    .and_then(|n| n.trim().parse().ok())
            });
            return Ok(Self {
                rank,
                world_size,
                local_rank,
                local_world_size,
                launcher,
            });
        }
        Ok(Self::single())
    }

    /// Whether this is rank 0 (the one that writes the run folder).
    pub fn is_global_zero(&self) -> bool {
        self.rank == 0
    }
}

fn number(var: &str, value: &str, hint: String) -> Result<usize> {
    value.trim().parse().map_err(|_| Error::Environment {
        var: var.into(),
        value: value.into(),
        why: "not a whole number".into(),
        hint,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_env(|k| map.get(k).cloned())
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        assert_eq!(launch(&[]).unwrap(), Launch::single());
        // A Slurm batch script is not a rank until srun starts one.
        assert_eq!(launch(&[("SLURM_NTASKS", "4")]).unwrap(), Launch::single());
    }

    #[test]
    fn each_launcher_is_read_and_mpirun_wins_over_slurm() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.world_size, l.local_rank), (3, 4, 1));
        assert_eq!(
            (l.local_world_size, l.launcher),
            (Some(2), Launcher::OpenMpi)
        );
        let t = launch(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]).unwrap();
        assert_eq!(
            (t.rank, t.world_size, t.launcher),
            (1, 2, Launcher::Torchrun)
        );
        let s = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
        ])
        .unwrap();
        assert_eq!((s.rank, s.world_size, s.local_rank), (5, 8, 1));
        assert_eq!((s.local_world_size, s.launcher), (Some(4), Launcher::Slurm));
        let h = launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]).unwrap();
        assert_eq!((h.world_size, h.launcher), (2, Launcher::Hydra));
    }

    #[test]
    fn an_edited_environment_is_refused_by_name() {
        let e = launch(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RANK=2") && e.contains("not below the world size 2"),
            "{e}"
        );
        let e = launch(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=x: not a whole number"), "{e}");
        let e = launch(&[("RANK", "0"), ("WORLD_SIZE", "0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("world size 0"), "{e}");
    }
}
