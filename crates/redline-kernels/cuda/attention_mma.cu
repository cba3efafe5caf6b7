// The attention forward of attention.cu on tensor cores, for 16-bit inputs
// (bf16 or f16: `--precision bf16-mixed | 16-mixed | bf16-true`) and heads of
// 32 or 64 (src/cuda/attention.rs picks it; other shapes take attention.cu's
// kernel): FlashAttention-2's forward. The scores Q K^T and the product P V by
// the warp-wide `mma.sync.m16n8k16` of conv_mma.cu (f32 accumulation), the
// online softmax in f32 on the score fragments, the probabilities rounded to
// the 16-bit format for P V (as FlashAttention does) while their row sums stay
// f32. Same outputs as attention.cu's forward: O in the input's format, each
// row's log-sum-exp in f32 (the backward's input), dropout by the same hash.
//
// A block: 4 warps (128 threads), 64 queries of one head, 16 per warp;
// against tiles of 64 keys and values in shared memory, up to the block's
// last query. Fragments as conv_mma.cu lays them out (lane = 4 * g + t): a
// warp's score tile (16 x 64) is 8 C tiles of 16 x 8, c[0..1] = (row g, keys
// 2t..2t+1), c[2..3] = (row g + 8, same keys); two adjacent C tiles are one A
// fragment of P for the next mma, so P never leaves the registers.

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

#define ATT_MMA_Q 64
#define ATT_MMA_K 64
#define ATT_MMA_PAD 8

template <class Fmt>
__device__ __forceinline__ void attn_mma(float c[4], const unsigned int a[4],
                                         const unsigned int b[2]);
template <>
__device__ __forceinline__ void attn_mma<Bf16Fmt>(float c[4], const unsigned int a[4],
                                                  const unsigned int b[2]) {
    mma_bf16(c, a, b);
}
template <>
__device__ __forceinline__ void attn_mma<F16Fmt>(float c[4], const unsigned int a[4],
                                                 const unsigned int b[2]) {
    mma_f16(c, a, b);
}

// Two 16-bit values as one register, the first in the low half.
__device__ __forceinline__ unsigned int attn_pair(unsigned short lo, unsigned short hi) {
    return (unsigned int)lo | ((unsigned int)hi << 16);
}

// Rows r0..r0+ROWS of head `base` of `src` (t x D) into a shared tile, zeros
// past the sequence's end.
template <int D, int ROWS>
__device__ __forceinline__ void attn_mma_load(unsigned short (*dst)[D + ATT_MMA_PAD],
                                              const unsigned short *src, size_t base,
                                              unsigned int r0, unsigned int t) {
    for (unsigned int e = threadIdx.x; e < ROWS * D; e += ATT_THREADS) {
        const unsigned int r = e / D, c = e % D;
        dst[r][c] = r0 + r < t ? src[base + (size_t)(r0 + r) * D + c] : (unsigned short)0;
    }
}

// A warp's A fragments of rows r..r+15 of a shared tile, for the D / 16
// steps over the head's width.
template <int D>
__device__ __forceinline__ void attn_mma_rows(unsigned int a[D / 16][4],
                                              const unsigned short (*src)[D + ATT_MMA_PAD],
                                              unsigned int r, unsigned int g, unsigned int tq) {
#pragma unroll
    for (int s = 0; s < D / 16; s++) {
        const unsigned int c = 16 * s + 2 * tq;
        a[s][0] = attn_pair(src[r + g][c], src[r + g][c + 1]);
        a[s][1] = attn_pair(src[r + g + 8][c], src[r + g + 8][c + 1]);
        a[s][2] = attn_pair(src[r + g][c + 8], src[r + g][c + 9]);
        a[s][3] = attn_pair(src[r + g + 8][c + 8], src[r + g + 8][c + 9]);
    }
}

// c[j] (8 C tiles, 16 x 64) = A (the warp's 16 rows) times the 64 rows of
// `rows` transposed (row n of the tile is column n of the product).
template <class Fmt, int D>
__device__ __forceinline__ void attn_mma_by_rows(float c[8][4], const unsigned int a[D / 16][4],
                                                 const unsigned short (*rows)[D + ATT_MMA_PAD],
                                                 unsigned int g, unsigned int tq) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) c[j][e] = 0.0f;
#pragma unroll
        for (int s = 0; s < D / 16; s++) {
            const unsigned int n = 8 * j + g, k = 16 * s + 2 * tq;
            const unsigned int b[2] = {attn_pair(rows[n][k], rows[n][k + 1]),
                                       attn_pair(rows[n][k + 8], rows[n][k + 9])};
            attn_mma<Fmt>(c[j], a[s], b);
        }
    }
}

// acc (16 x D) += X (16 x 64, the 8 C tiles `x`, rounded to the format) times
// the 64 x D tile `b` (rows of b are X's columns).
template <class Fmt, int D>
__device__ __forceinline__ void attn_mma_times(float acc[D / 8][4], const float x[8][4],
                                               const unsigned short (*b)[D + ATT_MMA_PAD],
                                               unsigned int g, unsigned int tq) {
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const unsigned int xa[4] = {
            attn_pair(Fmt::down(x[2 * s][0]), Fmt::down(x[2 * s][1])),
            attn_pair(Fmt::down(x[2 * s][2]), Fmt::down(x[2 * s][3])),
            attn_pair(Fmt::down(x[2 * s + 1][0]), Fmt::down(x[2 * s + 1][1])),
            attn_pair(Fmt::down(x[2 * s + 1][2]), Fmt::down(x[2 * s + 1][3]))};
        const unsigned int kr = 16 * s + 2 * tq;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            const unsigned int n = 8 * j + g;
            const unsigned int bb[2] = {attn_pair(b[kr][n], b[kr + 1][n]),
                                        attn_pair(b[kr + 8][n], b[kr + 9][n])};
            attn_mma<Fmt>(acc[j], xa, bb);
        }
    }
}

// Stores a warp's 16 x D f32 tile (rows r, r + 8 by h) of head `base` for rows < t.
template <class Fmt, int D>
__device__ __forceinline__ void attn_mma_store(unsigned short *out, const float acc[D / 8][4],
                                               size_t base, unsigned int r, unsigned int g,
                                               unsigned int tq, unsigned int t) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned int row = r + g + 8 * h;
        if (row >= t) continue;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            const size_t at = base + (size_t)row * D + 8 * j + 2 * tq;
            out[at] = Fmt::down(acc[j][2 * h]);
            out[at + 1] = Fmt::down(acc[j][2 * h + 1]);
        }
    }
}

// grid (ceil(t / 64), heads); as attn_fwd with d = D.
template <class Fmt, int D>
__device__ void attn_fwd_mma(const unsigned short *q, const unsigned short *k,
                             const unsigned short *v, unsigned short *o, float *lse,
                             unsigned int t, float scale, float drop_p, unsigned long long seed) {
    __shared__ unsigned short qs[ATT_MMA_Q][D + ATT_MMA_PAD];
    __shared__ unsigned short ks[ATT_MMA_K][D + ATT_MMA_PAD];
    __shared__ unsigned short vs[ATT_MMA_K][D + ATT_MMA_PAD];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int g = lane >> 2, tq = lane & 3u;
    const unsigned int hd = blockIdx.y, q0 = blockIdx.x * ATT_MMA_Q;
    const size_t base = (size_t)hd * t * D;
    attn_mma_load<D, ATT_MMA_Q>(qs, q, base, q0, t);
    __syncthreads();
    // This warp's rows of the block: 16 * warp + g and + 8; its Q fragments
    // for the D / 16 steps over the head's width.
    const unsigned int wr = 16 * warp;
    unsigned int qa[D / 16][4];
    attn_mma_rows<D>(qa, qs, wr, g, tq);
    // Rows g (h = 0) and g + 8 (h = 1): max, sum, and the output's D / 8 C tiles.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    const unsigned int kend = min(t, q0 + ATT_MMA_Q);
    for (unsigned int k0 = 0; k0 < kend; k0 += ATT_MMA_K) {
        __syncthreads();  // the previous tiles are read
        attn_mma_load<D, ATT_MMA_K>(ks, k, base, k0, t);
        attn_mma_load<D, ATT_MMA_K>(vs, v, base, k0, t);
        __syncthreads();
        // S = Q K^T: 8 tiles of 8 keys.
        float sc[8][4];
        attn_mma_by_rows<Fmt, D>(sc, qa, ks, g, tq);
        // Scale and mask: key k0 + 8j + 2tq + (e & 1) after query
        // q0 + wr + g + 8 (e >> 1) is out.
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int key = k0 + 8 * j + 2 * tq + (e & 1);
                const unsigned int query = q0 + wr + g + 8 * (e >> 1);
                sc[j][e] = key > query ? -INFINITY : sc[j][e] * scale;
                mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
            }
        float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // The four lanes of a row (tq = 0..3).
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            // Every row sees key 0 in the first tile, so the max is finite.
            const float mnew = fmaxf(m[h], mx[h]);
            alpha[h] = expf(m[h] - mnew);
            m[h] = mnew;
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sc[j][e] = expf(sc[j][e] - m[e >> 1]);
                sum[e >> 1] += sc[j][e];
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
            l[h] = l[h] * alpha[h] + sum[h];
        }
#pragma unroll
        for (int j = 0; j < D / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] *= alpha[e >> 1];
        // The sum normalises all probabilities; only kept ones (scaled)
        // reach the output.
        if (drop_p > 0.0f) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[j][e] *= attn_factor(seed, drop_p, hd, t, q0 + wr + g + 8 * (e >> 1),
                                            k0 + 8 * j + 2 * tq + (e & 1));
        }
        // O += P V: P's A fragments from the score tiles 2s and 2s + 1 (keys
        // 16s..16s+15); V's B fragments (key pairs of one column) from shared.
        attn_mma_times<Fmt, D>(acc, sc, vs, g, tq);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float inv = 1.0f / l[h];
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            acc[j][2 * h] *= inv;
            acc[j][2 * h + 1] *= inv;
        }
        const unsigned int r = q0 + wr + g + 8 * h;
        if (r < t && tq == 0) lse[(size_t)hd * t + r] = m[h] + logf(l[h]);
    }
    attn_mma_store<Fmt, D>(o, acc, base, q0 + wr, g, tq, t);
}

// grid (ceil(t / 64), heads): dK and dV of 64 keys (16 a warp), summed over
// the query tiles from the keys' own on, in order. Computed transposed (keys
// as rows: S^T = K Q^T, dP^T = V dO^T), so that P^T and dS^T are already the
// A fragments of dV += P^T dO and dK += dS^T Q.
template <class Fmt, int D>
__device__ void attn_dkdv_mma(const unsigned short *q, const unsigned short *k,
                              const unsigned short *v, const unsigned short *go, const float *lse,
                              const float *dvec, unsigned short *dk, unsigned short *dv,
                              unsigned int t, float scale, float drop_p,
                              unsigned long long seed) {
    __shared__ unsigned short qs[64][D + ATT_MMA_PAD];
    __shared__ unsigned short gs[64][D + ATT_MMA_PAD];
    __shared__ unsigned short ks[64][D + ATT_MMA_PAD];
    __shared__ unsigned short vs[64][D + ATT_MMA_PAD];
    __shared__ float ls[64], dd[64];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int g = lane >> 2, tq = lane & 3u;
    const unsigned int hd = blockIdx.y, k0 = blockIdx.x * 64, wr = 16 * warp;
    const size_t base = (size_t)hd * t * D;
    attn_mma_load<D, 64>(ks, k, base, k0, t);
    attn_mma_load<D, 64>(vs, v, base, k0, t);
    __syncthreads();
    unsigned int ka[D / 16][4], va[D / 16][4];
    attn_mma_rows<D>(ka, ks, wr, g, tq);
    attn_mma_rows<D>(va, vs, wr, g, tq);
    float gk[D / 8][4], gv[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) gk[j][e] = gv[j][e] = 0.0f;
    for (unsigned int q0 = k0; q0 < t; q0 += 64) {
        __syncthreads();  // the previous query tile is read
        attn_mma_load<D, 64>(qs, q, base, q0, t);
        attn_mma_load<D, 64>(gs, go, base, q0, t);
        attn_stats<64>(ls, dd, lse, dvec, hd, q0, t);
        __syncthreads();
        float st[8][4], dpt[8][4];
        attn_mma_by_rows<Fmt, D>(st, ka, qs, g, tq);
        attn_mma_by_rows<Fmt, D>(dpt, va, gs, g, tq);
        // Element (j, e): key k0 + wr + g + 8 (e >> 1), query q0 + 8j + 2tq + (e & 1).
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int key = k0 + wr + g + 8 * (e >> 1);
                const unsigned int qi = 8 * j + 2 * tq + (e & 1), query = q0 + qi;
                float pd = 0.0f, ds = 0.0f;
                if (query < t && key <= query) {
                    const float p = expf(st[j][e] * scale - ls[qi]);
                    const float f = attn_factor(seed, drop_p, hd, t, query, key);
                    pd = p * f;
                    ds = scale * p * (dpt[j][e] * f - dd[qi]);
                }
                st[j][e] = pd;
                dpt[j][e] = ds;
            }
        attn_mma_times<Fmt, D>(gv, st, gs, g, tq);
        attn_mma_times<Fmt, D>(gk, dpt, qs, g, tq);
    }
    attn_mma_store<Fmt, D>(dk, gk, base, k0 + wr, g, tq, t);
    attn_mma_store<Fmt, D>(dv, gv, base, k0 + wr, g, tq, t);
}

// grid (ceil(t / 64), heads): dQ of 64 queries (16 a warp), summed over the
// key tiles up to them, in order: S = Q K^T, dP = dO V^T, dQ += dS K.
template <class Fmt, int D>
__device__ void attn_dq_mma(const unsigned short *q, const unsigned short *k,
                            const unsigned short *v, const unsigned short *go, const float *lse,
                            const float *dvec, unsigned short *dq, unsigned int t, float scale,
                            float drop_p, unsigned long long seed) {
    __shared__ unsigned short qs[64][D + ATT_MMA_PAD];
    __shared__ unsigned short gs[64][D + ATT_MMA_PAD];
    __shared__ unsigned short ks[64][D + ATT_MMA_PAD];
    __shared__ unsigned short vs[64][D + ATT_MMA_PAD];
    __shared__ float ls[64], dd[64];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int g = lane >> 2, tq = lane & 3u;
    const unsigned int hd = blockIdx.y, q0 = blockIdx.x * 64, wr = 16 * warp;
    const size_t base = (size_t)hd * t * D;
    attn_mma_load<D, 64>(qs, q, base, q0, t);
    attn_mma_load<D, 64>(gs, go, base, q0, t);
    attn_stats<64>(ls, dd, lse, dvec, hd, q0, t);
    __syncthreads();
    unsigned int qa[D / 16][4], ga[D / 16][4];
    attn_mma_rows<D>(qa, qs, wr, g, tq);
    attn_mma_rows<D>(ga, gs, wr, g, tq);
    const float rl[2] = {ls[wr + g], ls[wr + g + 8]}, rd[2] = {dd[wr + g], dd[wr + g + 8]};
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    const unsigned int kend = min(t, q0 + 64);
    for (unsigned int k0 = 0; k0 < kend; k0 += 64) {
        __syncthreads();
        attn_mma_load<D, 64>(ks, k, base, k0, t);
        attn_mma_load<D, 64>(vs, v, base, k0, t);
        __syncthreads();
        float sc[8][4], dp[8][4];
        attn_mma_by_rows<Fmt, D>(sc, qa, ks, g, tq);
        attn_mma_by_rows<Fmt, D>(dp, ga, vs, g, tq);
        // Element (j, e): query q0 + wr + g + 8 (e >> 1), key k0 + 8j + 2tq + (e & 1).
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int query = q0 + wr + g + 8 * (e >> 1);
                const unsigned int key = k0 + 8 * j + 2 * tq + (e & 1);
                float ds = 0.0f;
                if (query < t && key <= query) {
                    const float p = expf(sc[j][e] * scale - rl[e >> 1]);
                    const float f = attn_factor(seed, drop_p, hd, t, query, key);
                    ds = scale * p * (dp[j][e] * f - rd[e >> 1]);
                }
                sc[j][e] = ds;
            }
        attn_mma_times<Fmt, D>(acc, sc, ks, g, tq);
    }
    attn_mma_store<Fmt, D>(dq, acc, base, q0 + wr, g, tq, t);
}

#define REDLINE_ATTN_MMA(SUFFIX, FMT, D)                                                         \
    extern "C" __global__ void redline_attn_fwd_mma_##SUFFIX##_d##D(                             \
        const unsigned short *q, const unsigned short *k, const unsigned short *v,               \
        unsigned short *o, float *lse, unsigned int t, float scale, float drop_p,                \
        unsigned long long seed) {                                                               \
        attn_fwd_mma<FMT, D>(q, k, v, o, lse, t, scale, drop_p, seed);                           \
    }                                                                                            \
    extern "C" __global__ void redline_attn_dkdv_mma_##SUFFIX##_d##D(                            \
        const unsigned short *q, const unsigned short *k, const unsigned short *v,               \
        const unsigned short *go, const float *lse, const float *dvec, unsigned short *dk,       \
        unsigned short *dv, unsigned int t, float scale, float drop_p,                           \
        unsigned long long seed) {                                                               \
        attn_dkdv_mma<FMT, D>(q, k, v, go, lse, dvec, dk, dv, t, scale, drop_p, seed);           \
    }                                                                                            \
    extern "C" __global__ void redline_attn_dq_mma_##SUFFIX##_d##D(                              \
        const unsigned short *q, const unsigned short *k, const unsigned short *v,               \
        const unsigned short *go, const float *lse, const float *dvec, unsigned short *dq,       \
        unsigned int t, float scale, float drop_p, unsigned long long seed) {                    \
        attn_dq_mma<FMT, D>(q, k, v, go, lse, dvec, dq, t, scale, drop_p, seed);                 \
    }

REDLINE_ATTN_MMA(bf16, Bf16Fmt, 64)
REDLINE_ATTN_MMA(bf16, Bf16Fmt, 32)
REDLINE_ATTN_MMA(f16, F16Fmt, 64)
REDLINE_ATTN_MMA(f16, F16Fmt, 32)

#endif
