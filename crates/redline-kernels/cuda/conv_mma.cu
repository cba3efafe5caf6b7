// The implicit-GEMM convolution of conv.cu in a 16-bit format (bf16 or
// fp16: `--precision bf16-mixed | 16-mixed | bf16-true`) on tensor cores:
// the same gathers (conv.cu's functors over the 16-bit bits), the same 64 x
// 64 block tiles and launch grids, and the products by the warp-wide
// `mma.sync.m16n8k16` with f32 accumulation (how cuBLAS's and cuDNN's 16-bit
// GEMMs accumulate, and so PyTorch's autocast). The forward and the input
// gradient round their f32 sums to the 16-bit format once, when stored; the
// weight gradient's splits write f32 partial sums, added in split order and
// rounded once by redline_sum_splits_{bf16,f16}.
//
// 128 threads (4 warps, 2 x 2), each warp a 32 x 32 quarter of the tile: 2
// x 4 mma tiles of 16 x 8, over k in steps of 16 staged in shared memory.
// Fragments follow the PTX ISA's m16n8k16 layout (lane = 4 * group + t):
//   A (16 x 16, row): a[0] = (group, 2t..2t+1), a[1] = (group + 8, 2t..),
//                     a[2] = (group, 2t+8..),   a[3] = (group + 8, 2t+8..)
//   B (16 x 8, col):  b[0] = (k 2t..2t+1, n group), b[1] = (k 2t+8.., n group)
//   C (16 x 8):       c[0..1] = (group, 2t..2t+1), c[2..3] = (group + 8, 2t..)
// each 32-bit register holding its lower-k (lower-column) value in its low
// 16 bits. The instruction needs sm_80 or newer (build.rs builds for
// CUDA_COMPUTE_CAP, 90 by default); in the host emulator (cuda/emulate) the
// mma is the same products from the same registers, summed in f32 by fmaf.

#define MMA_BM 64
#define MMA_BN 64
#define MMA_BK 16
#define MMA_PAD 8  // shared rows of 24 halves: the fragment reads hit 32 banks
#define MMA_THREADS 128

// Two adjacent 16-bit values (the first at an even index) as one register.
__device__ __forceinline__ unsigned int mma_pair(const unsigned short *p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 16);
}

// The 16-bit kernels exist in builds for sm_80 and newer (and the emulator);
// src/cuda/conv.rs says so when a build for an older GPU lacks them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

#if defined(__CUDA_ARCH__)
template <class Fmt>
__device__ __forceinline__ void mma16816(float c[4], const unsigned int a[4],
                                         const unsigned int b[2]);
template <>
__device__ __forceinline__ void mma16816<Bf16Fmt>(float c[4], const unsigned int a[4],
                                                  const unsigned int b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<F16Fmt>(float c[4], const unsigned int a[4],
                                                 const unsigned int b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
// The host emulator's mma: the products the fragment layout above defines,
// from every lane's registers (one exchange, cuda/emulate/cuda_host.h).
// Lane (group, t) takes rows group and group + 8 of A from lanes 4 * group
// + s and columns 2t and 2t + 1 of B from lanes 4 * 2t + s and 4 * (2t + 1)
// + s, s = 0..3; lane s holds k = 2s, 2s + 1 in its low registers and
// k + 8, k + 9 in its high ones. Summed in f32 by fmaf, k in order.
template <class Fmt>
__device__ __forceinline__ void mma16816(float c[4], const unsigned int a[4],
                                         const unsigned int b[2]) {
    const unsigned int mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    unsigned int all[32][6];
    emu_warp_exchange(mine, all);
    const unsigned int lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    for (int hi = 0; hi < 2; hi++) {      // k 0..7, then 8..15
        for (unsigned int s = 0; s < 4; s++) {
            const unsigned int *ar = all[4 * g + s];
            const unsigned int *b0 = all[4 * (2 * t) + s], *b1 = all[4 * (2 * t + 1) + s];
            for (int e = 0; e < 2; e++) {     // the pair's lower or upper k
                const int sh = 16 * e;
                float top = Fmt::up((unsigned short)(ar[2 * hi] >> sh));
                float low = Fmt::up((unsigned short)(ar[2 * hi + 1] >> sh));
                float n0 = Fmt::up((unsigned short)(b0[4 + hi] >> sh));
                float n1 = Fmt::up((unsigned short)(b1[4 + hi] >> sh));
                c[0] = fmaf(top, n0, c[0]);
                c[1] = fmaf(top, n1, c[1]);
                c[2] = fmaf(low, n0, c[2]);
                c[3] = fmaf(low, n1, c[3]);
            }
        }
    }
}
#endif

// C(m, n) = sum over k in [k0, k1) of A(m, k) * B(k, n) for this block's 64 x
// 64 tile (blockIdx.x over M, blockIdx.y over N): A and B give 16-bit bits.
template <class Fmt, class A, class B, class C>
__device__ void mma_tile(const A &a, const B &b, const C &c, unsigned int rows, unsigned int cols,
                         unsigned int k0, unsigned int k1) {
    // A's tile by row (m), B's by column (n); k contiguous in both, so that a
    // fragment register is one pair of a row.
    __shared__ unsigned short as[MMA_BM][MMA_BK + MMA_PAD];
    __shared__ unsigned short bs[MMA_BN][MMA_BK + MMA_PAD];
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
            as[mi][ki] = (m < rows && k < k1) ? a(m, k) : (unsigned short)0;
        }
        for (unsigned int e = tid; e < MMA_BN * MMA_BK; e += MMA_THREADS) {
            unsigned int ki = e % MMA_BK, ni = e / MMA_BK;
            unsigned int n = n0 + ni, k = kk + ki;
            bs[ni][ki] = (n < cols && k < k1) ? b(k, n) : (unsigned short)0;
        }
        __syncthreads();
        unsigned int af[2][4], bf[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const unsigned int r = wm + 16 * i + g;
            af[i][0] = mma_pair(&as[r][2 * t]);
            af[i][1] = mma_pair(&as[r + 8][2 * t]);
            af[i][2] = mma_pair(&as[r][2 * t + 8]);
            af[i][3] = mma_pair(&as[r + 8][2 * t + 8]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int n = wn + 8 * j + g;
            bf[j][0] = mma_pair(&bs[n][2 * t]);
            bf[j][1] = mma_pair(&bs[n][2 * t + 8]);
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) mma16816<Fmt>(acc[i][j], af[i], bf[j]);
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

// The kernels, for one format: conv.cu's three passes, and the in-order sum
// of the weight gradient's splits rounded to the format. Grids as conv.cu's
// (src/conv_igemm.rs), 128 threads.
#define REDLINE_CONV_MMA(SUFFIX, FMT)                                                             \
    extern "C" __global__ void redline_conv_fwd_##SUFFIX(                                         \
        const unsigned short *x, const unsigned short *wt, unsigned short *y, unsigned int n,      \
        unsigned int cin, unsigned int h, unsigned int w, unsigned int cout, unsigned int kh,      \
        unsigned int kw, unsigned int pad) {                                                      \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                  \
        mma_tile<FMT>(FwdA<unsigned short>{x, d}, FwdB<unsigned short>{wt, d},                    \
                      FwdC<Store16<FMT>>{y, d}, d.n * d.oh * d.ow, d.cout, 0,                     \
                      d.cin * d.kh * d.kw);                                                       \
    }                                                                                             \
    extern "C" __global__ void redline_conv_dx_##SUFFIX(                                          \
        const unsigned short *dy, const unsigned short *wt, unsigned short *dx, unsigned int n,    \
        unsigned int cin, unsigned int h, unsigned int w, unsigned int cout, unsigned int kh,      \
        unsigned int kw, unsigned int pad) {                                                      \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                  \
        mma_tile<FMT>(DxA<unsigned short>{dy, d}, DxB<unsigned short>{wt, d},                     \
                      DxC<Store16<FMT>>{dx, d}, d.n * d.h * d.w, d.cin, 0, d.cout * d.kh * d.kw); \
    }                                                                                             \
    extern "C" __global__ void redline_conv_dw_##SUFFIX(                                          \
        const unsigned short *dy, const unsigned short *x, float *partial, unsigned int n,         \
        unsigned int cin, unsigned int h, unsigned int w, unsigned int cout, unsigned int kh,      \
        unsigned int kw, unsigned int pad, unsigned int chunk) {                                  \
        ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);                                  \
        unsigned int cols = d.cin * d.kh * d.kw, total = d.n * d.oh * d.ow;                       \
        unsigned int k0 = blockIdx.z * chunk;                                                     \
        unsigned int k1 = min(total, k0 + chunk);                                                 \
        DwC c{partial, (unsigned long long)blockIdx.z * d.cout * cols, cols};                     \
        mma_tile<FMT>(DwA<unsigned short>{dy, d}, DwB<unsigned short>{x, d}, c, d.cout, cols, k0, \
                      k1);                                                                        \
    }                                                                                             \
    extern "C" __global__ void redline_sum_splits_##SUFFIX(                                       \
        const float *partial, unsigned short *out, unsigned int splits, unsigned int count) {      \
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < count;                   \
             i += gridDim.x * blockDim.x) {                                                       \
            float s = partial[i]; /* keeps a -0.0 */                                              \
            for (unsigned int z = 1; z < splits; z++)                                             \
                s = __fadd_rn(s, partial[(unsigned long long)z * count + i]);                     \
            out[i] = FMT::down(s);                                                                \
        }                                                                                         \
    }

REDLINE_CONV_MMA(bf16, Bf16Fmt)
REDLINE_CONV_MMA(f16, F16Fmt)

#endif  // sm_80 and newer, or the emulator
