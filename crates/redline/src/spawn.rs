//! `--devices N` without a launcher: this very command line again as `N`
//! ranks under the launcher of the MPI this binary was linked with (Open
//! MPI's `mpirun`, MPICH's `mpiexec`), as `torchrun --nproc-per-node N`
//! would start them. Root, the usual user in containers and cloud images, is
//! allowed for those ranks only; a launcher of another MPI is refused by
//! name, since its ranks would each start as a world of one.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use anyhow::{anyhow, bail};
use redline_dist::{Launch, Launcher};

use crate::dist::StrategyFlag;

/// The launchers tried, in order: the plain names first (what the user's
/// PATH and Debian's alternatives chose), then each implementation's own.
const LAUNCHERS: [&str; 6] = [
    "mpirun",
    "mpiexec",
    "mpirun.openmpi",
    "mpiexec.openmpi",
    "mpiexec.mpich",
    "mpiexec.hydra",
];

/// Which MPI implementation a version text names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mpi {
    /// Open MPI, with its version (`4.1.4`).
    Open(String),
    /// MPICH or one built on it (Intel MPI, MVAPICH), whose launcher is
    /// Hydra; they share one ABI.
    Mpich(String),
    /// Something else: the first line of its text.
    Other(String),
}

impl Mpi {
    /// Reads `mpirun --version` output or the library's version text
    /// (`MPI_Get_library_version`).
    pub fn read(text: &str) -> Self {
        let version = first_version(text);
        if text.contains("Open MPI") || text.contains("OpenRTE") || text.contains("PRRTE") {
            Self::Open(version)
        } else if ["MPICH", "HYDRA", "Hydra", "Intel(R) MPI", "MVAPICH"]
            .iter()
            .any(|m| text.contains(m))
        {
            Self::Mpich(version)
        } else {
            Self::Other(redline_core::text::clip(
                text.lines().next().unwrap_or(""),
                redline_core::text::MAX_SHOWN,
            ))
        }
    }

    /// "Open MPI 4.1.4", for messages.
    pub fn name(&self) -> String {
        match self {
            Self::Open(v) => format!("Open MPI {v}"),
            Self::Mpich(v) => format!("MPICH {v}"),
            Self::Other(line) => format!("an unknown MPI ({line})"),
        }
    }

    /// Why ranks started by launcher `self` cannot join through `library`,
    /// or `None` when they can (or when either is unknown: tried, not
    /// refused).
    pub fn mismatch(&self, library: &Self) -> Option<String> {
        let major = |v: &str| v.split('.').next().unwrap_or("").to_string();
        match (self, library) {
            (Self::Open(_), Self::Mpich(_)) | (Self::Mpich(_), Self::Open(_)) => Some(format!(
                "its ranks would not find each other: {} and {} are different MPIs",
                self.name(),
                library.name()
            )),
            (Self::Open(a), Self::Open(b)) if major(a) != major(b) => Some(format!(
                "Open MPI's launcher and library must be the same release series, and {a} is not \
                 {b}"
            )),
            _ => None,
        }
    }
}

/// The first `1.2.3`-like word of `text` (`v4.1.4` read as `4.1.4`), or "".
fn first_version(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || ",;()".contains(c))
        .map(|w| w.trim_start_matches('v'))
        .find(|w| {
            w.starts_with(|c: char| c.is_ascii_digit())
                && w.contains('.')
                && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
        })
        .unwrap_or("")
        .to_string()
}

/// A launcher found on PATH and what its `--version` says it is.
struct Found {
    path: PathBuf,
    mpi: Mpi,
}

/// Every launcher of [`LAUNCHERS`] on PATH, once each (an alternatives link
/// and its target are the same program).
fn on_path() -> Vec<Found> {
    let dirs = path_dirs();
    let mut seen = Vec::new();
    let mut found = Vec::new();
    for name in LAUNCHERS {
        let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else {
            continue;
        };
        let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&real) {
            continue;
        }
        seen.push(real);
        let Some(text) = version_text(&path) else {
            continue;
        };
        found.push(Found {
            mpi: Mpi::read(&text),
            path,
        });
    }
    found
}

/// The folders of `PATH`, in order.
fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .collect()
}

/// `PATH --version`'s output, or `None` when it does not run.
fn version_text(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("--version").output().ok()?;
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Refuses what cannot be spawned before anything is: `--strategy single`
/// with several devices, `--devices 0`, a count that differs from an outer
/// launcher's. `Some(n)` when `n` ranks should be started here.
fn ranks_to_start(devices: Option<usize>, strategy: &str) -> anyhow::Result<Option<usize>> {
    let launch = Launch::detect()?;
    if let (Some(n @ 2..), Ok(StrategyFlag::Single)) = (devices, strategy.parse()) {
        bail!(
            "--strategy single runs one process on one device, but --devices {n} asks for {n} \
             ranks\nHINT: drop --strategy single (auto or ddp runs {n} ranks), or drop \
             --devices"
        );
    }
    match devices {
        Some(0) => bail!("--devices 0: give the number of ranks to start (at least 1)"),
        Some(n) if launch.launcher != Launcher::None && n != launch.world_size => bail!(
            "--devices {n}, but {} started {} ranks\nHINT: drop --devices under a launcher \
             (its -n decides), or make them equal",
            launch.launcher.name(),
            launch.world_size
        ),
        Some(n) if n > 1 && launch.launcher == Launcher::None => Ok(Some(n)),
        _ => Ok(None),
    }
}

/// The launcher that belongs to `library` among `found`, or the error that
/// names what was found and the fix.
fn choose(n: usize, found: Vec<Found>, library: &Mpi) -> anyhow::Result<Found> {
    let srun = path_dirs().iter().any(|d| d.join("srun").is_file());
    let slurm = if srun {
        format!(
            "; under Slurm, start the ranks with `srun -n {n} --mpi=pmix redline train --strategy \
             ddp ...` inside an allocation (outside one, `salloc -n {n}` first)"
        )
    } else {
        String::new()
    };
    if found.is_empty() {
        bail!(
            "--devices {n} starts the ranks with `mpirun`, which is not on PATH\nHINT: install \
             the launcher of {} (Debian/Ubuntu: apt-get install openmpi-bin), or start the ranks \
             with your cluster's launcher and --strategy ddp{slurm}",
            library.name()
        );
    }
    let mut refused = Vec::new();
    for f in found {
        match f.mpi.mismatch(library) {
            None => return Ok(f),
            Some(why) => refused.push(format!("{} ({}): {why}", f.path.display(), f.mpi.name())),
        }
    }
    bail!(
        "--devices {n}: this redline is linked with {}, and no launcher on PATH belongs to it: \
         {}\nHINT: install {}'s launcher (Debian/Ubuntu: apt-get install openmpi-bin) and put it \
         first on PATH, or rebuild redline against the MPI whose launcher you use \
         (cargo build --release --features redline/mpi finds it through pkg-config){slurm}",
        library.name(),
        refused.join("; "),
        library.name()
    )
}

/// `--devices N` without a launcher: runs this very command line again as
/// `N` ranks under the MPI launcher that belongs to this build's MPI, and
/// returns its exit status. `None` when there is nothing to spawn: no
/// `--devices`, one device, or already under a launcher.
pub fn spawn(
    devices: Option<usize>,
    strategy: &str,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let Some(n) = ranks_to_start(devices, strategy)? else {
        return Ok(None);
    };
    let Some(library) = redline_dist::mpi_library_version() else {
        bail!(
            "--devices {n}: this redline was built without MPI, so its ranks cannot talk\nHINT: \
             cargo build --release --features redline/mpi (Debian: apt-get install \
             libopenmpi-dev openmpi-bin libclang-dev)"
        );
    };
    let launcher = choose(n, on_path(), &Mpi::read(&library))?;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(&launcher.path);
    let mut shown = vec![launcher.path.display().to_string()];
    if let Mpi::Open(_) = launcher.mpi {
        // More ranks than cores is allowed (torchrun has no such rule), and
        // each rank takes its share of the cores rather than the one core
        // Open MPI binds a rank to by default.
        shown.extend(["--oversubscribe", "--bind-to", "none"].map(String::from));
        if is_root() && std::env::var_os("OMPI_ALLOW_RUN_AS_ROOT").is_none() {
            cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            println!(
                "running as root: OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                 are set for these {n} ranks only (Open MPI refuses root without them)"
            );
        }
    }
    shown.extend(["-n".to_string(), n.to_string()]);
    println!(
        "starting {n} ranks: {} {} ...",
        shown.join(" "),
        exe.display()
    );
    let status: ExitStatus = cmd
        .args(&shown[1..])
        .arg(&exe)
        .args(std::env::args_os().skip(1))
        .status()
        .map_err(|e| anyhow!("--devices {n}: starting {}: {e}", launcher.path.display()))?;
    Ok(Some(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    // What each implementation prints: Debian bookworm's Open MPI 4.1.4
    // (`mpirun --version`, MPI_Get_library_version), MPICH 4.0.2's Hydra and
    // library, Intel MPI's mpiexec.
    const OPEN_RUN: &str =
        "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n";
    const OPEN_LIB: &str =
        "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022";
    const OPEN5_RUN: &str =
        "mpirun (Open MPI) 5.0.3\n\nReport bugs to https://www.open-mpi.org/community/help/\n";
    const HYDRA_RUN: &str = "HYDRA build details:\n    Version:                                 4.0.2\n    Release Date:                            Thu Apr  7 12:34:45 CDT 2022\n";
    const MPICH_LIB: &str = "MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022\nMPICH ABI:\t14:2:2\n";
    const INTEL_RUN: &str =
        "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n";

    #[test]
    fn each_implementation_is_read_with_its_version() {
        assert_eq!(Mpi::read(OPEN_RUN), Mpi::Open("4.1.4".into()));
        assert_eq!(Mpi::read(OPEN_LIB), Mpi::Open("4.1.4".into()));
        assert_eq!(Mpi::read(OPEN5_RUN), Mpi::Open("5.0.3".into()));
        assert_eq!(Mpi::read(HYDRA_RUN), Mpi::Mpich("4.0.2".into()));
        assert_eq!(Mpi::read(MPICH_LIB), Mpi::Mpich("4.0.2".into()));
        assert_eq!(Mpi::read(INTEL_RUN), Mpi::Mpich("2021.10".into()));
        assert_eq!(
            Mpi::read("frobnicate 1.0\nmore"),
            Mpi::Other("frobnicate 1.0".into())
        );
    }

    #[test]
    fn a_launcher_of_another_mpi_is_refused_and_its_own_accepted() {
        let (open, open5, mpich) = (
            Mpi::read(OPEN_LIB),
            Mpi::read(OPEN5_RUN),
            Mpi::read(MPICH_LIB),
        );
        assert_eq!(Mpi::read(OPEN_RUN).mismatch(&open), None);
        assert_eq!(Mpi::read(HYDRA_RUN).mismatch(&mpich), None);
        assert_eq!(Mpi::read(INTEL_RUN).mismatch(&mpich), None);
        let why = Mpi::read(HYDRA_RUN).mismatch(&open).unwrap_or_default();
        assert!(why.contains("MPICH 4.0.2 and Open MPI 4.1.4"), "{why}");
        let why = open5.mismatch(&open).unwrap_or_default();
        assert!(why.contains("5.0.3 is not 4.1.4"), "{why}");
        assert_eq!(Mpi::read("x").mismatch(&open), None);
    }

    #[test]
    fn choosing_skips_the_wrong_mpi_and_names_it_when_nothing_fits() {
        let open = Mpi::read(OPEN_LIB);
        let hydra = |p: &str| Found {
            path: p.into(),
            mpi: Mpi::read(HYDRA_RUN),
        };
        let both = vec![
            hydra("/usr/bin/mpiexec"),
            Found {
                path: "/usr/bin/mpirun.openmpi".into(),
                mpi: Mpi::read(OPEN_RUN),
            },
        ];
        let chosen = choose(2, both, &open).map(|f| f.path);
        assert_eq!(chosen.ok(), Some(PathBuf::from("/usr/bin/mpirun.openmpi")));
        let e = choose(2, vec![hydra("/opt/mpich/bin/mpiexec")], &open)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("linked with Open MPI 4.1.4")
                && e.contains("/opt/mpich/bin/mpiexec (MPICH 4.0.2)")
                && e.contains("HINT: install Open MPI 4.1.4's launcher"),
            "{e}"
        );
        let e = choose(3, vec![], &open).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("`mpirun`, which is not on PATH")),
            "{e:?}"
        );
    }

    /// Before: `--strategy single --devices 2` answered with a build hint
    /// (no MPI) instead of the conflict.
    #[test]
    fn conflicting_flags_are_named() {
        let e = spawn(Some(2), "single").err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.starts_with("--strategy single runs one process")),
            "{e:?}"
        );
        let e = spawn(Some(0), "auto").err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.starts_with("--devices 0")),
            "{e:?}"
        );
    }
}
