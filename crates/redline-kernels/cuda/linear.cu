// A linear layer's backward, besides its two GEMMs (cuBLASLt): the incoming
// gradient masked by the forward's ReLU output and the bias gradient, in one
// launch. One thread per output column sums its rows in order in f32, as
// src/linear.rs's CPU kernel does; reads and writes are coalesced across
// the threads of a row.
extern "C" __global__ void redline_relu_mask_bias_grad_f32(const float *g, const float *y, float *dz,
                                                           float *db, unsigned int rows,
                                                           unsigned int cols) {
    unsigned int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.0f;
    for (unsigned int r = 0; r < rows; r++) {
        unsigned long long i = (unsigned long long)r * cols + j;
        float v = g[i];
        if (y != 0 && !(y[i] > 0.0f)) v = 0.0f;
        dz[i] = v;
        s = __fadd_rn(s, v);
    }
    db[j] = s;
}

// The same in a 16-bit format (bf16-mixed, 16-mixed, bf16-true): the mask
// copies the gradient's bits, the bias gradient is summed in f32 in row
// order and rounded once (as autocast's 16-bit sum, accumulated in f32).
template <class Fmt>
__device__ void relu_mask_bias_grad_16(const unsigned short *g, const unsigned short *y,
                                       unsigned short *dz, unsigned short *db, unsigned int rows,
                                       unsigned int cols) {
    unsigned int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.0f;
    for (unsigned int r = 0; r < rows; r++) {
        unsigned long long i = (unsigned long long)r * cols + j;
        unsigned short v = g[i];
        if (y != 0 && !(Fmt::up(y[i]) > 0.0f)) v = 0;
        dz[i] = v;
        s = __fadd_rn(s, Fmt::up(v));
    }
    db[j] = Fmt::down(s);
}

extern "C" __global__ void redline_relu_mask_bias_grad_bf16(const unsigned short *g,
                                                            const unsigned short *y,
                                                            unsigned short *dz, unsigned short *db,
                                                            unsigned int rows, unsigned int cols) {
    relu_mask_bias_grad_16<Bf16Fmt>(g, y, dz, db, rows, cols);
}

extern "C" __global__ void redline_relu_mask_bias_grad_f16(const unsigned short *g,
                                                           const unsigned short *y,
                                                           unsigned short *dz, unsigned short *db,
                                                           unsigned int rows, unsigned int cols) {
    relu_mask_bias_grad_16<F16Fmt>(g, y, dz, db, rows, cols);
}
