// Redline's multi-tensor optimizer kernels: one launch updates up to
// MAX_TENSORS parameters (Adam/AdamW, SGD), one thread block per CHUNK
// elements. The host side and the block lookup are in
// src/multi_tensor.rs (tested on the CPU) and src/cuda/optim.rs.
//
// The arithmetic is src/optim_math.rs's, PyTorch's single-tensor order, one
// IEEE rounding per operation: the __f*_rn intrinsics keep nvcc from fusing
// a multiply and an add into one FMA, so an update rounds as candle's
// one-op-per-kernel generic path does. The step count and learning rate are
// read from device memory (DeviceHyper), so a captured CUDA graph replays
// with the current values; so is the loss scaler's overflow flag (`skip`,
// 16-mixed), which makes the launch change nothing, as PyTorch's GradScaler
// skips `optimizer.step()`.

#define MAX_TENSORS 32

// Must match `TensorList` in src/cuda/optim.rs (1416 bytes).
struct TensorList {
    float *p[MAX_TENSORS];
    const float *g[MAX_TENSORS];
    float *a[MAX_TENSORS];  // Adam: first moment; SGD: momentum buffer
    float *b[MAX_TENSORS];  // Adam: second moment; SGD: unused
    unsigned long long n[MAX_TENSORS];
    unsigned int chunk_start[MAX_TENSORS + 1];
    int count;
};

// Must match `AdamHyper` in src/cuda/optim.rs.
struct AdamHyper {
    const double *step;
    const double *lr;
    const float *skip;  // null, or the scaler's flag: non-zero skips the update
    double ln_b1;
    double ln_b2;
    double neg_wd;  // -weight_decay, for AdamW's decay factor
    float w1;       // 1 - beta1
    float b2;
    float w2;       // 1 - beta2
    float eps;
    float l2;       // Adam's L2 term (0 for AdamW)
    int decoupled;  // 1: AdamW's p *= 1 - lr * wd
};

// Must match `SgdHyper` in src/cuda/optim.rs.
struct SgdHyper {
    const double *step;
    const double *lr;
    const float *skip;  // as AdamHyper's
    float wd;
    float mom;
    float damp;  // 1 - dampening
    int nesterov;
};

// Whether the loss scaler found an overflow in this step's gradients.
__device__ __forceinline__ bool skipped(const float *skip) { return skip != 0 && *skip != 0.0f; }

__device__ __forceinline__ float flush(float x) {
    return fabsf(x) < 1.17549435e-38f ? 0.0f : x;
}

// The block's tensor slot and element range (multi_tensor::block_range).
__device__ __forceinline__ int block_slot(const TensorList &l, unsigned long long chunk,
                                          unsigned long long *first, unsigned long long *end) {
    unsigned int b = blockIdx.x;
    int s = 0;
    while (s + 1 < l.count && l.chunk_start[s + 1] <= b) s++;
    *first = (unsigned long long)(b - l.chunk_start[s]) * chunk;
    unsigned long long e = *first + chunk;
    *end = e < l.n[s] ? e : l.n[s];
    return s;
}

// Adam's constants of the step the device holds (DeviceHyper::adam's: f64 as
// candle's ops compute them, then f32): step size, sqrt of the second bias
// correction, AdamW's decay factor.
struct AdamConsts {
    float step_size;
    float bc2;
    float decay;
};

__device__ __forceinline__ AdamConsts adam_consts(const AdamHyper &h) {
    double t = *h.step;
    double lr = *h.lr;
    AdamConsts c;
    c.step_size = (float)(lr / fma(exp(t * h.ln_b1), -1.0, 1.0));
    c.bc2 = (float)sqrt(fma(exp(t * h.ln_b2), -1.0, 1.0));
    c.decay = (float)fma(lr, h.neg_wd, 1.0);
    return c;
}

// Elements a thread loads before it computes any (Adam f32): the loads of
// its ILP elements are in flight together, where a loop of one element at a
// time waited for each in turn (9.8 us a step for the MLP's 102 blocks on an
// H100, for 2.8 MB of traffic). The arithmetic per element is unchanged.
#define ILP 4

extern "C" __global__ void redline_multi_adam_f32(const TensorList l, const AdamHyper h,
                                                  unsigned long long chunk) {
    if (skipped(h.skip)) return;
    unsigned long long first, end;
    int s = block_slot(l, chunk, &first, &end);
    const AdamConsts c = adam_consts(h);
    const float step_size = c.step_size, bc2 = c.bc2, decay = c.decay;
    float *p = l.p[s];
    const float *g = l.g[s];
    float *m = l.a[s];
    float *v = l.b[s];
    const unsigned long long stride = blockDim.x;
    for (unsigned long long base = first + threadIdx.x; base < end; base += ILP * stride) {
        float pr[ILP] = {0.0f}, gr[ILP] = {0.0f}, mr[ILP] = {0.0f}, vr[ILP] = {0.0f};
#pragma unroll
        for (int k = 0; k < ILP; ++k) {
            unsigned long long i = base + k * stride;
            if (i < end) {
                pr[k] = p[i];
                gr[k] = g[i];
                mr[k] = m[i];
                vr[k] = v[i];
            }
        }
#pragma unroll
        for (int k = 0; k < ILP; ++k) {
            unsigned long long i = base + k * stride;
            if (i >= end) continue;
            float pi = pr[k];
            float gi = gr[k];
            if (h.l2 != 0.0f) gi = __fadd_rn(gi, __fmul_rn(pi, h.l2));
            if (h.decoupled) pi = __fmul_rn(pi, decay);
            float mi = flush(__fadd_rn(mr[k], __fmul_rn(__fsub_rn(gi, mr[k]), h.w1)));
            float vi = flush(__fadd_rn(__fmul_rn(vr[k], h.b2), __fmul_rn(__fmul_rn(gi, h.w2), gi)));
            float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2), h.eps);
            p[i] = __fsub_rn(pi, __fmul_rn(__fdiv_rn(mi, denom), step_size));
            m[i] = mi;
            v[i] = vi;
        }
    }
}

extern "C" __global__ void redline_multi_sgd_f32(const TensorList l, const SgdHyper h,
                                                 unsigned long long chunk) {
    if (skipped(h.skip)) return;
    unsigned long long first, end;
    int s = block_slot(l, chunk, &first, &end);
    float lr = (float)(*h.lr);
    // PyTorch starts the momentum buffer as a copy of the first gradient.
    bool first_step = *h.step <= 1.0;
    float *p = l.p[s];
    const float *g = l.g[s];
    float *buf = l.a[s];
    for (unsigned long long i = first + threadIdx.x; i < end; i += blockDim.x) {
        float pi = p[i];
        float gi = g[i];
        if (h.wd != 0.0f) gi = __fadd_rn(gi, __fmul_rn(pi, h.wd));
        if (h.mom == 0.0f) {
            p[i] = __fsub_rn(pi, __fmul_rn(gi, lr));
            continue;
        }
        float bi = flush(first_step ? gi
                                    : __fadd_rn(__fmul_rn(buf[i], h.mom), __fmul_rn(gi, h.damp)));
        float d = h.nesterov ? __fadd_rn(gi, __fmul_rn(bi, h.mom)) : bi;
        p[i] = __fsub_rn(pi, __fmul_rn(d, lr));
        buf[i] = bi;
    }
}

// bf16-true: parameters, gradients and state are bf16, held as their 16 bits
// (unsigned short, so that the host emulator needs no bf16 type). Each value
// is widened exactly, the update computed in f32 and rounded to bf16 where
// PyTorch's single-tensor Adam and SGD round on bf16 tensors: the arithmetic
// of src/optim_bf16.rs's CPU loop, operation for operation, so that the two
// give the same bits. The constants are the f32 kernels' (f32, not bf16:
// PyTorch passes them to the bf16 ops as Python floats).

__device__ __forceinline__ float bf16_round(float x) { return bf16_up(bf16_down(x)); }

extern "C" __global__ void redline_multi_adam_bf16(const TensorList l, const AdamHyper h,
                                                   unsigned long long chunk) {
    if (skipped(h.skip)) return;
    unsigned long long first, end;
    int s = block_slot(l, chunk, &first, &end);
    const AdamConsts c = adam_consts(h);
    const float step_size = c.step_size, bc2 = c.bc2, decay = c.decay;
    unsigned short *p = (unsigned short *)l.p[s];
    const unsigned short *g = (const unsigned short *)l.g[s];
    unsigned short *m = (unsigned short *)l.a[s];
    unsigned short *v = (unsigned short *)l.b[s];
    for (unsigned long long i = first + threadIdx.x; i < end; i += blockDim.x) {
        float pi = bf16_up(p[i]);
        // grad.add(param, alpha=wd), with an L2 term only (g + 0 * inf is NaN);
        // param.mul_(1 - lr * wd) (AdamW)
        float gi = bf16_up(g[i]);
        if (h.l2 != 0.0f) gi = bf16_round(__fadd_rn(gi, __fmul_rn(h.l2, pi)));
        if (h.decoupled) pi = bf16_round(__fmul_rn(pi, decay));
        // exp_avg.lerp_(grad, 1 - beta1)
        float m0 = bf16_up(m[i]);
        float mi = flush(bf16_round(__fadd_rn(m0, __fmul_rn(h.w1, __fsub_rn(gi, m0)))));
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        float vb = bf16_round(__fmul_rn(bf16_up(v[i]), h.b2));
        float vi = flush(bf16_round(__fadd_rn(vb, __fmul_rn(__fmul_rn(h.w2, gi), gi))));
        // (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        float denom = bf16_round(__fadd_rn(bf16_round(__fdiv_rn(bf16_round(__fsqrt_rn(vi)), bc2)),
                                           h.eps));
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        p[i] = bf16_down(__fadd_rn(pi, __fdiv_rn(__fmul_rn(-step_size, mi), denom)));
        m[i] = bf16_down(mi);
        v[i] = bf16_down(vi);
    }
}

extern "C" __global__ void redline_multi_sgd_bf16(const TensorList l, const SgdHyper h,
                                                  unsigned long long chunk) {
    if (skipped(h.skip)) return;
    unsigned long long first, end;
    int s = block_slot(l, chunk, &first, &end);
    float lr = (float)(*h.lr);
    bool first_step = *h.step <= 1.0;
    unsigned short *p = (unsigned short *)l.p[s];
    const unsigned short *g = (const unsigned short *)l.g[s];
    unsigned short *buf = (unsigned short *)l.a[s];
    for (unsigned long long i = first + threadIdx.x; i < end; i += blockDim.x) {
        float pi = bf16_up(p[i]);
        float gi = bf16_up(g[i]);
        if (h.wd != 0.0f) gi = bf16_round(__fadd_rn(gi, __fmul_rn(h.wd, pi)));
        float d = gi;
        if (h.mom != 0.0f) {
            // buf.mul_(momentum).add_(grad, alpha=1 - dampening); the first step copies grad
            float bi = first_step ? gi
                                  : flush(bf16_round(__fadd_rn(bf16_round(__fmul_rn(bf16_up(buf[i]),
                                                                                    h.mom)),
                                                               __fmul_rn(h.damp, gi))));
            buf[i] = bf16_down(bi);
            d = h.nesterov ? bf16_round(__fadd_rn(gi, __fmul_rn(h.mom, bi))) : bi;
        }
        // param.add_(d, alpha=-lr)
        p[i] = bf16_down(__fadd_rn(pi, __fmul_rn(-lr, d)));
    }
}
