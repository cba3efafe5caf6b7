// Just enough of CUDA's execution model to run Redline's kernels (cuda/*.cu)
// unchanged on a CPU, for the tests in tests/cuda_emulated.rs on machines
// without a GPU. Each launch runs one OS thread per CUDA thread of a block;
// the blocks run one after another, so a kernel's `__shared__` arrays
// (`static` here) belong to the block that runs. `__syncthreads()` is a
// barrier of the block's threads, `__shfl_xor_sync` an exchange between the
// 32 threads of a warp (and `emu_warp_exchange` the emulated `mma`'s). A
// barrier that not every thread reaches within 120 s (a divergent
// `__syncthreads`) ends the process with a message.
//
// Arithmetic: compiled with -ffp-contract=off, so each float operation
// rounds once, as the `__f*_rn` intrinsics do; the GPU's own `expf` and
// `log` may differ from the host's in the last bit.
#pragma once

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <mutex>

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

// A reusable barrier for `count` threads that gives up after 120 s.
class EmuBarrier {
  public:
    explicit EmuBarrier(unsigned int count = 1) : count_(count) {}
    void reset(unsigned int count) {
        count_ = count;
        waiting_ = 0;
    }
    void wait(const char *what) {
        std::unique_lock<std::mutex> lock(m_);
        unsigned long long gen = generation_;
        if (++waiting_ == count_) {
            waiting_ = 0;
            generation_++;
            cv_.notify_all();
            return;
        }
        if (!cv_.wait_for(lock, std::chrono::seconds(120), [&] { return generation_ != gen; })) {
            std::fprintf(stderr,
                         "CUDA emulator: %s: only %u of %u threads arrived in 120 s (a barrier "
                         "not every thread reaches?)\n",
                         what, waiting_, count_);
            std::fflush(stderr);
            std::_Exit(3);
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    unsigned int count_;
    unsigned int waiting_ = 0;
    unsigned long long generation_ = 0;
};

// The running block's barrier, and one barrier and exchange slot per warp.
inline EmuBarrier *emu_block_barrier = nullptr;
struct EmuWarp {
    EmuBarrier barrier{32};
    unsigned long long slot[32];
    unsigned int regs[32][8];
};
inline EmuWarp *emu_warps = nullptr;

inline unsigned int emu_thread_rank() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

inline void __syncthreads() { emu_block_barrier->wait("__syncthreads"); }

template <class T>
inline T __shfl_xor_sync(unsigned int, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffle of a type over 8 bytes");
    unsigned int rank = emu_thread_rank();
    EmuWarp &w = emu_warps[rank / 32];
    unsigned int lane = rank % 32;
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.slot[lane] = bits;
    w.barrier.wait("__shfl_xor_sync");
    bits = w.slot[lane ^ (unsigned int)lane_mask];
    w.barrier.wait("__shfl_xor_sync");
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

// Every lane of the warp gets every lane's `N` registers (for the emulated
// `mma`, whose operands are spread over the warp): all[lane][i].
template <unsigned int N>
inline void emu_warp_exchange(const unsigned int (&mine)[N], unsigned int (&all)[32][N]) {
    static_assert(N <= 8, "at most 8 registers per lane");
    unsigned int rank = emu_thread_rank();
    EmuWarp &w = emu_warps[rank / 32];
    std::memcpy(w.regs[rank % 32], mine, sizeof mine);
    w.barrier.wait("warp exchange");
    for (unsigned int l = 0; l < 32; l++) std::memcpy(all[l], w.regs[l], sizeof mine);
    w.barrier.wait("warp exchange");
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __uint_as_float(unsigned int v) {
    float f;
    std::memcpy(&f, &v, sizeof f);
    return f;
}
inline unsigned int __float_as_uint(float v) {
    unsigned int u;
    std::memcpy(&u, &v, sizeof u);
    return u;
}
inline double __longlong_as_double(long long v) {
    double d;
    std::memcpy(&d, &v, sizeof d);
    return d;
}
using std::isnan;

inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
