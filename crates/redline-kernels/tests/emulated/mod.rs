//! The CUDA emulator of the `cuda_emulated*` tests: `cuda/emulate/harness.cpp`
//! (Redline's kernels compiled unchanged by the host's C++ compiler against
//! `cuda_host.h`) built once per test binary, its launcher, and the helpers
//! the tests share. Needs a C++20 compiler: `c++`, or the one `$CXX` names.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{c_char, c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{Device, Tensor};

/// `emu_launch`: kernel name, grid (x, y, z), block (x, y, z), argument addresses.
pub type Launch =
    unsafe extern "C" fn(*const c_char, u32, u32, u32, u32, u32, u32, *mut *mut c_void) -> i32;

/// The built kernels and their launcher.
pub struct Emulator {
    _lib: libloading::Library,
    /// Runs a kernel: 0 ran, 1 no such kernel, 2 a block it cannot run.
    pub launch: Launch,
}

/// The kernels, built once per test binary.
pub fn emulator() -> &'static Emulator {
    static EMU: OnceLock<Emulator> = OnceLock::new();
    EMU.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cuda/emulate/harness.cpp");
        let lib = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("redline-cuda-emulated-{}.so", std::process::id()));
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-O2", "-pthread", "-shared", "-fPIC"])
            .args(["-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("{cxx} (a C++20 compiler; set CXX) did not run: {e}"));
        assert!(
            out.status.success(),
            "{cxx} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: the library just built from harness.cpp; `emu_launch` has
        // the `Launch` signature there.
        unsafe {
            let l = libloading::Library::new(&lib).unwrap();
            let launch = *l.get::<Launch>(b"emu_launch\0").unwrap();
            let _ = std::fs::remove_file(&lib);
            Emulator { _lib: l, launch }
        }
    })
}

/// The address of a kernel argument (for a buffer, of its pointer).
pub fn arg<T>(v: &T) -> *mut c_void {
    (v as *const T).cast_mut().cast()
}

/// Runs `kernel` over `grid` blocks of `threads` threads on `args`.
pub fn launch(kernel: &str, grid: (u32, u32, u32), threads: u32, args: &mut [*mut c_void]) {
    let name = CString::new(kernel).unwrap();
    // SAFETY: `args` point at live values of the kernel's parameter types,
    // and every buffer holds what the launch's grid reads and writes.
    let rc = unsafe {
        (emulator().launch)(
            name.as_ptr(),
            grid.0,
            grid.1,
            grid.2,
            threads,
            1,
            1,
            args.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "emu_launch({kernel}) refused the launch");
}

pub fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.37 + seed).sin() * 1.3)
        .collect()
}

pub fn tensor(v: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), dims, &Device::Cpu).unwrap()
}

pub fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Largest difference over the reference's largest magnitude.
pub fn max_rel(ours: &[f32], want: &[f32]) -> f32 {
    assert_eq!(ours.len(), want.len());
    let scale = want.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
    ours.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// The linear backward's bias-gradient sum of one column, in the kernel's
/// order: row group `k` adds rows `k, k + MASK_GROUPS, ...` in order from
/// +0.0, then the groups' sums are added in group order from +0.0, in f32.
pub fn mask_sum(rows: usize, value: impl Fn(usize) -> f32) -> f32 {
    use redline_kernels::fused_gpu::MASK_GROUPS;
    (0..MASK_GROUPS)
        .map(|k| {
            (k..rows)
                .step_by(MASK_GROUPS)
                .fold(0f32, |s, r| s + value(r))
        })
        .fold(0f32, |s, p| s + p)
}

/// Runs a mask + bias-gradient `kernel` as `src/cuda/linear.rs` launches it
/// over the incoming gradient `g` (`rows x cols`) and the ReLU's output `y`
/// (none: no ReLU); returns dz and db, which start as `fill` (NaN), so an
/// element no thread writes shows.
pub fn run_mask_kernel<T: Copy>(
    kernel: &str,
    g: &[T],
    y: Option<&[T]>,
    (rows, cols): (usize, usize),
    fill: T,
) -> (Vec<T>, Vec<T>) {
    use redline_kernels::fused_gpu::{MASK_COLS, MASK_THREADS};
    let mut dz = vec![fill; rows * cols];
    let mut db = vec![fill; cols];
    let py = y.map_or(std::ptr::null(), |y| y.as_ptr());
    let (pg, pdz, pdb) = (g.as_ptr(), dz.as_mut_ptr(), db.as_mut_ptr());
    let (r32, c32) = (rows as u32, cols as u32);
    let mut args = [
        arg(&pg),
        arg(&py),
        arg(&pdz),
        arg(&pdb),
        arg(&r32),
        arg(&c32),
    ];
    let grid = (c32.div_ceil(MASK_COLS), 1, 1);
    launch(kernel, grid, MASK_THREADS, &mut args);
    (dz, db)
}

/// Outputs of the CNN block's bias + max pool + ReLU kernels.
pub struct BiasPoolRelu<T> {
    /// The pooled output.
    pub y: Vec<T>,
    /// The convolution's gradient (from the backward kernel).
    pub dconv: Vec<T>,
    /// The bias gradient (from the bias-gradient kernel).
    pub db: Vec<T>,
}

/// Runs the block's kernels (`redline_bias_pool_relu{,_bwd}_{suffix}`, then
/// `redline_sum_splits_{suffix}`) as `src/cuda/pool.rs` launches them, over `conv` (n, c, h, w),
/// `bias` (c) and the pooled output's gradient `gy`, with a `k x k` window;
/// every output starts as `fill` (NaN), so an element no thread writes shows.
/// The backward splits each channel into `splits` ranges of images (the
/// kernel takes any count from 1 to n; `block_bwd_splits` plans about 1024
/// blocks, slow to emulate, so small cases give their own).
pub fn run_bias_pool_relu<T: Copy>(
    suffix: &str,
    (conv, bias, gy): (&[T], &[T], &[T]),
    [n, c, h, w, k, splits]: [usize; 6],
    fill: T,
) -> BiasPoolRelu<T> {
    let (ph, pw) = (h / k, w / k);
    let pooled = n * c * ph * pw;
    let dims = [n, c, h, w, k, ph, pw].map(|v| v as u32);
    let mut y = vec![fill; pooled];
    let mut winner = vec![0u8; pooled];
    let (px, pb, py, pa) = (
        conv.as_ptr(),
        bias.as_ptr(),
        y.as_mut_ptr(),
        winner.as_mut_ptr(),
    );
    let mut args = vec![arg(&px), arg(&pb), arg(&py), arg(&pa)];
    args.extend(dims.iter().map(arg));
    let kernel = format!("redline_bias_pool_relu_{suffix}");
    launch(&kernel, elementwise(pooled, 256), 256, &mut args);

    let mut dconv = vec![fill; conv.len()];
    let mut partial = vec![f32::NAN; splits * c];
    let (pg, pa, pd, pp) = (
        gy.as_ptr(),
        winner.as_ptr(),
        dconv.as_mut_ptr(),
        partial.as_mut_ptr(),
    );
    let mut args = vec![arg(&pg), arg(&pa), arg(&pd), arg(&pp)];
    args.extend(dims.iter().map(arg));
    let splits32 = splits as u32;
    args.push(arg(&splits32));
    let kernel = format!("redline_bias_pool_relu_bwd_{suffix}");
    let threads = redline_kernels::pool::BLOCK_BWD_THREADS;
    launch(&kernel, (splits32, c as u32, 1), threads, &mut args);

    let mut db = vec![fill; c];
    let (pp, pd, c32) = (partial.as_ptr(), db.as_mut_ptr(), c as u32);
    let mut args = vec![arg(&pp), arg(&pd), arg(&splits32), arg(&c32)];
    let kernel = format!("redline_sum_splits_{suffix}");
    launch(&kernel, elementwise(c, 256), 256, &mut args);
    BiasPoolRelu { y, dconv, db }
}

/// The emulated convolution tests' cases, `(x dims, w dims, padding)`:
/// ragged tiles (M, N and K not multiples of the tile), padding, a 5 x 3
/// kernel, more than one tile in each direction and a weight gradient over
/// many splits.
pub const CONV_CASES: [([usize; 4], [usize; 4], usize); 4] = [
    ([2, 3, 7, 6], [4, 3, 3, 3], 1),
    ([3, 2, 9, 9], [5, 2, 5, 3], 2),
    ([2, 70, 5, 5], [65, 70, 3, 3], 1),
    ([16, 8, 14, 14], [16, 8, 3, 3], 1),
];

/// The elementwise-kernels' grid: one thread per element, at most 65535 blocks.
pub fn elementwise(n: usize, threads: u32) -> (u32, u32, u32) {
    (n.div_ceil(threads as usize).clamp(1, 65_535) as u32, 1, 1)
}

/// One pass of a convolution kernel as `src/cuda/conv.rs` launches it: the
/// two operands, an output of `len` values starting as `fill` (NaN, so an
/// element no thread writes shows), `d`'s sizes, then `chunk` (the weight
/// gradient's split length) when given.
pub struct ConvPass<'a> {
    /// The kernel's name.
    pub kernel: &'a str,
    /// The launch grid.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub threads: u32,
    /// The weight gradient's split length, for its kernels.
    pub chunk: Option<u32>,
}

impl ConvPass<'_> {
    /// Runs the pass over `a` and `b` of `d`'s sizes into `len` values of `O`.
    pub fn run<A, O: Clone>(
        &self,
        d: &redline_kernels::conv_igemm::ConvDims,
        (a, b): (&[A], &[A]),
        fill: O,
        len: usize,
    ) -> Vec<O> {
        let sizes = [d.n, d.cin, d.h, d.w, d.cout, d.kh, d.kw, d.pad].map(|v| v as u32);
        let mut out = vec![fill; len];
        let (pa, pb, po) = (a.as_ptr(), b.as_ptr(), out.as_mut_ptr());
        let mut args = vec![arg(&pa), arg(&pb), arg(&po)];
        args.extend(sizes.iter().map(arg));
        if let Some(c) = self.chunk.as_ref() {
            args.push(arg(c));
        }
        launch(self.kernel, self.grid, self.threads, &mut args);
        out
    }
}

/// candle's f32 convolution (stride 1, `d.pad`) of `xs` by `ws` and, under
/// the upstream gradient `gy`, the gradients of both: `[y, dx, dw]`,
/// flattened: what the kernels' three passes are held to.
pub fn conv_reference(
    d: &redline_kernels::conv_igemm::ConvDims,
    xs: &[f32],
    ws: &[f32],
    gy: &[f32],
) -> [Vec<f32>; 3] {
    let x = candle_core::Var::from_tensor(&tensor(xs, &[d.n, d.cin, d.h, d.w])).unwrap();
    let w = candle_core::Var::from_tensor(&tensor(ws, &[d.cout, d.cin, d.kh, d.kw])).unwrap();
    let y = x.as_tensor().conv2d(w.as_tensor(), d.pad, 1, 1, 1).unwrap();
    let grads = (&y * tensor(gy, y.dims()))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let grad = |v: &candle_core::Var| flat(grads.get(v.as_tensor()).unwrap());
    [flat(&y), grad(&x), grad(&w)]
}

/// The number of outputs of `d`'s forward.
pub fn conv_outputs(d: &redline_kernels::conv_igemm::ConvDims) -> usize {
    d.n * d.cout * d.oh() * d.ow()
}

/// `redline_sum_splits_f32`: the in-order f32 sum of `splits` partial sums of
/// `count` values each.
pub fn sum_splits_f32(partial: &[f32], splits: u32, count: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; count];
    let (pp, po, c) = (partial.as_ptr(), out.as_mut_ptr(), count as u32);
    launch(
        "redline_sum_splits_f32",
        elementwise(count, 256),
        256,
        &mut [arg(&pp), arg(&po), arg(&splits), arg(&c)],
    );
    out
}

/// Runs the f32-operand convolution kernels `redline_conv_{fwd,dx,dw}_{suffix}`
/// (`threads` per block; grids and splits from `d`, as `src/cuda/conv.rs`
/// launches them) on `xs`, `ws` and the upstream gradient `gy`, and holds
/// each pass within 1e-5 of the largest value to `want` (`[y, dx, dw]`:
/// candle's, on the values the kernels compute with); with one split, dW's
/// partial sum is the sum. Returns the forward's output.
pub fn check_f32_conv(
    case: &str,
    d: &redline_kernels::conv_igemm::ConvDims,
    (suffix, threads): (&str, u32),
    (xs, ws, gy): (&[f32], &[f32], &[f32]),
    want: &[Vec<f32>; 3],
) -> Vec<f32> {
    let run = |pass: &str, a: &[f32], b: &[f32], len: usize, grid, chunk: Option<u32>| {
        let pass = ConvPass {
            kernel: &format!("redline_conv_{pass}_{suffix}"),
            grid,
            threads,
            chunk,
        };
        pass.run(d, (a, b), f32::NAN, len)
    };
    let [y, want_dx, want_dw] = want;
    // Sums of up to 630 terms in another order than candle's (1.4e-6 seen).
    let ours = run("fwd", xs, ws, y.len(), d.fwd_grid(), None);
    let r = max_rel(&ours, y);
    assert!(r < 1e-5, "{case}: y {r:e}");
    let dx = run("dx", gy, ws, xs.len(), d.dx_grid(), None);
    let r = max_rel(&dx, want_dx);
    assert!(r < 1e-5, "{case}: dx {r:e}");
    let (grid, chunk) = d.dw_plan();
    let splits = grid.2 as usize;
    let partial = run("dw", gy, xs, splits * ws.len(), grid, Some(chunk as u32));
    let dw = sum_splits_f32(&partial, grid.2, ws.len());
    let r = max_rel(&dw, want_dw);
    assert!(r < 1e-5, "{case}: dw over {splits} splits {r:e}");
    if splits == 1 {
        assert_eq!(partial, dw, "{case}: one split is the sum");
    }
    ours
}
