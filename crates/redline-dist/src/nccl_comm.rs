//! [`Collectives`] whose float all-reduce and broadcast run on the GPU over
//! NCCL (cudarc's bindings, feature `nccl`), one communicator per rank on
//! the rank's CUDA stream. NCCL's unique id is made by rank 0 and handed to
//! the others over the host backend (MPI, or [`crate::Single`] for a world
//! of one); the collectives NCCL has no use for here (f64 metric sums, the
//! byte all-gather, the barrier) stay on the host backend.
//!
//! Every NCCL collective is waited for against the timeout by polling an
//! event recorded after it, as PyTorch's NCCL watchdog does; one that does
//! not complete poisons the communicator, whose drop aborts it
//! (`ncclCommAbort`) rather than waiting forever.
//!
//! The trait hands host slices in and out, so each call copies the buffer
//! to the device and back. The gradients the trainer reduces today are
//! packed on the host, so this costs nothing extra there; a device-side
//! bucket path is the next step once a multi-GPU machine can measure it.

use std::cell::RefCell;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redline_core::cuda::cudarc::driver::{CudaSlice, CudaStream};
use redline_core::cuda::cudarc::nccl::{Comm, Id, ReduceOp};

use crate::comm::Collectives;
use crate::error::{Error, Result};

/// The NCCL communicator of one rank, with a host backend beside it.
pub struct NcclComm {
    comm: Comm,
    stream: Arc<CudaStream>,
    host: Box<dyn Collectives>,
    timeout: Duration,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    /// The device buffer collectives run in (grown, never shrunk).
    buf: Option<CudaSlice<f32>>,
    /// The last collective that completed.
    last: String,
    /// The first failure; later calls are refused.
    failed: Option<String>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.comm.rank())
            .field("world_size", &self.comm.world_size())
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn nccl(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Mpi(format!("NCCL: {what}: {e:?}"))
}

impl NcclComm {
    /// Joins the ranks of `host` in one NCCL communicator on `stream` (the
    /// rank's device): rank 0 makes the unique id, the host backend gives it
    /// to every rank, then each initializes its rank.
    pub fn init(
        stream: Arc<CudaStream>,
        host: Box<dyn Collectives>,
        timeout: Duration,
    ) -> Result<Self> {
        let (rank, world) = (host.rank(), host.world_size());
        let mine: Vec<u8> = if rank == 0 {
            let id = Id::new().map_err(|e| nccl("making the unique id", e))?;
            id.internal().iter().map(|&c| c as u8).collect()
        } else {
            Vec::new()
        };
        let all = host.all_gather_bytes(&mine, "handing out NCCL's unique id")?;
        let bytes = all
            .first()
            .filter(|b| b.len() == 128)
            .ok_or_else(|| nccl("the unique id from rank 0", "not 128 bytes"))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(bytes) {
            *d = *s as std::ffi::c_char;
        }
        let comm = Comm::from_rank(stream.clone(), rank, world, Id::uninit(internal))
            .map_err(|e| nccl(&format!("initializing rank {rank} of {world}"), e))?;
        Ok(Self {
            comm,
            stream,
            host,
            timeout,
            state: RefCell::new(State {
                last: "NCCL initialization".into(),
                ..State::default()
            }),
        })
    }

    /// Runs `launch` (an NCCL collective on the first `n` elements of the
    /// device buffer, which then hold `buf`) and copies the result back into `buf`, waiting at most the
    /// timeout for it.
    fn on_device(
        &self,
        buf: &mut [f32],
        op: &str,
        launch: impl FnOnce(&Comm, &mut CudaSlice<f32>, usize) -> Result<()>,
    ) -> Result<()> {
        let mut st = self.state.borrow_mut();
        if let Some(first) = &st.failed {
            return Err(Error::Poisoned {
                rank: self.rank(),
                op: op.into(),
                first: first.clone(),
            });
        }
        if buf.is_empty() {
            return Ok(());
        }
        let n = buf.len();
        let grow = st.buf.as_ref().is_none_or(|d| d.len() < n);
        if grow {
            st.buf = Some(
                self.stream
                    .alloc_zeros::<f32>(n)
                    .map_err(|e| nccl("allocating the collective's buffer", e))?,
            );
        }
        let State {
            buf: dev,
            last,
            failed,
        } = &mut *st;
        let dev = dev
            .as_mut()
            .ok_or_else(|| nccl("the collective's buffer", "missing"))?;
        self.stream
            .memcpy_htod(&*buf, &mut dev.slice_mut(..n))
            .map_err(|e| nccl("copying to the device", e))?;
        launch(&self.comm, dev, n)?;
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| nccl("recording the collective's event", e))?;
        let start = Instant::now();
        loop {
            match done.try_is_complete() {
                Ok(true) => break,
                Ok(false) if start.elapsed() > self.timeout => {
                    let e = Error::Timeout {
                        rank: self.rank(),
                        op: op.into(),
                        timeout_s: self.timeout.as_secs_f64(),
                        missing: String::new(),
                        last: last.clone(),
                    };
                    *failed = Some(e.to_string());
                    return Err(e);
                }
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => {
                    let e = nccl(op, e);
                    *failed = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        self.stream
            .memcpy_dtoh(&dev.slice(..n), buf)
            .map_err(|e| nccl("copying back to the host", e))?;
        *last = op.to_string();
        Ok(())
    }
}

impl Collectives for NcclComm {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce_sum(&self, buf: &mut [f32], op: &str) -> Result<()> {
        self.on_device(buf, op, |comm, dev, n| {
            comm.all_reduce_in_place(&mut dev.slice_mut(..n), &ReduceOp::Sum)
                .map(|_| ())
                .map_err(|e| nccl(op, e))
        })
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64], op: &str) -> Result<()> {
        self.host.all_reduce_sum_f64(buf, op)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize, op: &str) -> Result<()> {
        if root >= self.world_size() {
            return Err(nccl(op, format!("root {root} of {}", self.world_size())));
        }
        self.on_device(buf, op, |comm, dev, n| {
            comm.broadcast_in_place(&mut dev.slice_mut(..n), root as i32)
                .map(|_| ())
                .map_err(|e| nccl(op, e))
        })
    }

    fn all_gather_bytes(&self, mine: &[u8], op: &str) -> Result<Vec<Vec<u8>>> {
        self.host.all_gather_bytes(mine, op)
    }

    fn barrier(&self, op: &str) -> Result<()> {
        self.host.barrier(op)
    }

    fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.host.set_interrupt(flag);
    }
}
