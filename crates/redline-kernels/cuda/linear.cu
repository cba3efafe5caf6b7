// A linear layer's backward, besides its two GEMMs (cuBLASLt): the incoming
// gradient masked by the forward's ReLU output and the bias gradient, in one
// launch. One thread per output column sums its rows in order in f32, as
// src/linear.rs's CPU kernel does; reads and writes are coalesced across
// the threads of a row. In 16 bits (bf16-mixed, 16-mixed, bf16-true) the
// mask copies the gradient's bits and the f32 sum is rounded once (as
// autocast's 16-bit sum, accumulated in f32).
template <class E>
__device__ void relu_mask_bias_grad(const typename E::T *g, const typename E::T *y,
                                    typename E::T *dz, typename E::T *db, unsigned int rows,
                                    unsigned int cols) {
    unsigned int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.0f;
    for (unsigned int r = 0; r < rows; r++) {
        unsigned long long i = (unsigned long long)r * cols + j;
        typename E::T v = g[i];
        if (y != 0 && !(E::up(y[i]) > 0.0f)) v = E::down(0.0f);
        dz[i] = v;
        s = __fadd_rn(s, E::up(v));
    }
    db[j] = E::down(s);
}

#define REDLINE_MASK(SUFFIX, E)                                                                    \
    extern "C" __global__ void redline_relu_mask_bias_grad_##SUFFIX(                               \
        const E::T *g, const E::T *y, E::T *dz, E::T *db, unsigned int rows, unsigned int cols) {  \
        relu_mask_bias_grad<E>(g, y, dz, db, rows, cols);                                          \
    }

REDLINE_MASK(f32, ElemF32)
REDLINE_MASK(bf16, Elem16<Bf16Fmt>)
REDLINE_MASK(f16, Elem16<F16Fmt>)
