// A CNN block's tail after candle's convolution: bias, max pooling (k x k,
// stride k, floor mode) and ReLU in one launch, and the backward in two.
// The same rules as src/conv_block.rs's CPU kernel and the generic ops: the
// bias is added to each conv output before pooling; each window's maximum
// is its first in row-major order, with `v > best || isnan(v)` (PyTorch's
// rule, the last NaN wins); the ReLU passes gradient where its output is
// positive. One byte per pooled value keeps the winner (ky * k + kx), or
// 255 where the ReLU zeroed it.

#define POOL_NO_GRAD 255

// Each kernel in f32 and in 16 bits (half16.cu's ElemF32, Elem16: bf16-mixed,
// 16-mixed, bf16-true after cuda/conv_mma.cu's convolution). A 16-bit
// variant adds the bias in f32 and rounds the sum once (candle's 16-bit
// add, which the generic path takes), pools and passes the 16-bit values,
// and sums the bias gradient in f32, rounded once.

// Whether an elementwise loop over `total` elements can count in 32 bits
// (its last grid stride included): 64-bit division and remainder take many
// instructions on a GPU, and the loops below take both per element.
__device__ inline bool fits32(unsigned long long total) {
    return total <= 0xFFFFFFFFull - (unsigned long long)gridDim.x * blockDim.x;
}

// One thread per pooled value (n, c, py, px) of `y (N, C, PH, PW)`, the
// index of type I (unsigned int where the count fits).
template <class E, class I>
__device__ void bias_pool_relu_loop(const typename E::T *conv, const typename E::T *bias,
                                    typename E::T *y, unsigned char *arg, I total,
                                    unsigned int c, unsigned int h, unsigned int w,
                                    unsigned int k, unsigned int ph, unsigned int pw) {
    for (I o = blockIdx.x * (I)blockDim.x + threadIdx.x; o < total; o += (I)gridDim.x * blockDim.x) {
        unsigned int px = o % pw;
        I t = o / pw;
        unsigned int py = t % ph;
        t /= ph;  // n * C + c
        unsigned int ch = t % c;
        const typename E::T *plane = conv + (unsigned long long)t * h * w;
        float b = E::up(bias[ch]);
        float best = E::up(E::down(__fadd_rn(E::up(plane[(py * k) * w + px * k]), b)));
        unsigned int at = 0;
        for (unsigned int ky = 0; ky < k; ky++) {
            for (unsigned int kx = 0; kx < k; kx++) {
                float v = E::up(E::down(__fadd_rn(E::up(plane[(py * k + ky) * w + px * k + kx]), b)));
                if (v > best || isnan(v)) {
                    best = v;
                    at = ky * k + kx;
                }
            }
        }
        bool pass = best > 0.0f;
        y[o] = E::down(pass ? best : 0.0f);
        arg[o] = pass ? (unsigned char)at : (unsigned char)POOL_NO_GRAD;
    }
}

template <class E>
__device__ void bias_pool_relu(const typename E::T *conv, const typename E::T *bias,
                               typename E::T *y, unsigned char *arg, unsigned int n,
                               unsigned int c, unsigned int h, unsigned int w, unsigned int k,
                               unsigned int ph, unsigned int pw) {
    unsigned long long total = (unsigned long long)n * c * ph * pw;
    if (fits32(total))
        bias_pool_relu_loop<E, unsigned int>(conv, bias, y, arg, (unsigned int)total, c, h, w, k, ph, pw);
    else
        bias_pool_relu_loop<E, unsigned long long>(conv, bias, y, arg, total, c, h, w, k, ph, pw);
}

// d(conv) of `(N, C, H, W)`: each conv output takes its window's gradient
// when it was the window's winner; rows and columns past the last whole
// window (floor mode) take none. The index of type I, as above.
template <class E, class I>
__device__ void bias_pool_relu_bwd_loop(const typename E::T *gy, const unsigned char *arg,
                                        typename E::T *dconv, I total, unsigned int h,
                                        unsigned int w, unsigned int k, unsigned int ph,
                                        unsigned int pw) {
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        unsigned int x = i % w;
        I t = i / w;
        unsigned int yy = t % h;
        t /= h;  // n * C + c
        typename E::T g = E::down(0.0f);
        unsigned int py = yy / k, px = x / k;
        if (py < ph && px < pw) {
            unsigned long long o = ((unsigned long long)t * ph + py) * pw + px;
            if (arg[o] == (yy % k) * k + (x % k)) g = gy[o];
        }
        dconv[i] = g;
    }
}

template <class E>
__device__ void bias_pool_relu_bwd(const typename E::T *gy, const unsigned char *arg,
                                   typename E::T *dconv, unsigned int n, unsigned int c,
                                   unsigned int h, unsigned int w, unsigned int k, unsigned int ph,
                                   unsigned int pw) {
    unsigned long long total = (unsigned long long)n * c * h * w;
    if (fits32(total))
        bias_pool_relu_bwd_loop<E, unsigned int>(gy, arg, dconv, (unsigned int)total, h, w, k, ph, pw);
    else
        bias_pool_relu_bwd_loop<E, unsigned long long>(gy, arg, dconv, total, h, w, k, ph, pw);
}

// d(bias) of `C`: one block per channel sums the gradient that passed the
// ReLU over (n, py, px), in a fixed order (the same bits every run): thread
// t takes j = t, t + blockDim.x, ... of the channel's img * PH * PW + p. The
// pair (img, p) advances by a fixed step, so no element takes a division
// (a 64-bit division and remainder per element made this kernel 167 us a
// call at batch 512 on an H100, 20% of the CNN's kernel time).
template <class E>
__device__ void bias_pool_relu_dbias(const typename E::T *gy, const unsigned char *arg,
                                     typename E::T *db, unsigned int n, unsigned int c,
                                     unsigned int ph, unsigned int pw) {
    __shared__ float part[256];
    unsigned int ch = blockIdx.x;
    unsigned int per = ph * pw;
    unsigned long long count = (unsigned long long)n * per;
    float s = 0.0f;
    if (per > 0) {
        unsigned int img = threadIdx.x / per, p = threadIdx.x % per;
        unsigned int step_img = blockDim.x / per, step_p = blockDim.x % per;
        for (unsigned long long j = threadIdx.x; j < count; j += blockDim.x) {
            unsigned long long o = ((unsigned long long)img * c + ch) * per + p;
            if (arg[o] != POOL_NO_GRAD) s = __fadd_rn(s, E::up(gy[o]));
            img += step_img;
            p += step_p;
            if (p >= per) {
                p -= per;
                img++;
            }
        }
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + half]);
        __syncthreads();
    }
    if (threadIdx.x == 0) db[ch] = E::down(part[0]);
}

#define REDLINE_POOL(SUFFIX, E)                                                                    \
    extern "C" __global__ void redline_bias_pool_relu_##SUFFIX(                                    \
        const E::T *conv, const E::T *bias, E::T *y, unsigned char *arg, unsigned int n,           \
        unsigned int c, unsigned int h, unsigned int w, unsigned int k, unsigned int ph,           \
        unsigned int pw) {                                                                         \
        bias_pool_relu<E>(conv, bias, y, arg, n, c, h, w, k, ph, pw);                              \
    }                                                                                              \
    extern "C" __global__ void redline_bias_pool_relu_bwd_##SUFFIX(                                \
        const E::T *gy, const unsigned char *arg, E::T *dconv, unsigned int n, unsigned int c,     \
        unsigned int h, unsigned int w, unsigned int k, unsigned int ph, unsigned int pw) {        \
        bias_pool_relu_bwd<E>(gy, arg, dconv, n, c, h, w, k, ph, pw);                              \
    }                                                                                              \
    extern "C" __global__ void redline_bias_pool_relu_dbias_##SUFFIX(                              \
        const E::T *gy, const unsigned char *arg, E::T *db, unsigned int n, unsigned int c,        \
        unsigned int ph, unsigned int pw) {                                                        \
        bias_pool_relu_dbias<E>(gy, arg, db, n, c, ph, pw);                                        \
    }

REDLINE_POOL(f32, ElemF32)
REDLINE_POOL(bf16, Elem16<Bf16Fmt>)
REDLINE_POOL(f16, Elem16<F16Fmt>)
