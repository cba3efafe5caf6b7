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
