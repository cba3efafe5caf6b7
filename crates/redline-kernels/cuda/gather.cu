// The device cursor's draw (redline_data::DeviceCursor; src/cuda/gather.rs):
// row b of the batch is sample perm[counter * batch + b], copied from x and
// from y as 32-bit words (a sample is x_words words of x and y_words of y,
// whatever their element type). One block per batch row, in one launch where
// candle's ops took five (the counter's scale, the lanes' add, the
// permutation's lookup and the two index_selects): four fewer nodes in each
// captured step.
extern "C" __global__ void redline_cursor_gather(const unsigned int *perm,
                                                 const unsigned int *counter,
                                                 const unsigned int *x, const unsigned int *y,
                                                 unsigned int *out_x, unsigned int *out_y,
                                                 unsigned int batch, unsigned int x_words,
                                                 unsigned int y_words) {
    unsigned int b = blockIdx.x;
    if (b >= batch) return;
    unsigned long long row = perm[(unsigned long long)counter[0] * batch + b];
    const unsigned int *xs = x + row * x_words;
    unsigned int *xo = out_x + (unsigned long long)b * x_words;
    for (unsigned int j = threadIdx.x; j < x_words; j += blockDim.x) xo[j] = xs[j];
    const unsigned int *ys = y + row * y_words;
    unsigned int *yo = out_y + (unsigned long long)b * y_words;
    for (unsigned int j = threadIdx.x; j < y_words; j += blockDim.x) yo[j] = ys[j];
}
