//! The GPU stage (built with the `cuda` feature): pinned host buffers, one
//! copy stream, an event per batch.
//!
//! The copy stream is a raw driver stream, not one of cudarc's: a second
//! cudarc stream puts the whole context in cudarc's multi-stream mode, where
//! every device buffer records an event at each use and every kernel waits on
//! the events of its operands. That costs host time per launch, and a CUDA
//! graph capture fails on the first wait for an event recorded before it
//! (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION` from `cuStreamWaitEvent`, seen on
//! an H100: `bench/results/h100-2026-11-25/`). Here the ordering is explicit:
//! the copy stream waits for the compute stream's allocation of the batch,
//! the compute stream waits for the copy ([`Fence`]), and the host waits for
//! a slot's last copy before it refills the slot.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, PinnedHostSlice,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Storage, Tensor};

use crate::dataset::{batch_shape, row, Dataset, TargetKind, TargetsMut};
use crate::error::{Error, Result};
use crate::stage::{byte_table, channels, Fence, Stage, Staged};

fn cuda(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Candle(candle_core::Error::Msg(format!("CUDA {what}: {e:?}")))
}

/// A slot's pinned target buffer, typed as the data set's targets.
enum PinnedTargets {
    Classes(PinnedHostSlice<u32>),
    Values(PinnedHostSlice<f32>),
}

/// A non-blocking driver stream, destroyed on drop.
struct CopyStream(sys::CUstream);

// SAFETY: a CUstream handle may be used from any thread of its context.
unsafe impl Send for CopyStream {}

impl Drop for CopyStream {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `result::stream::create` and is
        // destroyed once; queued work still completes (cuStreamDestroy).
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

/// A slot's pinned input buffer: values, or bytes that the device
/// normalises ([`Staged::ready`]).
enum PinnedX {
    Values(PinnedHostSlice<f32>),
    Bytes(PinnedHostSlice<u8>),
}

/// One staging slot: pinned buffers and the event of their last copy.
struct Slot {
    x: PinnedX,
    y: PinnedTargets,
    /// Recorded on the copy stream after the slot's copies (the batch's
    /// fence event).
    copied: Option<Arc<CudaEvent>>,
}

/// Pinned staging slots and an asynchronous copy stream.
pub struct PinnedStage {
    device: CudaDevice,
    copy: CopyStream,
    /// Recorded on the compute stream after each batch's allocation; the
    /// copy stream waits on it (one event, recorded again per batch: a
    /// wait takes the record before it).
    allocated: CudaEvent,
    slots: Vec<Slot>,
    batch: usize,
    /// With bytes: the device's table that normalises them ([`byte_table`]).
    table: Option<Tensor>,
}

impl PinnedStage {
    /// `slots` pinned buffers of `batch` samples for `device`. Data of
    /// 8-bit pixels (decoded images) crosses as bytes, a quarter of fp32's,
    /// and is normalised on the device.
    pub fn new(
        device: &CudaDevice,
        data: &dyn Dataset,
        batch: usize,
        slots: usize,
    ) -> Result<Self> {
        let ctx = device.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(|e| cuda("context", e))?;
        let copy = CopyStream(
            result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(|e| cuda("copy stream", e))?,
        );
        let norm = data.byte_norm();
        let table = match &norm {
            Some(n) => Some(byte_table(
                n,
                channels(data),
                batch,
                &candle_core::Device::Cuda(device.clone()),
            )?),
            None => None,
        };
        let mut bufs = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            // SAFETY: every element is written by `gather` (or `gather_bytes`)
            // before it is copied (the tail of a partial batch is copied but
            // never read: the tensor is narrowed to the batch).
            let x = match norm {
                Some(_) => PinnedX::Bytes(
                    unsafe { ctx.alloc_pinned::<u8>(batch * row(data)) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
                None => PinnedX::Values(
                    unsafe { ctx.alloc_pinned::<f32>(batch * row(data)) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
            };
            let y = match data.target() {
                TargetKind::Classes(_) | TargetKind::Tokens { .. } => PinnedTargets::Classes(
                    unsafe { ctx.alloc_pinned::<u32>(batch * data.target().width()) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
                TargetKind::Values(w) => PinnedTargets::Values(
                    unsafe { ctx.alloc_pinned::<f32>(batch * w) }
                        .map_err(|e| cuda("pinned allocation", e))?,
                ),
            };
            bufs.push(Slot { x, y, copied: None });
        }
        Ok(Self {
            device: device.clone(),
            copy,
            allocated: ctx.new_event(None).map_err(|e| cuda("event", e))?,
            slots: bufs,
            batch,
            table,
        })
    }
}

/// Queues the copy of a whole pinned slot into fresh device memory: the
/// buffer is allocated on the compute stream, and the copy stream waits for
/// that (`allocated`) before it writes.
fn upload<
    T: candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
>(
    compute: &Arc<CudaStream>,
    copy: &CopyStream,
    allocated: &CudaEvent,
    host: &PinnedHostSlice<T>,
) -> Result<CudaSlice<T>> {
    // SAFETY: the copy below writes every element before any use.
    let mut d = unsafe { compute.alloc::<T>(host.len()) }.map_err(|e| cuda("alloc", e))?;
    allocated.record(compute).map_err(|e| cuda("event", e))?;
    let src = host.as_slice().map_err(|e| cuda("pinned slot", e))?;
    let dst = {
        let (ptr, _sync) = d.device_ptr_mut(compute);
        ptr
    };
    // SAFETY: `dst` holds `src.len()` elements; the wait orders the copy
    // after the allocation; the pinned source outlives the copy (the host
    // waits on the slot's event before it writes the slot again, and the
    // stage is dropped only after its copies: `Drop` below).
    unsafe {
        result::stream::wait_event(
            copy.0,
            allocated.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
        .map_err(|e| cuda("stream wait", e))?;
        result::memcpy_htod_async(dst, src, copy.0).map_err(|e| cuda("copy", e))?;
    }
    Ok(d)
}

/// A device slice as a tensor of `shape` (no copy).
fn wrap<T: candle_core::cuda_backend::CudaDType>(
    device: &CudaDevice,
    slice: CudaSlice<T>,
    shape: Vec<usize>,
) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(slice, device.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// A pinned slot buffer that can be sent to the device as a tensor.
trait Upload {
    /// Queues the copy of the whole buffer ([`upload`]) and wraps the device
    /// memory as a tensor of `shape`.
    fn send(
        &self,
        device: &CudaDevice,
        compute: &Arc<CudaStream>,
        copy: &CopyStream,
        allocated: &CudaEvent,
        shape: Vec<usize>,
    ) -> Result<Tensor>;
}

impl<T> Upload for PinnedHostSlice<T>
where
    T: candle_core::cuda_backend::CudaDType
        + candle_core::cuda_backend::cudarc::driver::DeviceRepr
        + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
{
    fn send(
        &self,
        device: &CudaDevice,
        compute: &Arc<CudaStream>,
        copy: &CopyStream,
        allocated: &CudaEvent,
        shape: Vec<usize>,
    ) -> Result<Tensor> {
        Ok(wrap(device, upload(compute, copy, allocated, self)?, shape))
    }
}

impl Stage for PinnedStage {
    fn stage(&mut self, slot: usize, data: &dyn Dataset, idx: &[u32]) -> Result<Staged> {
        let n = self.slots.len();
        let compute = self.device.cuda_stream();
        let ctx = compute.context().clone();
        let s = &mut self.slots[slot % n];
        if let Some(done) = &s.copied {
            // Waits (sleeping) for this slot's previous copy to finish.
            done.synchronize().map_err(|e| cuda("pinned slot", e))?;
        }
        {
            let y = match &mut s.y {
                PinnedTargets::Classes(v) => {
                    TargetsMut::Classes(v.as_mut_slice().map_err(|e| cuda("pinned slot", e))?)
                }
                PinnedTargets::Values(v) => {
                    TargetsMut::Values(v.as_mut_slice().map_err(|e| cuda("pinned slot", e))?)
                }
            };
            match &mut s.x {
                PinnedX::Values(h) => data.gather(
                    idx,
                    h.as_mut_slice().map_err(|e| cuda("pinned slot", e))?,
                    y,
                )?,
                PinnedX::Bytes(h) => data.gather_bytes(
                    idx,
                    h.as_mut_slice().map_err(|e| cuda("pinned slot", e))?,
                    y,
                )?,
            }
        }
        let (b, y_shape) = (idx.len(), data.target().batch_shape(self.batch));
        let x_shape = batch_shape(data, self.batch);
        let send = |host: &dyn Upload, shape| {
            host.send(&self.device, &compute, &self.copy, &self.allocated, shape)
        };
        let x = match &s.x {
            PinnedX::Values(h) => send(h, x_shape)?,
            PinnedX::Bytes(h) => send(h, x_shape)?,
        };
        let y = match &s.y {
            PinnedTargets::Classes(h) => send(h, y_shape)?,
            PinnedTargets::Values(h) => send(h, y_shape)?,
        };
        let event = Arc::new(ctx.new_event(None).map_err(|e| cuda("event", e))?);
        // SAFETY: the event and the stream belong to this context.
        unsafe { result::event::record(event.cu_event(), self.copy.0) }
            .map_err(|e| cuda("event", e))?;
        s.copied = Some(event.clone());
        Ok(Staged {
            x: x.narrow(0, 0, b)?,
            y: y.narrow(0, 0, b)?,
            fence: Fence::Cuda { event, compute },
            values: self.table.clone(),
        })
    }

    fn slots(&self) -> usize {
        self.slots.len()
    }
}

impl Drop for PinnedStage {
    fn drop(&mut self) {
        // The pinned buffers are freed after this: their copies finish first.
        for s in &self.slots {
            if let Some(done) = &s.copied {
                let _ = done.synchronize();
            }
        }
    }
}
