//! The argument structs of the multi-tensor optimizer kernels
//! (`cuda/optim.cu`), filled from the tensors' addresses: what the GPU path
//! passes by value at each launch, and what the emulated-kernel tests pass
//! with host addresses (`tests/cuda_emulated.rs`).

use crate::multi_tensor::{Launch, MAX_TENSORS};
use crate::optim::{AdamStep, SgdStep};
use crate::optim_math::{AdamConsts, SgdConsts};

/// `struct TensorList` of `cuda/optim.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TensorList {
    /// Parameters (f32 addresses), updated in place.
    pub p: [u64; MAX_TENSORS],
    /// Gradients.
    pub g: [u64; MAX_TENSORS],
    /// Adam: first moments; SGD: momentum buffers (0 without momentum).
    pub a: [u64; MAX_TENSORS],
    /// Adam: second moments; SGD: unused (0).
    pub b: [u64; MAX_TENSORS],
    /// Elements of each tensor.
    pub n: [u64; MAX_TENSORS],
    /// First block of each tensor, then the total ([`Launch::chunk_start`]).
    pub chunk_start: [u32; MAX_TENSORS + 1],
    /// Tensors in this launch.
    pub count: i32,
}
const _: () = assert!(std::mem::size_of::<TensorList>() == 1416);

/// `struct AdamHyper` of `cuda/optim.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AdamHyper {
    /// Address of the step count (f64), advanced before the launch.
    pub step: u64,
    /// Address of the learning rate (f64).
    pub lr: u64,
    /// Address of the loss scaler's overflow flag (f32; non-zero: the
    /// launch changes nothing), or 0 without a scaler.
    pub skip: u64,
    /// ln(beta1), for the bias correction 1 - beta1^step.
    pub ln_b1: f64,
    /// ln(beta2).
    pub ln_b2: f64,
    /// -weight_decay, for AdamW's decay factor 1 - lr * wd.
    pub neg_wd: f64,
    /// 1 - beta1.
    pub w1: f32,
    /// beta2.
    pub b2: f32,
    /// 1 - beta2.
    pub w2: f32,
    /// epsilon.
    pub eps: f32,
    /// Adam's L2 term (0 for AdamW).
    pub l2: f32,
    /// 1: AdamW's decoupled decay.
    pub decoupled: i32,
}
const _: () = assert!(std::mem::size_of::<AdamHyper>() == 72);

/// `struct SgdHyper` of `cuda/optim.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SgdHyper {
    /// Address of the step count (f64).
    pub step: u64,
    /// Address of the learning rate (f64).
    pub lr: u64,
    /// As [`AdamHyper::skip`].
    pub skip: u64,
    /// Weight decay (L2).
    pub wd: f32,
    /// Momentum.
    pub mom: f32,
    /// 1 - dampening.
    pub damp: f32,
    /// 1: Nesterov momentum.
    pub nesterov: i32,
}
const _: () = assert!(std::mem::size_of::<SgdHyper>() == 40);

impl AdamHyper {
    /// The fixed constants of `hp`, rounded as the generic path's; the
    /// kernel computes the per-step ones from the step count and learning
    /// rate at the addresses `step` and `lr` (f64).
    pub fn new(hp: AdamStep, step: u64, lr: u64) -> Self {
        let c = AdamConsts::from_parts(hp, (), (), None);
        let (b1, b2) = hp.betas;
        Self {
            step,
            lr,
            skip: 0,
            ln_b1: b1.ln(),
            ln_b2: b2.ln(),
            neg_wd: -hp.weight_decay,
            w1: c.w1,
            b2: c.b2,
            w2: c.w2,
            eps: c.eps,
            l2: c.l2,
            decoupled: i32::from(hp.decoupled && hp.weight_decay != 0.0),
        }
    }

    /// These constants, with the update skipped when the f32 at `flag` is
    /// non-zero (the loss scaler's overflow flag; 0: never skipped).
    pub fn skipping(self, flag: u64) -> Self {
        Self { skip: flag, ..self }
    }
}

impl SgdHyper {
    /// The constants of `hp`, with the step count and learning rate read
    /// from the addresses `step` and `lr` (f64).
    pub fn new(hp: SgdStep, step: u64, lr: u64) -> Self {
        let c = SgdConsts::with_lr(hp, ());
        Self {
            step,
            lr,
            skip: 0,
            wd: c.wd,
            mom: c.mom,
            damp: c.damp,
            nesterov: i32::from(c.nesterov),
        }
    }

    /// As [`AdamHyper::skipping`].
    pub fn skipping(self, flag: u64) -> Self {
        Self { skip: flag, ..self }
    }
}

/// Fills one launch's argument struct from the items' addresses (`ptrs`
/// holds `per_item` addresses per item: p, g, a, b).
pub fn tensor_list(launch: &Launch, ptrs: &[u64], per_item: usize, sizes: &[usize]) -> TensorList {
    let mut l = TensorList {
        p: [0; MAX_TENSORS],
        g: [0; MAX_TENSORS],
        a: [0; MAX_TENSORS],
        b: [0; MAX_TENSORS],
        n: [0; MAX_TENSORS],
        chunk_start: [0; MAX_TENSORS + 1],
        count: launch.tensors.len() as i32,
    };
    for (slot, &i) in launch.tensors.iter().enumerate() {
        let at = |k: usize| ptrs.get(i * per_item + k).copied().unwrap_or(0);
        l.p[slot] = at(0);
        l.g[slot] = at(1);
        l.a[slot] = if per_item > 2 { at(2) } else { 0 };
        l.b[slot] = if per_item > 3 { at(3) } else { 0 };
        l.n[slot] = sizes[i] as u64;
    }
    l.chunk_start[..launch.chunk_start.len()].copy_from_slice(&launch.chunk_start);
    l
}
