// A linear layer's backward, besides its two GEMMs (cuBLASLt): the incoming
// gradient masked by the forward's ReLU output and the bias gradient, in one
// launch. In 16 bits (bf16-mixed, 16-mixed, bf16-true) the mask copies the
// gradient's bits and the f32 sum is rounded once (as autocast's 16-bit sum,
// accumulated in f32).
//
// A block of MASK_THREADS threads takes MASK_COLS columns
// (src/fused_gpu.rs): its MASK_GROUPS row groups each walk the rows
// group, group + MASK_GROUPS, ... of every column in order, reads and writes
// coalesced across the 32 columns of a row; then each column's group sums
// are added in group order. A fixed order, so the same inputs give the same
// bits on every run. (One thread per column walking all rows, as before,
// took 86 us a call at batch 512 on an H200: 51% of the MLP's kernel time.)
#define MASK_COLS 32
#define MASK_GROUPS 16
template <class E>
__device__ void relu_mask_bias_grad(const typename E::T *g, const typename E::T *y,
                                    typename E::T *dz, typename E::T *db, unsigned int rows,
                                    unsigned int cols) {
    __shared__ float part[MASK_GROUPS][MASK_COLS];
    unsigned int c = threadIdx.x % MASK_COLS, group = threadIdx.x / MASK_COLS;
    unsigned int j = blockIdx.x * MASK_COLS + c;
    float s = 0.0f;
    if (j < cols) {
        for (unsigned int r = group; r < rows; r += MASK_GROUPS) {
            unsigned long long i = (unsigned long long)r * cols + j;
            typename E::T v = g[i];
            if (y != 0 && !(E::up(y[i]) > 0.0f)) v = E::down(0.0f);
            dz[i] = v;
            s = __fadd_rn(s, E::up(v));
        }
    }
    part[group][c] = s;
    __syncthreads();
    if (group == 0 && j < cols) {
        float t = 0.0f;
        for (unsigned int k = 0; k < MASK_GROUPS; k++) t = __fadd_rn(t, part[k][c]);
        db[j] = E::down(t);
    }
}

#define REDLINE_MASK(SUFFIX, E)                                                                    \
    extern "C" __global__ void redline_relu_mask_bias_grad_##SUFFIX(                               \
        const E::T *g, const E::T *y, E::T *dz, E::T *db, unsigned int rows, unsigned int cols) {  \
        relu_mask_bias_grad<E>(g, y, dz, db, rows, cols);                                          \
    }

REDLINE_MASK(f32, ElemF32)
REDLINE_MASK(bf16, Elem16<Bf16Fmt>)
REDLINE_MASK(f16, Elem16<F16Fmt>)
