// A CNN block's tail after candle's convolution: bias, max pooling (k x k,
// stride k, floor mode) and ReLU in one launch, and the backward in one.
// The same rules as src/conv_block.rs's CPU kernel and the generic ops: the
// bias is added to each conv output before pooling; each window's maximum
// is its first in row-major order, with `v > best || isnan(v)` (PyTorch's
// rule, the last NaN wins); the ReLU passes gradient where its output is
// positive. One byte per pooled value keeps the winner (ky * k + kx), or
// 255 where the ReLU zeroed it. The backward is one launch, then the
// in-order sum of the bias gradient's splits (cuda/conv.cu's and
// cuda/conv_mma.cu's redline_sum_splits_*).

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

// The backward in one launch, grid (splits, C) of POOL_BWD_THREADS threads:
// block (s, ch) takes channel ch of the images [n*s/splits, n*(s+1)/splits)
// (src/pool.rs' `block_bwd_splits`). Per pooled value (img, ch, py, px) a
// thread writes d(conv) over the conv outputs its window owns (k x k, and in
// the last row and column of windows also the rows and columns past them,
// floor mode, which take no gradient): the pooled value's gradient at the
// winner, 0 elsewhere; and adds the gradient that passed the ReLU to its f32
// sum. The block's sums, added in a fixed tree, go to partial[s * C + ch],
// and redline_sum_splits_* adds the splits in order (rounding once in 16
// bits): the same bits every run. The pair (img, p) advances by a fixed
// step, so an element takes one 32-bit division (p into py, px). Before
// this, d(conv) took one thread per conv output (five divisions each) and
// d(bias) one block per channel (32 or 64 blocks on 132 SMs, each walking
// its channel alone: 167 us a call at batch 512 on an H100, 20% of the
// CNN's kernel time).
#define POOL_BWD_THREADS 256

template <class E>
__device__ void bias_pool_relu_bwd(const typename E::T *gy, const unsigned char *arg,
                                   typename E::T *dconv, float *partial, unsigned int n,
                                   unsigned int c, unsigned int h, unsigned int w, unsigned int k,
                                   unsigned int ph, unsigned int pw, unsigned int splits) {
    __shared__ float part[POOL_BWD_THREADS];
    unsigned int ch = blockIdx.y, split = blockIdx.x;
    unsigned int img0 = (unsigned int)((unsigned long long)n * split / splits);
    unsigned int img1 = (unsigned int)((unsigned long long)n * (split + 1) / splits);
    unsigned int per = ph * pw;
    unsigned long long count = (unsigned long long)(img1 - img0) * per;
    unsigned long long plane_size = (unsigned long long)h * w;
    typename E::T zero = E::down(0.0f);
    float s = 0.0f;
    unsigned int img = img0 + threadIdx.x / per, p = threadIdx.x % per;
    unsigned int step_img = blockDim.x / per, step_p = blockDim.x % per;
    for (unsigned long long j = threadIdx.x; j < count; j += blockDim.x) {
        unsigned long long plane = (unsigned long long)img * c + ch;
        unsigned long long o = plane * per + p;
        unsigned int win = arg[o];
        typename E::T g = gy[o];
        if (win != POOL_NO_GRAD) s = __fadd_rn(s, E::up(g));
        unsigned int py = p / pw, px = p - py * pw;
        unsigned int y0 = py * k, x0 = px * k;
        unsigned int y1 = py + 1 == ph ? h : y0 + k, x1 = px + 1 == pw ? w : x0 + k;
        // The winner's row and column in the window; none where the ReLU zeroed it.
        unsigned int wy = win == POOL_NO_GRAD ? h : y0 + win / k;
        unsigned int wx = win == POOL_NO_GRAD ? w : x0 + win % k;
        typename E::T *dst = dconv + plane * plane_size;
        for (unsigned int yy = y0; yy < y1; yy++)
            for (unsigned int xx = x0; xx < x1; xx++)
                dst[yy * w + xx] = (yy == wy && xx == wx) ? g : zero;
        img += step_img;
        p += step_p;
        if (p >= per) {
            p -= per;
            img++;
        }
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + half]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[(unsigned long long)split * c + ch] = part[0];
}

#define REDLINE_POOL(SUFFIX, E)                                                                    \
    extern "C" __global__ void redline_bias_pool_relu_##SUFFIX(                                    \
        const E::T *conv, const E::T *bias, E::T *y, unsigned char *arg, unsigned int n,           \
        unsigned int c, unsigned int h, unsigned int w, unsigned int k, unsigned int ph,           \
        unsigned int pw) {                                                                         \
        bias_pool_relu<E>(conv, bias, y, arg, n, c, h, w, k, ph, pw);                              \
    }                                                                                              \
    extern "C" __global__ void redline_bias_pool_relu_bwd_##SUFFIX(                                \
        const E::T *gy, const unsigned char *arg, E::T *dconv, float *partial, unsigned int n,     \
        unsigned int c, unsigned int h, unsigned int w, unsigned int k, unsigned int ph,           \
        unsigned int pw, unsigned int splits) {                                                    \
        bias_pool_relu_bwd<E>(gy, arg, dconv, partial, n, c, h, w, k, ph, pw, splits);             \
    }

REDLINE_POOL(f32, ElemF32)
REDLINE_POOL(bf16, Elem16<Bf16Fmt>)
REDLINE_POOL(f16, Elem16<F16Fmt>)
