// Runs Redline's CUDA kernels (cuda/redline.cu, compiled unchanged) on the
// CPU through cuda_host.h. tests/cuda_emulated.rs builds this into a shared
// library with the host's C++ compiler and calls `emu_launch` the way the
// driver is called: a kernel name, a grid, a block and an array of pointers
// to the arguments (host addresses where the GPU would take device ones).
#include "cuda_host.h"

#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../redline.cu"

namespace {

template <class... A, std::size_t... I>
void call_with(void (*kernel)(A...), void **args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}

template <class... A>
void call(void (*kernel)(A...), void **args) {
    call_with(kernel, args, std::index_sequence_for<A...>{});
}

struct Entry {
    const char *name;
    void (*run)(void **);
};

#define EMU_KERNEL(k) {#k, [](void **a) { call(k, a); }}

const Entry KERNELS[] = {
    EMU_KERNEL(redline_conv_fwd_f32),
    EMU_KERNEL(redline_conv_dx_f32),
    EMU_KERNEL(redline_conv_dw_f32),
    EMU_KERNEL(redline_sum_splits_f32),
    EMU_KERNEL(redline_relu_mask_bias_grad_f32),
    EMU_KERNEL(redline_relu_mask_bias_grad_bf16),
    EMU_KERNEL(redline_relu_mask_bias_grad_f16),
    EMU_KERNEL(redline_ce_fwd_f32),
    EMU_KERNEL(redline_ce_bwd_f32),
    EMU_KERNEL(redline_cursor_gather),
    EMU_KERNEL(redline_step_sums),
    EMU_KERNEL(redline_count_u32),
    EMU_KERNEL(redline_count_f64),
    EMU_KERNEL(redline_multi_adam_f32),
    EMU_KERNEL(redline_multi_sgd_f32),
    EMU_KERNEL(redline_multi_adam_bf16),
    EMU_KERNEL(redline_multi_sgd_bf16),
    EMU_KERNEL(redline_bias_pool_relu_f32),
    EMU_KERNEL(redline_bias_pool_relu_bwd_f32),
    EMU_KERNEL(redline_bias_pool_relu_bf16),
    EMU_KERNEL(redline_bias_pool_relu_bwd_bf16),
    EMU_KERNEL(redline_bias_pool_relu_f16),
    EMU_KERNEL(redline_bias_pool_relu_bwd_f16),
    EMU_KERNEL(redline_conv_fwd_bf16),
    EMU_KERNEL(redline_conv_dx_bf16),
    EMU_KERNEL(redline_conv_dw_bf16),
    EMU_KERNEL(redline_sum_splits_bf16),
    EMU_KERNEL(redline_conv_fwd_f16),
    EMU_KERNEL(redline_conv_dx_f16),
    EMU_KERNEL(redline_conv_dw_f16),
    EMU_KERNEL(redline_sum_splits_f16),
    EMU_KERNEL(redline_conv_fwd_tf32),
    EMU_KERNEL(redline_conv_dx_tf32),
    EMU_KERNEL(redline_conv_dw_tf32),
    EMU_KERNEL(redline_attn_fwd_mma_bf16_d64),
    EMU_KERNEL(redline_attn_fwd_mma_bf16_d32),
    EMU_KERNEL(redline_attn_fwd_mma_f16_d64),
    EMU_KERNEL(redline_attn_fwd_mma_f16_d32),
    EMU_KERNEL(redline_attn_dkdv_mma_bf16_d64),
    EMU_KERNEL(redline_attn_dq_mma_bf16_d64),
    EMU_KERNEL(redline_attn_dkdv_mma_bf16_d32),
    EMU_KERNEL(redline_attn_dq_mma_bf16_d32),
    EMU_KERNEL(redline_attn_dkdv_mma_f16_d64),
    EMU_KERNEL(redline_attn_dq_mma_f16_d64),
    EMU_KERNEL(redline_attn_dkdv_mma_f16_d32),
    EMU_KERNEL(redline_attn_dq_mma_f16_d32),
    EMU_KERNEL(redline_attn_fwd_f32),
    EMU_KERNEL(redline_attn_dot_f32),
    EMU_KERNEL(redline_attn_dkdv_f32),
    EMU_KERNEL(redline_attn_dq_f32),
    EMU_KERNEL(redline_attn_fwd_bf16),
    EMU_KERNEL(redline_attn_dot_bf16),
    EMU_KERNEL(redline_attn_dkdv_bf16),
    EMU_KERNEL(redline_attn_dq_bf16),
    EMU_KERNEL(redline_attn_fwd_f16),
    EMU_KERNEL(redline_attn_dot_f16),
    EMU_KERNEL(redline_attn_dkdv_f16),
    EMU_KERNEL(redline_attn_dq_f16),
};

}  // namespace

// 0: ran; 1: no kernel of that name; 2: a block of 0 or over 1024 threads,
// or of a size that is not whole warps.
extern "C" int emu_launch(const char *name, unsigned int gx, unsigned int gy, unsigned int gz,
                          unsigned int bx, unsigned int by, unsigned int bz, void **args) {
    const Entry *entry = nullptr;
    for (const Entry &e : KERNELS)
        if (std::strcmp(e.name, name) == 0) entry = &e;
    if (entry == nullptr) return 1;
    unsigned int threads = bx * by * bz;
    if (threads == 0 || threads > 1024 || threads % 32 != 0) return 2;
    // One launch at a time: the grid, the block's barrier and the shared
    // arrays are the process's.
    static std::mutex one_launch;
    std::lock_guard<std::mutex> hold(one_launch);
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{bx, by, bz};
    EmuBarrier block(threads);
    std::vector<EmuWarp> warps(threads / 32);
    emu_block_barrier = &block;
    emu_warps = warps.data();
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned int t = 0; t < threads; t++) {
        pool.emplace_back([=, &block] {
            threadIdx = dim3{t % bx, (t / bx) % by, t / (bx * by)};
            for (unsigned int z = 0; z < gz; z++)
                for (unsigned int y = 0; y < gy; y++)
                    for (unsigned int x = 0; x < gx; x++) {
                        blockIdx = dim3{x, y, z};
                        entry->run(args);
                        // The next block reuses the shared arrays.
                        block.wait("end of block");
                    }
        });
    }
    for (std::thread &t : pool) t.join();
    emu_block_barrier = nullptr;
    emu_warps = nullptr;
    return 0;
}
