// Causal scaled dot-product attention on the GPU (src/attention.rs' fused
// op, src/cuda/attention.rs launches it): FlashAttention's blocked online
// softmax, so no T x T score matrix exists, forward and backward, on
// (B*H, T, D) queries, keys and values in f32, bf16 or f16 (`E`), head
// dimensions up to ATT_DMAX. Every product and the softmax are f32 (as
// autocast runs attention's softmax); 16-bit outputs are rounded once.
//
// Forward (redline_attn_fwd_*): a block of 64 queries of one head, against
// the key blocks of 32 up to its last query; each row's max and sum kept
// (16 threads a row, reduced by shuffles), the output rescaled as the max
// grows, then the output and each row's log-sum-exp (for the backward).
//
// Backward, FlashAttention-2's arithmetic without its atomics (so the sums'
// order, and the bits, are fixed): D_i = dO_i . O_i (redline_attn_dot_*);
// then per block of 32 keys, dK and dV summed over the query blocks at or
// after it (redline_attn_dkdv_*); and per block of 32 queries, dQ over the
// key blocks up to it (redline_attn_dq_*), each recomputing the
// probabilities from the log-sum-exp.
//
// Dropout of the probabilities (training): the CPU kernel's mask, a
// splitmix64 hash of the seed and (head, query, key) (src/attention.rs
// `keeps`), made again wherever it is needed, never stored.
//
// 128 threads; thread (ty, tx) = (tid / 16, tid % 16) owns rows of the
// block's tiles and columns tx, tx + 16, ...; shared tiles are f32 with a
// padded row (ATT_DMAX + 1) against bank conflicts. Under 48 KiB of static
// shared memory.

#define ATT_DMAX 64
#define ATT_THREADS 128
#define ATT_FWD_Q 64
#define ATT_KB 32

// Whether dropout keeps the probability of query i on key j of head hd (of
// the flattened B*H) for sequences of t: src/attention.rs `keeps`, bit for
// bit (wrapping 64-bit arithmetic, 24 uniform bits against p).
__device__ __forceinline__ bool attn_keeps(unsigned long long seed, float p,
                                           unsigned long long hd, unsigned long long t,
                                           unsigned long long i, unsigned long long j) {
    unsigned long long at = (hd * t + i) * t + j;
    unsigned long long z = seed ^ (at * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) >= p;
}

// The factor dropout multiplies probability (i, j) by: 0 or 1 / (1 - p); 1
// without dropout.
__device__ __forceinline__ float attn_factor(unsigned long long seed, float p, unsigned int hd,
                                             unsigned int t, unsigned int i, unsigned int j) {
    if (!(p > 0.0f)) return 1.0f;
    return attn_keeps(seed, p, hd, t, i, j) ? 1.0f / (1.0f - p) : 0.0f;
}

// Rows r0..r0+n of head `hd` of `src` (T x d, widened to f32) into `dst`,
// zeros past the sequence's end.
template <class E, int ROWS>
__device__ __forceinline__ void attn_load(float (*dst)[ATT_DMAX + 1], const typename E::T *src,
                                          size_t base, unsigned int r0, unsigned int t,
                                          unsigned int d) {
    for (unsigned int e = threadIdx.x; e < ROWS * d; e += ATT_THREADS) {
        unsigned int r = e / d, c = e % d;
        dst[r][c] = r0 + r < t ? E::up(src[base + (size_t)(r0 + r) * d + c]) : 0.0f;
    }
}

// The dot product of two shared rows over d.
__device__ __forceinline__ float attn_dot(const float *a, const float *b, unsigned int d) {
    float s = 0.0f;
    for (unsigned int x = 0; x < d; x++) s = fmaf(a[x], b[x], s);
    return s;
}

// The max and the sum over the 16 threads (tx = 0..15) that share a row.
__device__ __forceinline__ float attn_row_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float attn_row_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// acc[i][j] += sum over x < ATT_KB of A(r0 + i, x) B(x, tx + 16 j), for the
// thread's ROWS rows and its columns below d; A(r, x) = a[r][x], or a[x][r]
// when TRANSPOSED.
template <int ROWS, bool TRANSPOSED>
__device__ __forceinline__ void attn_acc(float acc[ROWS][4], const float (*a)[ATT_KB + 1],
                                         const float (*b)[ATT_DMAX + 1], unsigned int r0,
                                         unsigned int tx, unsigned int d) {
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int c = tx + 16 * j;
            if (c >= d) continue;
            float s = acc[i][j];
            for (int x = 0; x < ATT_KB; x++)
                s = fmaf(TRANSPOSED ? a[x][r0 + i] : a[r0 + i][x], b[x][c], s);
            acc[i][j] = s;
        }
    }
}

// Rows r0 + i (those before t) of the thread's ROWS x 4 tile, columns below
// d, each times its row's factor in `by` (none: 1), into head `base` of out.
template <class E, int ROWS>
__device__ __forceinline__ void attn_store(typename E::T *out, const float acc[ROWS][4],
                                           const float *by, size_t base, unsigned int r0,
                                           unsigned int tx, unsigned int t, unsigned int d) {
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
        const unsigned int r = r0 + i;
        if (r >= t) continue;
        const float f = by ? by[i] : 1.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned int c = tx + 16 * j;
            if (c < d) out[base + (size_t)r * d + c] = E::down(acc[i][j] * f);
        }
    }
}

// grid (ceil(t / 64), heads); o (heads, t, d) in E; lse (heads, t) f32.
template <class E>
__device__ void attn_fwd(const typename E::T *q, const typename E::T *k, const typename E::T *v,
                         typename E::T *o, float *lse, unsigned int t, unsigned int d,
                         float scale, float drop_p, unsigned long long seed) {
    __shared__ float qs[ATT_FWD_Q][ATT_DMAX + 1];
    __shared__ float ks[ATT_KB][ATT_DMAX + 1];
    __shared__ float vs[ATT_KB][ATT_DMAX + 1];
    __shared__ float ps[ATT_FWD_Q][ATT_KB + 1];
    const unsigned int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const unsigned int hd = blockIdx.y, q0 = blockIdx.x * ATT_FWD_Q;
    const size_t base = (size_t)hd * t * d;
    attn_load<E, ATT_FWD_Q>(qs, q, base, q0, t, d);
    float m[8], l[8], acc[8][4];
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        #pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    }
    // Keys up to the block's last query.
    const unsigned int kend = min(t, q0 + ATT_FWD_Q);
    for (unsigned int k0 = 0; k0 < kend; k0 += ATT_KB) {
        __syncthreads();  // the previous tiles are read (and qs written)
        attn_load<E, ATT_KB>(ks, k, base, k0, t, d);
        attn_load<E, ATT_KB>(vs, v, base, k0, t, d);
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned int r = ty * 8 + i;
            float s[2];
            #pragma unroll
            for (int j = 0; j < 2; j++) {
                const unsigned int c = tx + 16 * j;
                // Key k0 + c after query q0 + r is masked out.
                s[j] = k0 + c > q0 + r ? -INFINITY : attn_dot(qs[r], ks[c], d) * scale;
            }
            // Every row sees key 0 in the first block, so the max is finite.
            const float mnew = fmaxf(m[i], attn_row_max(fmaxf(s[0], s[1])));
            const float alpha = expf(m[i] - mnew);
            float p[2] = {expf(s[0] - mnew), expf(s[1] - mnew)};
            l[i] = l[i] * alpha + attn_row_sum(p[0] + p[1]);
            m[i] = mnew;
            #pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] *= alpha;
            // The sum normalises all probabilities; only kept ones (scaled)
            // reach the output.
            #pragma unroll
            for (int j = 0; j < 2; j++)
                ps[r][tx + 16 * j] = p[j] * attn_factor(seed, drop_p, hd, t, q0 + r, k0 + tx + 16 * j);
        }
        __syncthreads();
        attn_acc<8, false>(acc, ps, vs, ty * 8, tx, d);
    }
    float inv[8];
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        inv[i] = 1.0f / l[i];
        const unsigned int r = q0 + ty * 8 + i;
        if (r < t && tx == 0) lse[(size_t)hd * t + r] = m[i] + logf(l[i]);
    }
    attn_store<E, 8>(o, acc, inv, base, q0 + ty * 8, tx, t, d);
}

// D_i = dO_i . O_i for each of `rows` rows of d: grid ceil(rows / 128).
template <class E>
__device__ void attn_dot_rows(const typename E::T *o, const typename E::T *go, float *dvec,
                              unsigned int rows, unsigned int d) {
    const unsigned int i = blockIdx.x * ATT_THREADS + threadIdx.x;
    if (i >= rows) return;
    float s = 0.0f;
    for (unsigned int x = 0; x < d; x++)
        s = fmaf(E::up(go[(size_t)i * d + x]), E::up(o[(size_t)i * d + x]), s);
    dvec[i] = s;
}

// The probability P and dS of query q0 + r on key k0 + c from the shared
// rows (query, its gradient; key, value) and the query's log-sum-exp and D:
// P dropped (for dV) in *pd, dS = scale * P * (dP * factor - D) returned.
// Both 0 when the key is after the query or the query past the end.
__device__ __forceinline__ float attn_ds(const float *qr, const float *gr, const float *kr,
                                         const float *vr, float lse, float dd, unsigned int qi,
                                         unsigned int kj, unsigned int hd, unsigned int t,
                                         unsigned int d, float scale, float drop_p,
                                         unsigned long long seed, float *pd) {
    *pd = 0.0f;
    if (qi >= t || kj > qi) return 0.0f;
    const float p = expf(attn_dot(qr, kr, d) * scale - lse);
    const float f = attn_factor(seed, drop_p, hd, t, qi, kj);
    *pd = p * f;
    return scale * p * (attn_dot(gr, vr, d) * f - dd);
}

// Rows r0..r0+ROWS of head hd's log-sum-exps and D into shared arrays (0
// past the end, where nothing is read). ROWS <= ATT_THREADS.
template <int ROWS>
__device__ __forceinline__ void attn_stats(float *ls, float *dd, const float *lse,
                                           const float *dvec, unsigned int hd, unsigned int r0,
                                           unsigned int t) {
    const unsigned int i = threadIdx.x;
    if (i < ROWS) {
        const bool in = r0 + i < t;
        ls[i] = in ? lse[(size_t)hd * t + r0 + i] : 0.0f;
        dd[i] = in ? dvec[(size_t)hd * t + r0 + i] : 0.0f;
    }
}

// grid (ceil(t / 32), heads): dk and dv of a block of 32 keys, summed over
// the query blocks from the key block's own on, in order.
template <class E>
__device__ void attn_dkdv(const typename E::T *q, const typename E::T *k, const typename E::T *v,
                          const typename E::T *go, const float *lse, const float *dvec,
                          typename E::T *dk, typename E::T *dv, unsigned int t, unsigned int d,
                          float scale, float drop_p, unsigned long long seed) {
    __shared__ float ks[ATT_KB][ATT_DMAX + 1];
    __shared__ float vs[ATT_KB][ATT_DMAX + 1];
    __shared__ float qs[ATT_KB][ATT_DMAX + 1];
    __shared__ float gs[ATT_KB][ATT_DMAX + 1];
    __shared__ float ps[ATT_KB][ATT_KB + 1];
    __shared__ float dss[ATT_KB][ATT_KB + 1];
    __shared__ float ls[ATT_KB], ds[ATT_KB];
    const unsigned int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const unsigned int hd = blockIdx.y, k0 = blockIdx.x * ATT_KB;
    const size_t base = (size_t)hd * t * d;
    attn_load<E, ATT_KB>(ks, k, base, k0, t, d);
    attn_load<E, ATT_KB>(vs, v, base, k0, t, d);
    float gk[4][4], gv[4][4];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) gk[i][j] = gv[i][j] = 0.0f;
    for (unsigned int q0 = k0; q0 < t; q0 += ATT_KB) {
        __syncthreads();
        attn_load<E, ATT_KB>(qs, q, base, q0, t, d);
        attn_load<E, ATT_KB>(gs, go, base, q0, t, d);
        attn_stats<ATT_KB>(ls, ds, lse, dvec, hd, q0, t);
        __syncthreads();
        // Entries (query r, key c) of the 32 x 32 tile.
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned int r = ty * 4 + i;
            #pragma unroll
            for (int j = 0; j < 2; j++) {
                const unsigned int c = tx + 16 * j;
                float pd;
                dss[r][c] = attn_ds(qs[r], gs[r], ks[c], vs[c], ls[r], ds[r], q0 + r, k0 + c, hd,
                                    t, d, scale, drop_p, seed, &pd);
                ps[r][c] = pd;
            }
        }
        __syncthreads();
        // dV_c += sum_r P_dropped(r, c) dO_r; dK_c += sum_r dS(r, c) Q_r.
        attn_acc<4, true>(gv, ps, gs, ty * 4, tx, d);
        attn_acc<4, true>(gk, dss, qs, ty * 4, tx, d);
    }
    attn_store<E, 4>(dk, gk, nullptr, base, k0 + ty * 4, tx, t, d);
    attn_store<E, 4>(dv, gv, nullptr, base, k0 + ty * 4, tx, t, d);
}

// grid (ceil(t / 32), heads): dq of a block of 32 queries, summed over the
// key blocks up to it, in order.
template <class E>
__device__ void attn_dq(const typename E::T *q, const typename E::T *k, const typename E::T *v,
                        const typename E::T *go, const float *lse, const float *dvec,
                        typename E::T *dq, unsigned int t, unsigned int d, float scale,
                        float drop_p, unsigned long long seed) {
    __shared__ float qs[ATT_KB][ATT_DMAX + 1];
    __shared__ float gs[ATT_KB][ATT_DMAX + 1];
    __shared__ float ks[ATT_KB][ATT_DMAX + 1];
    __shared__ float vs[ATT_KB][ATT_DMAX + 1];
    __shared__ float dss[ATT_KB][ATT_KB + 1];
    __shared__ float ls[ATT_KB], ds[ATT_KB];
    const unsigned int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const unsigned int hd = blockIdx.y, q0 = blockIdx.x * ATT_KB;
    const size_t base = (size_t)hd * t * d;
    attn_load<E, ATT_KB>(qs, q, base, q0, t, d);
    attn_load<E, ATT_KB>(gs, go, base, q0, t, d);
    attn_stats<ATT_KB>(ls, ds, lse, dvec, hd, q0, t);
    float gq[4][4];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++) gq[i][j] = 0.0f;
    const unsigned int kend = min(t, q0 + ATT_KB);
    for (unsigned int k0 = 0; k0 < kend; k0 += ATT_KB) {
        __syncthreads();
        attn_load<E, ATT_KB>(ks, k, base, k0, t, d);
        attn_load<E, ATT_KB>(vs, v, base, k0, t, d);
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned int r = ty * 4 + i;
            #pragma unroll
            for (int j = 0; j < 2; j++) {
                const unsigned int c = tx + 16 * j;
                float pd;
                dss[r][c] = attn_ds(qs[r], gs[r], ks[c], vs[c], ls[r], ds[r], q0 + r, k0 + c, hd,
                                    t, d, scale, drop_p, seed, &pd);
            }
        }
        __syncthreads();
        // dQ_r += sum_c dS(r, c) K_c.
        attn_acc<4, false>(gq, dss, ks, ty * 4, tx, d);
    }
    attn_store<E, 4>(dq, gq, nullptr, base, q0 + ty * 4, tx, t, d);
}

#define REDLINE_ATTN_KERNELS(SUFFIX, E)                                                          \
    extern "C" __global__ void redline_attn_fwd_##SUFFIX(                                        \
        const E::T *q, const E::T *k, const E::T *v, E::T *o, float *lse, unsigned int t,        \
        unsigned int d, float scale, float drop_p, unsigned long long seed) {                    \
        attn_fwd<E>(q, k, v, o, lse, t, d, scale, drop_p, seed);                                 \
    }                                                                                            \
    extern "C" __global__ void redline_attn_dot_##SUFFIX(const E::T *o, const E::T *go,          \
                                                         float *dvec, unsigned int rows,         \
                                                         unsigned int d) {                       \
        attn_dot_rows<E>(o, go, dvec, rows, d);                                                  \
    }                                                                                            \
    extern "C" __global__ void redline_attn_dkdv_##SUFFIX(                                       \
        const E::T *q, const E::T *k, const E::T *v, const E::T *go, const float *lse,           \
        const float *dvec, E::T *dk, E::T *dv, unsigned int t, unsigned int d, float scale,      \
        float drop_p, unsigned long long seed) {                                                 \
        attn_dkdv<E>(q, k, v, go, lse, dvec, dk, dv, t, d, scale, drop_p, seed);                 \
    }                                                                                            \
    extern "C" __global__ void redline_attn_dq_##SUFFIX(                                         \
        const E::T *q, const E::T *k, const E::T *v, const E::T *go, const float *lse,           \
        const float *dvec, E::T *dq, unsigned int t, unsigned int d, float scale, float drop_p,  \
        unsigned long long seed) {                                                               \
        attn_dq<E>(q, k, v, go, lse, dvec, dq, t, d, scale, drop_p, seed);                       \
    }

REDLINE_ATTN_KERNELS(f32, ElemF32)
REDLINE_ATTN_KERNELS(bf16, Elem16<Bf16Fmt>)
REDLINE_ATTN_KERNELS(f16, Elem16<F16Fmt>)
