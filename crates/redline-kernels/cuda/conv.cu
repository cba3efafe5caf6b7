// 2-D convolution (stride 1, dilation 1, zero padding `pad`, any kh x kw,
// one group) as implicit GEMMs: the im2col matrix is never written; each
// tile gathers its operands straight from the image. One tiled GEMM core
// and three pairs of gathers, whose index arithmetic src/conv_igemm.rs
// mirrors and tests on the CPU against candle's convolution:
//   forward  y (N, Cout, OH, OW):  M = N*OH*OW pixels, N = Cout, K = Cin*kh*kw
//   dx       dx (N, Cin, H, W):    M = N*H*W pixels,   N = Cin,  K = Cout*kh*kw
//   dW       dw (Cout, Cin, kh, kw): M = Cout, N = Cin*kh*kw, K = N*OH*OW,
//            split over K into `splits` fixed ranges whose partial sums
//            redline_sum_splits_f32 adds in order (the same bits every run).
// Each thread sums its outputs over k in increasing order with fmaf.

#define IG_BM 64
#define IG_BN 64
#define IG_BK 8
#define IG_THREADS 256  // 16 x 16 threads, 4 x 4 outputs each

struct ConvDims {
    unsigned int n, cin, h, w, cout, kh, kw, pad, oh, ow;
};

__device__ __forceinline__ ConvDims conv_dims(unsigned int n, unsigned int cin, unsigned int h,
                                              unsigned int w, unsigned int cout, unsigned int kh,
                                              unsigned int kw, unsigned int pad) {
    ConvDims d;
    d.n = n;
    d.cin = cin;
    d.h = h;
    d.w = w;
    d.cout = cout;
    d.kh = kh;
    d.kw = kw;
    d.pad = pad;
    d.oh = h + 2 * pad - kh + 1;
    d.ow = w + 2 * pad - kw + 1;
    return d;
}

// i = (outer * middle + mid) * inner + in, split: {outer, mid, in}. A pixel
// index (b, y, x) with (inner, middle) = (width, height), or a tap (c, ky, kx)
// with (kw, kh).
struct Split3 {
    unsigned int outer, mid, in;
};
__device__ __forceinline__ Split3 split3(unsigned int i, unsigned int inner, unsigned int middle) {
    unsigned int t = i / inner;
    return Split3{t / middle, t % middle, i % inner};
}

// The input value at (b, ci, oy + ky - pad, ox + kx - pad), zero outside.
// T: float, or a 16-bit format's bits (unsigned short; zero is +0.0 in both).
template <class T>
__device__ __forceinline__ T ig_input(const T *x, const ConvDims &d, unsigned int b,
                                          unsigned int ci, unsigned int oy, unsigned int ox,
                                          unsigned int ky, unsigned int kx) {
    int iy = (int)(oy + ky) - (int)d.pad;
    int ix = (int)(ox + kx) - (int)d.pad;
    if (iy < 0 || iy >= (int)d.h || ix < 0 || ix >= (int)d.w) return T(0);
    return x[(((unsigned long long)b * d.cin + ci) * d.h + iy) * d.w + ix];
}

// Forward. A(m, k): m = (b, oy, ox), k = (ci, ky, kx): the input patch.
template <class T>
struct FwdA {
    const T *x;
    ConvDims d;
    __device__ T operator()(unsigned int m, unsigned int k) const {
        Split3 p = split3(m, d.ow, d.oh), t = split3(k, d.kw, d.kh);
        return ig_input(x, d, p.outer, t.outer, p.mid, p.in, t.mid, t.in);
    }
};
// B(k, n) = w[n, k] (w is (Cout, Cin*kh*kw)).
template <class T>
struct FwdB {
    const T *wt;
    ConvDims d;
    __device__ T operator()(unsigned int k, unsigned int n) const {
        return wt[(unsigned long long)n * (d.cin * d.kh * d.kw) + k];
    }
};
template <class S>
struct FwdC {
    typename S::T *y;
    ConvDims d;
    __device__ void operator()(unsigned int m, unsigned int n, float v) const {
        Split3 p = split3(m, d.ow, d.oh);
        y[(((unsigned long long)p.outer * d.cout + n) * d.oh + p.mid) * d.ow + p.in] = S::down(v);
    }
};

// dx. A(m, k): m = (b, iy, ix), k = (co, ky, kx): dy at (oy, ox) = (iy + pad
// - ky, ix + pad - kx), the output that read this input through (ky, kx).
template <class T>
struct DxA {
    const T *dy;
    ConvDims d;
    __device__ T operator()(unsigned int m, unsigned int k) const {
        Split3 p = split3(m, d.w, d.h), t = split3(k, d.kw, d.kh);
        int oy = (int)(p.mid + d.pad) - (int)t.mid;
        int ox = (int)(p.in + d.pad) - (int)t.in;
        if (oy < 0 || oy >= (int)d.oh || ox < 0 || ox >= (int)d.ow) return T(0);
        return dy[(((unsigned long long)p.outer * d.cout + t.outer) * d.oh + oy) * d.ow + ox];
    }
};
// B(k, n) = w[co, n, ky, kx].
template <class T>
struct DxB {
    const T *wt;
    ConvDims d;
    __device__ T operator()(unsigned int k, unsigned int n) const {
        Split3 t = split3(k, d.kw, d.kh);
        return wt[(((unsigned long long)t.outer * d.cin + n) * d.kh + t.mid) * d.kw + t.in];
    }
};
template <class S>
struct DxC {
    typename S::T *dx;
    ConvDims d;
    __device__ void operator()(unsigned int m, unsigned int n, float v) const {
        Split3 p = split3(m, d.w, d.h);
        dx[(((unsigned long long)p.outer * d.cin + n) * d.h + p.mid) * d.w + p.in] = S::down(v);
    }
};

// dW. A(m, k) = dy[b, m, oy, ox] with k = (b, oy, ox).
template <class T>
struct DwA {
    const T *dy;
    ConvDims d;
    __device__ T operator()(unsigned int m, unsigned int k) const {
        Split3 p = split3(k, d.ow, d.oh);
        return dy[(((unsigned long long)p.outer * d.cout + m) * d.oh + p.mid) * d.ow + p.in];
    }
};
// B(k, n): the input patch element n = (ci, ky, kx) of output pixel k.
template <class T>
struct DwB {
    const T *x;
    ConvDims d;
    __device__ T operator()(unsigned int k, unsigned int n) const {
        Split3 p = split3(k, d.ow, d.oh), t = split3(n, d.kw, d.kh);
        return ig_input(x, d, p.outer, t.outer, p.mid, p.in, t.mid, t.in);
    }
};
// Split `z` writes its partial sums at partial[z][m][n].
struct DwC {
    float *partial;
    unsigned long long offset;
    unsigned int cols;
    __device__ void operator()(unsigned int m, unsigned int n, float v) const {
        partial[offset + (unsigned long long)m * cols + n] = v;
    }
};

// C(m, n) = sum over k in [k0, k1) of A(m, k) * B(k, n) for this block's
// 64 x 64 tile (blockIdx.x over M, blockIdx.y over N).
template <class A, class B, class C>
__device__ void ig_tile(const A &a, const B &b, const C &c, unsigned int rows, unsigned int cols,
                        unsigned int k0, unsigned int k1) {
    __shared__ float as[IG_BK][IG_BM];
    __shared__ float bs[IG_BK][IG_BN];
    unsigned int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    unsigned int m0 = blockIdx.x * IG_BM, n0 = blockIdx.y * IG_BN;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (unsigned int kk = k0; kk < k1; kk += IG_BK) {
        for (unsigned int e = tid; e < IG_BM * IG_BK; e += IG_THREADS) {
            unsigned int mi = e % IG_BM, ki = e / IG_BM;
            unsigned int m = m0 + mi, k = kk + ki;
            as[ki][mi] = (m < rows && k < k1) ? a(m, k) : 0.0f;
        }
        for (unsigned int e = tid; e < IG_BN * IG_BK; e += IG_THREADS) {
            unsigned int ni = e % IG_BN, ki = e / IG_BN;
            unsigned int n = n0 + ni, k = kk + ki;
            bs[ki][ni] = (n < cols && k < k1) ? b(k, n) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int ki = 0; ki < IG_BK; ki++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) av[i] = as[ki][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = bs[ki][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        unsigned int m = m0 + ty + 16 * i;
        if (m >= rows) continue;
        for (int j = 0; j < 4; j++) {
            unsigned int n = n0 + tx + 16 * j;
            if (n < cols) c(m, n, acc[i][j]);
        }
    }
}

// Grid (ceil(N*OH*OW / 64), ceil(Cout / 64)), 256 threads.
extern "C" __global__ void redline_conv_fwd_f32(const float *x, const float *wt, float *y,
                                                unsigned int n, unsigned int cin, unsigned int h,
                                                unsigned int w, unsigned int cout, unsigned int kh,
                                                unsigned int kw, unsigned int pad) {
    ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);
    ig_tile(FwdA<float>{x, d}, FwdB<float>{wt, d}, FwdC<ElemF32>{y, d}, d.n * d.oh * d.ow, d.cout, 0,
            d.cin * d.kh * d.kw);
}

// Grid (ceil(N*H*W / 64), ceil(Cin / 64)), 256 threads.
extern "C" __global__ void redline_conv_dx_f32(const float *dy, const float *wt, float *dx,
                                               unsigned int n, unsigned int cin, unsigned int h,
                                               unsigned int w, unsigned int cout, unsigned int kh,
                                               unsigned int kw, unsigned int pad) {
    ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);
    ig_tile(DxA<float>{dy, d}, DxB<float>{wt, d}, DxC<ElemF32>{dx, d}, d.n * d.h * d.w, d.cin, 0, d.cout * d.kh * d.kw);
}

// Grid (ceil(Cout / 64), ceil(Cin*kh*kw / 64), splits), 256 threads: split z
// sums k in [z * chunk, min((z + 1) * chunk, N*OH*OW)) into partial[z].
extern "C" __global__ void redline_conv_dw_f32(const float *dy, const float *x, float *partial,
                                               unsigned int n, unsigned int cin, unsigned int h,
                                               unsigned int w, unsigned int cout, unsigned int kh,
                                               unsigned int kw, unsigned int pad,
                                               unsigned int chunk) {
    ConvDims d = conv_dims(n, cin, h, w, cout, kh, kw, pad);
    unsigned int cols = d.cin * d.kh * d.kw, total = d.n * d.oh * d.ow;
    unsigned int k0 = blockIdx.z * chunk;
    unsigned int k1 = min(total, k0 + chunk);
    DwC c{partial, (unsigned long long)blockIdx.z * d.cout * cols, cols};
    ig_tile(DwA<float>{dy, d}, DwB<float>{x, d}, c, d.cout, cols, k0, k1);
}

// out[i] = partial[0][i] + partial[1][i] + ... in split order.
extern "C" __global__ void redline_sum_splits_f32(const float *partial, float *out,
                                                  unsigned int splits, unsigned int count) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (unsigned int z = 0; z < splits; z++)
            s = __fadd_rn(s, partial[(unsigned long long)z * count + i]);
        out[i] = s;
    }
}
