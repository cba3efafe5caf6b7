//! The error type of `redline-dist`.

/// Errors of launching ranks and of their collectives.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The launcher's environment is inconsistent (a rank past the world
    /// size, a value that is not a number).
    #[error("{var}={value}: {why}\nHINT: {hint}")]
    Environment {
        /// The variable read.
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
        /// How to launch instead.
        hint: String,
    },
    /// The launcher says there are several ranks, but this build cannot join them.
    #[error("{what}\nHINT: {hint}")]
    Unsupported {
        /// What cannot be done.
        what: String,
        /// What to do instead.
        hint: String,
    },
    /// MPI could not be started, or a call failed.
    #[error("MPI: {0}")]
    Mpi(String),
    /// A collective did not complete within the timeout: another rank died
    /// or hangs.
    #[error(
        "rank {rank}: {op} did not complete within {timeout_s:.0} s{missing}; the last operation \
         every rank completed was {last}\nHINT: a rank died or hangs: look for its error above \
         (and mpirun's message naming it); raise --dist-timeout if steps are legitimately that slow"
    )]
    Timeout {
        /// This rank.
        rank: usize,
        /// The collective that timed out (and the step it belongs to).
        op: String,
        /// The timeout in seconds.
        timeout_s: f64,
        /// ": ranks 1, 3 did not answer" where the roll call found them, else empty.
        missing: String,
        /// The last collective that completed on this rank.
        last: String,
    },
    /// A collective was interrupted by a signal while waiting for other ranks
    /// (the launcher tearing the job down after one rank failed).
    #[error(
        "rank {rank}: stopped by a signal while waiting {waited_s:.1} s for the other ranks in {op}; \
         the last operation every rank completed was {last}\nHINT: another rank probably failed: \
         look for its error above (and mpirun's message naming it)"
    )]
    Interrupted {
        /// This rank.
        rank: usize,
        /// The collective that was waiting.
        op: String,
        /// How long it had waited.
        waited_s: f64,
        /// The last collective that completed on this rank.
        last: String,
    },
    /// A signal came while waiting in a collective, and a roll call found
    /// ranks gone (the launcher is ending the job because one died).
    #[error(
        "rank {rank}: {op} cannot complete{missing}; the last operation every rank completed was \
         {last}\nHINT: look for that rank's error above (and the launcher's message naming \
         it); a run with checkpoints continues with `redline train --resume RUN_DIR`"
    )]
    RankLost {
        /// This rank.
        rank: usize,
        /// The collective that was waiting.
        op: String,
        /// ": rank 1 did not answer (...)".
        missing: String,
        /// The last collective that completed on this rank.
        last: String,
    },
    /// A collective after an earlier one failed: the communicator is unusable.
    #[error("rank {rank}: {op}: the communicator failed earlier ({first})")]
    Poisoned {
        /// This rank.
        rank: usize,
        /// The collective refused.
        op: String,
        /// The first failure.
        first: String,
    },
    /// The ranks disagree on something that must be equal everywhere.
    #[error("{0}")]
    Mismatch(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
