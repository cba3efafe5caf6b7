// The implicit-GEMM convolution of conv.cu on tensor cores, for operands in
// a 16-bit format (bf16 or fp16: `--precision bf16-mixed | 16-mixed |
// bf16-true`) or f32 rounded to TF32 (`--matmul-precision high`, as
// PyTorch's default cuDNN convolutions): the same gathers (conv.cu's
// functors), the same 64 x 64 block tiles and launch grids, and the products
// by the warp-wide `mma.sync` (m16n8k16 for 16 bits, m16n8k8 for TF32) with
// f32 accumulation (how cuBLAS's and cuDNN's GEMMs accumulate, and so
// PyTorch's autocast). The 16-bit forward and input gradient round their f32
// sums to the format once, when stored; the weight gradient's splits write
// f32 partial sums, added in split order (and, in 16 bits, rounded once by
// redline_sum_splits_{bf16,f16}).
//
// 128 threads (4 warps, 2 x 2), each warp a 32 x 32 quarter of the tile: 2
// x 4 mma tiles of 16 x 8, over k in stages of 16 in shared memory (one
// m16n8k16, or two m16n8k8). Fragments follow the PTX ISA's layouts (lane =
// 4 * group + t; C (16 x 8): c[0..1] = (group, 2t..2t+1), c[2..3] = (group
// + 8, 2t..)):
//   m16n8k16, 16-bit: A (16 x 16, row): a[0] = (group, 2t..2t+1),
//     a[1] = (group + 8, 2t..), a[2] = (group, 2t+8..), a[3] = (group + 8,
//     2t+8..); B (16 x 8, col): b[0] = (k 2t..2t+1, n group), b[1] = (k
//     2t+8.., n group); each register holds its lower-k value in its low 16
//     bits.
//   m16n8k8, TF32: A (16 x 8): a[0] = (group, t), a[1] = (group + 8, t),
//     a[2] = (group, t+4), a[3] = (group + 8, t+4); B (8 x 8): b[0] = (k t,
//     n group), b[1] = (k t+4, n group).
// The instructions need sm_80 or newer (build.rs builds for
// CUDA_COMPUTE_CAP, 90 by default); in the host emulator (cuda/emulate) an
// mma is the same products from the same registers, summed in f32 by fmaf.

#define MMA_BM 64
#define MMA_BN 64
#define MMA_BK 16
#define MMA_PAD 8  // rows of 24 halves or 20 words: the fragment reads hit 32 banks
#define MMA_THREADS 128

// The tensor-core kernels exist in builds for sm_80 and newer (and the
// emulator); src/cuda/conv.rs says so when a build for an older GPU lacks them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

// f32 rounded to TF32 (10 mantissa bits) to nearest, ties away from zero
// (`cvt.rna.tf32.f32`), the low 13 bits cleared; inf and NaN kept. The same
// integer arithmetic on the GPU and in the emulator.
__device__ __forceinline__ unsigned int tf32_bits(float x) {
    unsigned int b = __float_as_uint(x);
    if ((b & 0x7f800000u) == 0x7f800000u) return b;
    return (b + 0x1000u) & 0xffffe000u;
}

#if defined(__CUDA_ARCH__)
// One warp-wide mma: C (16x8, f32) += A (16xk) * B (kx8), fragments as the
// PTX ISA lays them out for the shape and types in `PTX`.
#define REDLINE_MMA(NAME, PTX)                                                                   \
    __device__ __forceinline__ void NAME(float c[4], const unsigned int a[4],                    \
                                         const unsigned int b[2]) {                              \
        asm volatile(PTX " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"       \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                            \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));       \
    }
REDLINE_MMA(mma_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
REDLINE_MMA(mma_f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
REDLINE_MMA(mma_tf32, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")
#else
// The host emulator's mmas: the products the layouts above define, from
// every lane's registers (one exchange, cuda/emulate/cuda_host.h). Lane
// (group, t) takes rows group and group + 8 of A from lanes 4 * group + s
// and columns 2t and 2t + 1 of B from lanes 4 * 2t + s and 4 * (2t + 1) +
// s, s = 0..3. `value(reg, e)` is a register's e-th value (16-bit: e = 0 low
// half, 1 high half; TF32: the register itself).
template <int K, class Value>
__device__ __forceinline__ void mma_emulated(float c[4], const unsigned int a[4],
                                             const unsigned int b[2], Value value) {
    const unsigned int mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    unsigned int all[32][6];
    emu_warp_exchange(mine, all);
    const unsigned int lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    // k in order: lane s holds k = (K / 8) * s + e in its low registers (a[0],
    // a[1], b[0]) and k + K / 2 in its high ones (a[2], a[3], b[1]).
    for (int hi = 0; hi < 2; hi++) {
        for (unsigned int s = 0; s < 4; s++) {
            const unsigned int *ar = all[4 * g + s];
            const unsigned int *b0 = all[4 * (2 * t) + s], *b1 = all[4 * (2 * t + 1) + s];
            for (int e = 0; e < K / 8; e++) {
                float top = value(ar[2 * hi], e), low = value(ar[2 * hi + 1], e);
                float n0 = value(b0[4 + hi], e), n1 = value(b1[4 + hi], e);
                c[0] = fmaf(top, n0, c[0]);
                c[1] = fmaf(top, n1, c[1]);
                c[2] = fmaf(low, n0, c[2]);
                c[3] = fmaf(low, n1, c[3]);
            }
        }
    }
}
template <class Fmt>
struct Half16Value {
    float operator()(unsigned int reg, int e) const {
        return Fmt::up((unsigned short)(reg >> (16 * e)));
    }
};
struct Tf32Value {
    float operator()(unsigned int reg, int) const { return __uint_as_float(reg); }
};
inline void mma_bf16(float c[4], const unsigned int a[4], const unsigned int b[2]) {
    mma_emulated<16>(c, a, b, Half16Value<Bf16Fmt>{});
}
inline void mma_f16(float c[4], const unsigned int a[4], const unsigned int b[2]) {
    mma_emulated<16>(c, a, b, Half16Value<F16Fmt>{});
}
inline void mma_tf32(float c[4], const unsigned int a[4], const unsigned int b[2]) {
    mma_emulated<8>(c, a, b, Tf32Value{});
}
#endif

// How a kernel's operands reach the tensor cores: the shared memory element
// (S), staged from a gathered value, and one stage's fragment loads and mmas
// for a warp's 2 x 4 tiles at (wm, wn) of the block tile.
template <class Fmt>
struct Operands16 {
    typedef unsigned short S;
    __device__ static S stage(unsigned short v) { return v; }
    // Two adjacent 16-bit values (the first at an even index) as one register.
    __device__ static unsigned int pair(const S *p) {
        return (unsigned int)p[0] | ((unsigned int)p[1] << 16);
    }
    __device__ static void mma(float c[4], const unsigned int a[4], const unsigned int b[2]);
    __device__ static void stage_mma(float acc[2][4][4], const S (*as)[MMA_BK + MMA_PAD],
                                     const S (*bs)[MMA_BK + MMA_PAD], unsigned int wm,
                                     unsigned int wn, unsigned int g, unsigned int t) {
        unsigned int af[2][4], bf[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const unsigned int r = wm + 16 * i + g;
            af[i][0] = pair(&as[r][2 * t]);
            af[i][1] = pair(&as[r + 8][2 * t]);
            af[i][2] = pair(&as[r][2 * t + 8]);
            af[i][3] = pair(&as[r + 8][2 * t + 8]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int n = wn + 8 * j + g;
            bf[j][0] = pair(&bs[n][2 * t]);
            bf[j][1] = pair(&bs[n][2 * t + 8]);
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) mma(acc[i][j], af[i], bf[j]);
    }
};
template <>
__device__ __forceinline__ void Operands16<Bf16Fmt>::mma(float c[4], const unsigned int a[4],
                                                         const unsigned int b[2]) {
    mma_bf16(c, a, b);
}
template <>
__device__ __forceinline__ void Operands16<F16Fmt>::mma(float c[4], const unsigned int a[4],
                                                        const unsigned int b[2]) {
    mma_f16(c, a, b);
}

struct OperandsTf32 {
    typedef unsigned int S;
    __device__ static S stage(float v) { return tf32_bits(v); }
    __device__ static void stage_mma(float acc[2][4][4], const S (*as)[MMA_BK + MMA_PAD],
                                     const S (*bs)[MMA_BK + MMA_PAD], unsigned int wm,
                                     unsigned int wn, unsigned int g, unsigned int t) {
#pragma unroll
        for (int ks = 0; ks < MMA_BK; ks += 8) {
            unsigned int af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const unsigned int r = wm + 16 * i + g;
                af[i][0] = as[r][ks + t];
                af[i][1] = as[r + 8][ks + t];
                af[i][2] = as[r][ks + t + 4];
                af[i][3] = as[r + 8][ks + t + 4];
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned int n = wn + 8 * j + g;
                bf[j][0] = bs[n][ks + t];
                bf[j][1] = bs[n][ks + t + 4];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma_tf32(acc[i][j], af[i], bf[j]);
        }
    }
};

// C(m, n) = sum over k in [k0, k1) of A(m, k) * B(k, n) for this block's 64 x
// 64 tile (blockIdx.x over M, blockIdx.y over N), on tensor cores.
template <class P, class A, class B, class C>
__device__ void mma_tile(const A &a, const B &b, const C &c, unsigned int rows, unsigned int cols,
                         unsigned int k0, unsigned int k1) {
    // A's tile by row (m), B's by column (n); k contiguous in both, so that a
    // fragment register is (a pair of) one row.
    __shared__ typename P::S as[MMA_BM][MMA_BK + MMA_PAD];
    __shared__ typename P::S bs[MMA_BN][MMA_BK + MMA_PAD];
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int g = lane >> 2, t = lane & 3u;
    const unsigned int wm = (warp >> 1) * 32, wn = (warp & 1u) * 32;
    const unsigned int m0 = blockIdx.x * MMA_BM, n0 = blockIdx.y * MMA_BN;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;
    for (unsigned int kk = k0; kk < k1; kk += MMA_BK) {
        // Consecutive threads take consecutive m (A: pixels, contiguous in
        // the forward's and dx's gathers) and consecutive k (B).
        for (unsigned int e = tid; e < MMA_BM * MMA_BK; e += MMA_THREADS) {
            unsigned int mi = e % MMA_BM, ki = e / MMA_BM;
            unsigned int m = m0 + mi, k = kk + ki;
            as[mi][ki] = (m < rows && k < k1) ? P::stage(a(m, k)) : (typename P::S)0;
        }
        for (unsigned int e = tid; e < MMA_BN * MMA_BK; e += MMA_THREADS) {
            unsigned int ki = e % MMA_BK, ni = e / MMA_BK;
            unsigned int n = n0 + ni, k = kk + ki;
            bs[ni][ki] = (n < cols && k < k1) ? P::stage(b(k, n)) : (typename P::S)0;
        }
        __syncthreads();
        P::stage_mma(acc, as, bs, wm, wn, g, t);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            unsigned int m = m0 + wm + 16 * i + g + 8 * hi;
            if (m >= rows) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    unsigned int n = n0 + wn + 8 * j + 2 * t + e;
                    if (n < cols) c(m, n, acc[i][j][2 * hi + e]);
                }
            }
        }
    }
}

// The kernels of one operand type: conv.cu's three passes (E: the element
// type in memory, P: the operands' policy, O: the outputs' element type). Grids
// as conv.cu's (src/conv_igemm.rs), 128 threads.
#define REDLINE_CONV_MMA(SUFFIX, E, P, O)                                                          \
    extern "C" __global__ void redline_conv_fwd_##SUFFIX(                                          \
        const E *x, const E *wt, O::T *y, unsigned int n, unsigned int cin, unsigned int h,        \
        unsigned int w, unsigned int cout, unsigned int kh, unsigned int kw, unsigned int pad) {   \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                   \
        mma_tile<P>(FwdA<E>{x, d}, FwdB<E>{wt, d}, FwdC<O>{y, d}, d.n * d.oh * d.ow, d.cout, 0,   \
                    d.cin * d.kh * d.kw);                                                          \
    }                                                                                              \
    extern "C" __global__ void redline_conv_dx_##SUFFIX(                                           \
        const E *dy, const E *wt, O::T *dx, unsigned int n, unsigned int cin, unsigned int h,      \
        unsigned int w, unsigned int cout, unsigned int kh, unsigned int kw, unsigned int pad) {   \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                   \
        mma_tile<P>(DxA<E>{dy, d}, DxB<E>{wt, d}, DxC<O>{dx, d}, d.n * d.h * d.w, d.cin, 0,       \
                    d.cout * d.kh * d.kw);                                                         \
    }                                                                                              \
    extern "C" __global__ void redline_conv_dw_##SUFFIX(                                           \
        const E *dy, const E *x, float *partial, unsigned int n, unsigned int cin, unsigned int h, \
        unsigned int w, unsigned int cout, unsigned int kh, unsigned int kw, unsigned int pad,     \
        unsigned int chunk) {                                                                      \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                   \
        unsigned int cols = d.cin * d.kh * d.kw, total = d.n * d.oh * d.ow;                        \
        unsigned int k0 = blockIdx.z * chunk;                                                      \
        unsigned int k1 = min(total, k0 + chunk);                                                  \
        DwC c{partial, (unsigned long long)blockIdx.z * d.cout * cols, cols};                      \
        mma_tile<P>(DwA<E>{dy, d}, DwB<E>{x, d}, c, d.cout, cols, k0, k1);                        \
    }

// The in-order sum of the weight gradient's f32 splits, rounded once to a
// 16-bit format.
#define REDLINE_SUM_SPLITS_16(SUFFIX, FMT)                                                         \
    extern "C" __global__ void redline_sum_splits_##SUFFIX(                                        \
        const float *partial, unsigned short *out, unsigned int splits, unsigned int count) {      \
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < count;                    \
             i += gridDim.x * blockDim.x) {                                                        \
            float s = partial[i]; /* keeps a -0.0 */                                               \
            for (unsigned int z = 1; z < splits; z++)                                              \
                s = __fadd_rn(s, partial[(unsigned long long)z * count + i]);                      \
            out[i] = FMT::down(s);                                                                 \
        }                                                                                          \
    }

REDLINE_CONV_MMA(bf16, unsigned short, Operands16<Bf16Fmt>, Elem16<Bf16Fmt>)
REDLINE_CONV_MMA(f16, unsigned short, Operands16<F16Fmt>, Elem16<F16Fmt>)
REDLINE_CONV_MMA(tf32, float, OperandsTf32, ElemF32)
REDLINE_SUM_SPLITS_16(bf16, Bf16Fmt)
REDLINE_SUM_SPLITS_16(f16, F16Fmt)

#endif  // sm_80 and newer, or the emulator
