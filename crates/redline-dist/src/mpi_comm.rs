//! [`Collectives`] over MPI (the `mpi` crate on the system's MPI; OpenMPI on
//! Debian), for ranks started by `mpirun`, `mpiexec` or `srun --mpi=pmix`.
//!
//! Every collective is started non-blocking and polled against a deadline
//! (`--dist-timeout`), as PyTorch's NCCL watchdog does: a rank that died or
//! hangs turns into an error on the others that names the collective, the
//! step and the last collective every rank completed, never a silent hang.
//! A collective that timed out cannot be cancelled, so its buffers are the
//! communicator's own and are never touched again: the communicator is
//! poisoned and, when dropped, aborts the job (`MPI_Abort`) rather than
//! finalizing with a collective in flight.

use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::comm::Collectives;
use crate::error::{Error, Result};
use crate::launch::{Launch, Launcher};

/// How long a collective may wait after the interrupt flag is set: long
/// enough for ranks that all got the signal to finish the step together.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Message tags of the roll call a timed-out rank makes to name the ranks
/// that are gone: the question, and the answer (`[rank, completed]`).
const ROLL_CALL: mpi::Tag = 0x7e11;
const ROLL_ANSWER: mpi::Tag = 0x7e12;

/// How long a timed-out rank waits for the roll call's answers. Live ranks
/// answer from their own polling loop within milliseconds.
const ROLL_CALL_WAIT: Duration = Duration::from_secs(3);

/// The roll call a rank makes when a signal comes while it waits: short,
/// because a launcher tearing the job down (mpirun sends SIGTERM, then
/// SIGKILL a second later) leaves little time to write the run folder.
const QUICK_ROLL_CALL_WAIT: Duration = Duration::from_millis(300);

/// The world communicator of an MPI job.
pub struct MpiComm {
    world: ManuallyDrop<SimpleCommunicator>,
    universe: ManuallyDrop<Universe>,
    rank: usize,
    size: usize,
    timeout: Duration,
    interrupt: Option<Arc<AtomicBool>>,
    state: RefCell<State>,
}

/// Buffers the collectives run on (owned here, so that a collective that
/// timed out never writes into memory someone else freed) and the record
/// of what completed.
#[derive(Default)]
struct State {
    send32: Vec<f32>,
    recv32: Vec<f32>,
    send64: Vec<f64>,
    recv64: Vec<f64>,
    bytes: Vec<u8>,
    gathered: Vec<u8>,
    log: Log,
}

/// What completed, and the first failure.
#[derive(Default)]
struct Log {
    /// The last collective that completed.
    last: String,
    /// Collectives completed so far (the roll call compares them).
    completed: u64,
    /// The first failure; every later call is refused.
    failed: Option<String>,
}

impl Log {
    /// Records `op` as completed.
    fn done(&mut self, op: &str) {
        self.last = op.to_string();
        self.completed += 1;
    }
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl MpiComm {
    /// Initializes MPI and checks that it sees the ranks `launch` describes.
    pub fn init(launch: &Launch, timeout: Duration) -> Result<Self> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::Mpi("MPI was already initialized in this process".into()))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if size != launch.world_size || rank != launch.rank {
            return Err(Error::Unsupported {
                what: format!(
                    "{} says rank {} of {}, but MPI sees rank {rank} of {size}",
                    launch.launcher.name(),
                    launch.rank,
                    launch.world_size
                ),
                hint: if size == 1 && launch.launcher == Launcher::Slurm {
                    "each rank started as a world of one: srun ran them without MPI's process \
                     management; use `srun --mpi=pmix` (`srun --mpi=list` shows what this \
                     cluster offers)"
                        .into()
                } else if size == 1 && launch.launcher != Launcher::Torchrun {
                    // Each rank a world of one: the launcher is another MPI's.
                    format!(
                        "each rank started as a world of one, so the launcher is not the one of \
                         the MPI this redline is linked with ({}); start the ranks with that \
                         MPI's own mpirun (Debian: /usr/bin/mpirun.openmpi), or rebuild redline \
                         against the launcher's MPI",
                        Self::library_version()
                    )
                } else {
                    "Redline's collectives run over MPI: start the ranks with `mpirun -n N` \
                     (or `srun --mpi=pmix` under Slurm), not with torchrun"
                        .into()
                },
            });
        }
        Ok(Self {
            world: ManuallyDrop::new(world),
            universe: ManuallyDrop::new(universe),
            rank,
            size,
            timeout,
            interrupt: None,
            state: RefCell::new(State {
                log: Log {
                    last: "MPI initialization".into(),
                    ..Log::default()
                },
                ..State::default()
            }),
        })
    }

    /// The MPI library's version string (`Open MPI v4.1.4, ...`).
    pub fn library_version() -> String {
        mpi::environment::library_version()
            .map(|v| {
                v.trim_end_matches(|c: char| c == '\0' || c.is_whitespace())
                    .to_string()
            })
            .unwrap_or_else(|_| "unknown MPI".into())
    }

    /// Refuses calls after a failure.
    fn check(&self, log: &Log, op: &str) -> Result<()> {
        match &log.failed {
            Some(first) => Err(Error::Poisoned {
                rank: self.rank,
                op: op.into(),
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Sums `buf` over the ranks (an all-reduce) through the owned buffers
    /// `send` and `recv`, which outlive a collective that timed out.
    fn sum<T: mpi::datatype::Equivalence + Copy>(
        &self,
        buf: &mut [T],
        send: &mut Vec<T>,
        recv: &mut Vec<T>,
        log: &mut Log,
        op: &str,
    ) -> Result<()> {
        send.clear();
        send.extend_from_slice(buf);
        // Any values of the right length: the reduction overwrites them.
        recv.clear();
        recv.extend_from_slice(buf);
        mpi::request::scope(|scope| {
            let req = self.world.immediate_all_reduce_into(
                scope,
                &send[..],
                &mut recv[..],
                SystemOperation::sum(),
            );
            self.wait(req, op, log)
        })?;
        buf.copy_from_slice(recv);
        Ok(())
    }

    /// Polls `req` until it completes, the timeout passes or the interrupt
    /// flag has been set for [`INTERRUPT_GRACE`]. On failure the request is
    /// abandoned (its buffers are `State`'s, never touched again) and the
    /// failure recorded in `log`.
    fn wait<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        mut req: Request<'a, D, S>,
        op: &str,
        log: &mut Log,
    ) -> Result<()> {
        let (last, completed) = (log.last.as_str(), log.completed);
        let start = Instant::now();
        let mut interrupted_at: Option<Instant> = None;
        // The quick roll call of a signal: when it started, the answers so far.
        let mut roll: Option<(Instant, Vec<Option<u64>>)> = None;
        let mut polls = 0u64;
        loop {
            match req.test() {
                Ok(_) => return Ok(()),
                Err(r) => req = r,
            }
            polls += 1;
            let waited = start.elapsed();
            if polls.is_multiple_of(256) {
                self.answer_roll_calls(completed);
            }
            let err = if waited > self.timeout {
                Some(Error::Timeout {
                    rank: self.rank,
                    op: op.into(),
                    timeout_s: self.timeout.as_secs_f64(),
                    missing: self.roll_call(completed),
                    last: last.into(),
                })
            } else if let Some(at) = interrupted_at {
                (at.elapsed() > INTERRUPT_GRACE).then(|| Error::Interrupted {
                    rank: self.rank,
                    op: op.into(),
                    waited_s: waited.as_secs_f64(),
                    last: last.into(),
                })
            } else {
                if self
                    .interrupt
                    .as_ref()
                    .is_some_and(|f| f.load(Ordering::Relaxed))
                {
                    // A signal while waiting: if a rank is gone, the
                    // launcher is ending the job; find out (without
                    // blocking: the collective may still complete) and say
                    // who at once.
                    interrupted_at = Some(Instant::now());
                    roll = Some((Instant::now(), self.start_roll_call(completed)));
                }
                None
            };
            let mut err = err;
            if let (None, Some((at, answered))) = (&err, roll.as_mut()) {
                while self.collect_answers(answered, completed) {}
                if answered.iter().all(Option::is_some) {
                    // Everyone is alive: wait out the grace as before.
                    roll = None;
                } else if at.elapsed() > QUICK_ROLL_CALL_WAIT {
                    err = Some(Error::RankLost {
                        rank: self.rank,
                        op: op.into(),
                        missing: describe_roll_call(answered, completed),
                        last: last.into(),
                    });
                }
            }
            if let Some(e) = err {
                // The collective cannot be cancelled: forget it, keep its
                // buffers (they are `State`'s and never touched again).
                // SAFETY: the buffers outlive the process (the communicator is
                // poisoned, and aborts the job instead of dropping them).
                let _ = unsafe { req.into_raw() };
                log.failed = Some(e.to_string());
                return Err(e);
            }
            // Short waits spin (an all-reduce over shared memory takes
            // microseconds); long ones give the core to the other ranks and
            // threads (2 ranks on 2 cores are oversubscribed).
            if polls < 64 {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(50) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

impl MpiComm {
    /// Answers every pending roll call with this rank and the collectives
    /// it completed.
    fn answer_roll_calls(&self, completed: u64) {
        while let Some((msg, status)) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(ROLL_CALL)
        {
            let mut asker = [0u64; 2];
            msg.matched_receive_into(&mut asker[..]);
            let answer = [self.rank as u64, completed];
            self.world
                .process_at_rank(status.source_rank())
                .send_with_tag(&answer[..], ROLL_ANSWER);
        }
    }

    /// Asks every other rank to answer, waits [`ROLL_CALL_WAIT`], and says
    /// which did not (gone or hung outside any collective) and which are
    /// waiting in a different collective than this rank.
    fn roll_call(&self, completed: u64) -> String {
        describe_roll_call(
            &self.roll_call_answers(completed, ROLL_CALL_WAIT),
            completed,
        )
    }

    /// Each rank's completed count as it answered the roll call within
    /// `wait` (`None`: no answer).
    fn roll_call_answers(&self, completed: u64, wait: Duration) -> Vec<Option<u64>> {
        let mut answered = self.start_roll_call(completed);
        let start = Instant::now();
        while start.elapsed() < wait && answered.iter().any(Option::is_none) {
            if !self.collect_answers(&mut answered, completed) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        answered
    }

    /// Asks every other rank to answer; returns the answers so far (this
    /// rank's own).
    fn start_roll_call(&self, completed: u64) -> Vec<Option<u64>> {
        let me = [self.rank as u64, completed];
        for r in (0..self.size).filter(|&r| r != self.rank) {
            // Small messages are sent eagerly: this returns even if `r` hangs.
            self.world
                .process_at_rank(r as i32)
                .send_with_tag(&me[..], ROLL_CALL);
        }
        let mut answered: Vec<Option<u64>> = vec![None; self.size];
        answered[self.rank] = Some(completed);
        answered
    }

    /// Answers pending roll calls and takes one answer into `answered`, if
    /// one came; whether one did.
    fn collect_answers(&self, answered: &mut [Option<u64>], completed: u64) -> bool {
        self.answer_roll_calls(completed);
        let Some((msg, _)) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(ROLL_ANSWER)
        else {
            return false;
        };
        let mut a = [0u64; 2];
        msg.matched_receive_into(&mut a[..]);
        if let (Some(&r), Some(&c)) = (a.first(), a.get(1)) {
            if let Some(slot) = answered.get_mut(r as usize) {
                *slot = Some(c);
            }
        }
        true
    }
}

/// The roll call's finding as the timeout error's clause.
fn describe_roll_call(answered: &[Option<u64>], completed: u64) -> String {
    let list = |rs: &[usize]| -> String {
        let names: Vec<String> = rs.iter().map(ToString::to_string).collect();
        format!(
            "{} {}",
            if rs.len() == 1 { "rank" } else { "ranks" },
            names.join(", ")
        )
    };
    let silent: Vec<usize> = (0..answered.len())
        .filter(|&r| answered[r].is_none())
        .collect();
    let elsewhere: Vec<usize> = (0..answered.len())
        .filter(|&r| answered[r].is_some_and(|c| c != completed))
        .collect();
    let mut parts = Vec::new();
    if !silent.is_empty() {
        parts.push(format!(
            "{} did not answer (died, or hangs outside communication)",
            list(&silent)
        ));
    }
    if !elsewhere.is_empty() {
        parts.push(format!(
            "{} waits in a different collective (the ranks' calls diverged)",
            list(&elsewhere)
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

impl Collectives for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce_sum(&self, buf: &mut [f32], op: &str) -> Result<()> {
        let mut st = self.state.borrow_mut();
        let State {
            send32,
            recv32,
            log,
            ..
        } = &mut *st;
        self.check(log, op)?;
        self.sum(buf, send32, recv32, log, op)?;
        log.done(op);
        Ok(())
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64], op: &str) -> Result<()> {
        let mut st = self.state.borrow_mut();
        let State {
            send64,
            recv64,
            log,
            ..
        } = &mut *st;
        self.check(log, op)?;
        self.sum(buf, send64, recv64, log, op)?;
        log.done(op);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize, op: &str) -> Result<()> {
        let mut st = self.state.borrow_mut();
        let State { recv32, log, .. } = &mut *st;
        self.check(log, op)?;
        if root >= self.size {
            return Err(Error::Mpi(format!(
                "{op}: root {root} of {} ranks",
                self.size
            )));
        }
        recv32.clear();
        recv32.extend_from_slice(buf);
        mpi::request::scope(|scope| {
            let req = self
                .world
                .process_at_rank(root as i32)
                .immediate_broadcast_into(scope, &mut recv32[..]);
            self.wait(req, op, log)
        })?;
        buf.copy_from_slice(recv32);
        log.done(op);
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8], op: &str) -> Result<Vec<Vec<u8>>> {
        let mut st = self.state.borrow_mut();
        let State {
            send64,
            recv64,
            bytes,
            gathered,
            log,
            ..
        } = &mut *st;
        self.check(log, op)?;
        // The lengths first (a sum of one-hot vectors), then every rank's
        // bytes padded to the longest.
        let mut lens = vec![0.0f64; self.size];
        lens[self.rank] = mine.len() as f64;
        self.sum(&mut lens, send64, recv64, log, op)?;
        let longest = lens.iter().fold(0usize, |m, &l| m.max(l as usize));
        bytes.clear();
        bytes.extend_from_slice(mine);
        bytes.resize(longest, 0);
        gathered.resize(longest * self.size, 0);
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_into(scope, &bytes[..], &mut gathered[..]);
            self.wait(req, op, log)
        })?;
        log.done(op);
        Ok(lens
            .iter()
            .enumerate()
            .map(|(r, &l)| gathered[r * longest..r * longest + l as usize].to_vec())
            .collect())
    }

    fn barrier(&self, op: &str) -> Result<()> {
        let mut st = self.state.borrow_mut();
        let log = &mut st.log;
        self.check(log, op)?;
        let req = self.world.immediate_barrier();
        self.wait(req, op, log)?;
        log.done(op);
        Ok(())
    }

    fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let failed = self.state.borrow().log.failed.is_some();
        if failed {
            // A collective is still in flight on this rank: finalizing would
            // wait for it forever. End the whole job, as NCCL's watchdog does.
            self.world.abort(1);
        }
        // SAFETY: each is dropped once, here; the world communicator before
        // the universe that finalizes MPI.
        unsafe {
            ManuallyDrop::drop(&mut self.world);
            ManuallyDrop::drop(&mut self.universe);
        }
    }
}
