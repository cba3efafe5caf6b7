// Mean softmax cross-entropy fused with its gradient: src/loss.rs's CPU
// kernel on the GPU. The forward writes each row's softmax (kept for the
// backward), the mean loss and the count of rows predicted right in one
// launch of one block: a thread per row of at most 32 classes, else warp w
// takes rows w, w + 32, ...; exponentials in f32, sums in f64, the 32 warps'
// partial sums added in a fixed order, so the loss is the same bits every run. A
// target outside [0, C) makes the loss NaN, which the loop's non-finite
// check reports (the GPU cannot raise an error without a host sync).

#define CE_WARPS 32

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ unsigned int warp_add(unsigned int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rows of at most CE_ROW_COLS classes take a thread each (the 10 classes of
// MNIST: a warp per row left 22 of its lanes idle and spent four shuffle
// reductions, f64 ones among them, on each row: 26 us a call for 512 rows on
// an H100, 16% of the MLP's kernel time); wider rows a warp each.
#define CE_ROW_COLS 32

// Row r's softmax into p, returning its loss term log(sum) + max - x[target]
// (f32 exponentials, their sum in f64, in column order: src/loss.rs's CPU
// kernel's arithmetic), and whether its first maximum is the target.
__device__ __forceinline__ double ce_row(const float *row, float *p, unsigned int y,
                                        unsigned int cols, unsigned int *hit) {
    float m = -INFINITY;
    for (unsigned int j = 0; j < cols; j++) m = fmaxf(m, row[j]);
    unsigned int first = 0xffffffffu;
    for (unsigned int j = 0; j < cols; j++) {
        if (row[j] == m) {
            first = j;
            break;
        }
    }
    double s = 0.0;
    for (unsigned int j = 0; j < cols; j++) {
        float e = expf(__fsub_rn(row[j], m));
        p[j] = e;
        s += (double)e;
    }
    float inv = (float)(1.0 / s);
    for (unsigned int j = 0; j < cols; j++) p[j] = __fmul_rn(p[j], inv);
    double xy = y < cols ? (double)row[y] : __longlong_as_double(0x7ff8000000000000ll);
    *hit = first == y ? 1u : 0u;
    return log(s) + (double)m - xy;
}

__device__ __forceinline__ unsigned int warp_min(unsigned int v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Also counts the rows whose first maximum is the target (top-1 accuracy's
// numerator, as argmax then compare would) into `correct`.
extern "C" __global__ void redline_ce_fwd_f32(const float *x, const unsigned int *t, float *probs,
                                              float *loss, float *correct, unsigned int rows,
                                              unsigned int cols) {
    __shared__ double partial[CE_WARPS];
    __shared__ unsigned int hits_part[CE_WARPS];
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    double acc = 0.0;
    unsigned int hits = 0;
    if (cols <= CE_ROW_COLS) {
        // Thread i takes rows i, i + 1024, ...; each warp's sums are then
        // added in the shuffles' fixed order.
        for (unsigned int r = threadIdx.x; r < rows; r += blockDim.x) {
            unsigned int hit;
            acc += ce_row(x + (unsigned long long)r * cols, probs + (unsigned long long)r * cols,
                          t[r], cols, &hit);
            hits += hit;
        }
        acc = warp_sum(acc);
        hits = warp_add(hits);
    } else {
        for (unsigned int r = warp; r < rows; r += CE_WARPS) {
            const float *row = x + (unsigned long long)r * cols;
            float *p = probs + (unsigned long long)r * cols;
            float m = -INFINITY;
            for (unsigned int j = lane; j < cols; j += 32) m = fmaxf(m, row[j]);
            m = warp_max(m);
            unsigned int first = 0xffffffffu;
            for (unsigned int j = lane; j < cols && first == 0xffffffffu; j += 32)
                if (row[j] == m) first = j;
            first = warp_min(first);
            double s = 0.0;
            for (unsigned int j = lane; j < cols; j += 32) {
                float e = expf(__fsub_rn(row[j], m));
                p[j] = e;
                s += (double)e;
            }
            s = warp_sum(s);
            float inv = (float)(1.0 / s);
            for (unsigned int j = lane; j < cols; j += 32) p[j] = __fmul_rn(p[j], inv);
            unsigned int y = t[r];
            double xy = y < cols ? (double)row[y] : __longlong_as_double(0x7ff8000000000000ll);
            acc += log(s) + (double)m - xy;
            hits += first == y ? 1u : 0u;
        }
    }
    if (lane == 0) {
        partial[warp] = acc;
        hits_part[warp] = hits;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        unsigned int right = 0;
        for (int w = 0; w < CE_WARPS; w++) {
            total += partial[w];
            right += hits_part[w];
        }
        loss[0] = (float)(total / (double)rows);
        correct[0] = (float)right;
    }
}

// (softmax - onehot(t)) * g / rows, as src/loss.rs rounds it: p * scale,
// then minus scale at the target.
extern "C" __global__ void redline_ce_bwd_f32(const float *probs, const unsigned int *t,
                                              const float *g, float *out, unsigned int rows,
                                              unsigned int cols) {
    const float scale = __fdiv_rn(g[0], (float)rows);
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long r = i / cols;
        float o = __fmul_rn(probs[i], scale);
        if (i - r * cols == t[r]) o = __fsub_rn(o, scale);
        out[i] = o;
    }
}
