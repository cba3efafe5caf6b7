// A step's scalar bookkeeping (src/cuda/tally.rs), each in one launch where
// candle's ops take an allocation, a kernel, a copy back into the variable
// and a free per value:
// - redline_step_sums: the running sums of a step (the epoch's loss and
//   metrics, the log window's loss): dst[i] += src[i] * scale[i], each
//   product and sum rounded once as candle's affine and add kernels round
//   them, so the bits are those of `sum + affine(src, scale, 0)`. (Where
//   affine's fused `src * scale + 0` and this product differ, in the sign of
//   a zero, the sum does not: a sum starts at +0 and a round-to-nearest add
//   gives -0 only from two -0s.)
// - redline_count_u32 / redline_count_f64: a device counter's += 1 (the
//   data cursor's batch number, the optimizer's step count).
// One thread does the work: the values are scalars.

#define REDLINE_MAX_SUMS 16

struct SumList {
    float *dst[REDLINE_MAX_SUMS];
    const float *src[REDLINE_MAX_SUMS];
    float scale[REDLINE_MAX_SUMS];
    unsigned int n;
};

extern "C" __global__ void redline_step_sums(SumList list) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned int n = list.n < REDLINE_MAX_SUMS ? list.n : REDLINE_MAX_SUMS;
    for (unsigned int i = 0; i < n; ++i)
        list.dst[i][0] = __fadd_rn(list.dst[i][0], __fmul_rn(list.src[i][0], list.scale[i]));
}

extern "C" __global__ void redline_count_u32(unsigned int *counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] += 1u;
}

extern "C" __global__ void redline_count_f64(double *counter) {
    if (blockIdx.x == 0 && threadIdx.x == 0) counter[0] = counter[0] + 1.0;
}
