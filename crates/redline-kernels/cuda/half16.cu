// The 16-bit floating-point formats of Redline's kernels, held as their
// bits (unsigned short, so that the host emulator needs no CUDA half types):
// exact widening to f32 and rounding to nearest even from it, on the bits,
// as candle's (the `half` crate's) conversions round, so the GPU, the
// emulator and the CPU give the same bits.

__device__ __forceinline__ float bf16_up(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

// Round to nearest even on the bits; a NaN stays a (quiet) NaN.
__device__ __forceinline__ unsigned short bf16_down(float x) {
    unsigned int b = __float_as_uint(x);
    if (isnan(x)) return (unsigned short)((b | 0x00400000u) >> 16);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// IEEE binary16: 5 exponent bits (bias 15), 10 mantissa bits.
__device__ __forceinline__ float f16_up(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int exp = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int mant = (unsigned int)h & 0x3ffu;
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24, exact in f32.
        float v = (float)mant * 5.9604644775390625e-8f;
        return __uint_as_float(__float_as_uint(v) | sign);
    }
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even: above 65504 by half a step or more is infinity
// (which the loss scaler sees), below 2^-14 a subnormal; a NaN stays a
// (quiet) NaN.
__device__ __forceinline__ unsigned short f16_down(float x) {
    unsigned int b = __float_as_uint(x);
    unsigned int sign = (b >> 16) & 0x8000u;
    unsigned int a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // 65520 and up
    if (a < 0x38800000u) {
        // |x| < 2^-14: the subnormal step is 2^-24; scaling by 2^24 is
        // exact and rintf rounds to nearest even (2^-14 - half a step
        // rounds up to the smallest normal, 0x0400, which is its encoding).
        return (unsigned short)(sign | (unsigned int)rintf(__uint_as_float(a) * 16777216.0f));
    }
    unsigned int r = a - 0x38000000u;  // rebias the exponent: 127 - 15 = 112
    return (unsigned short)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
}

// A kernel's 16-bit format, as a type: its name in the PTX of `mma`, and
// its conversions.
struct Bf16Fmt {
    __device__ static float up(unsigned short x) { return bf16_up(x); }
    __device__ static unsigned short down(float x) { return bf16_down(x); }
};
struct F16Fmt {
    __device__ static float up(unsigned short x) { return f16_up(x); }
    __device__ static unsigned short down(float x) { return f16_down(x); }
};

// A kernel's element type in memory, as a type: f32, or a 16-bit format's
// bits, with the widening to f32 (exact) and the rounding back. For f32
// both are the identity, so a kernel written over this is, for f32, the
// same arithmetic as one written on floats.
struct ElemF32 {
    typedef float T;
    __device__ static float up(float v) { return v; }
    __device__ static float down(float v) { return v; }
};
template <class Fmt>
struct Elem16 {
    typedef unsigned short T;
    __device__ static float up(unsigned short v) { return Fmt::up(v); }
    __device__ static unsigned short down(float v) { return Fmt::down(v); }
};
