//! candle's GGUF and MoE CUDA kernels (`src/moe`, `src/mmq_gguf`, `mmvq_gguf.cu`) as
//! candle-core calls them. Redline: this build leaves those kernels out
//! (`REDLINE.md`: Redline trains no quantized or mixture-of-experts models, and
//! their 32 MB of machine code per binary and 6 minutes of nvcc per build went
//! unused), so each function here stops the process with a message saying so
//! (a panic cannot unwind out of an `extern "C"` function: it aborts).
#![allow(non_snake_case)] // upstream's names, as candle-core calls them
use core::ffi::c_void;

/// Redline: the call of a kernel this build of candle-kernels leaves out.
fn unavailable(name: &str) -> ! {
    panic!(
        "candle-kernels: {name} is one of candle's GGUF/MoE CUDA kernels, which Redline's \
         vendored candle-kernels does not build (vendor/candle-kernels/REDLINE.md): quantized \
         and mixture-of-experts models do not run on a GPU in this build"
    )
}

#[cfg(feature = "cutile")]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn candle_launch_moe_align(
    _topk_ids: *const i32,
    _sorted_token_ids: *mut i32,
    _expert_ids: *mut i32,
    _num_tokens_post_pad: *mut i32,
    _cumsum: *mut i32,
    _num_experts: i32,
    _block_size: i32,
    _numel: i32,
    _max_num_tokens_padded: i32,
    _stream: *mut c_void,
) -> i32 {
    unavailable("candle_launch_moe_align")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn moe_gemm_wmma(
    _input: *const c_void,
    _weights: *const c_void,
    _sorted_token_ids: *const i32,
    _expert_ids: *const i32,
    _topk_weights: *const f32,
    _output: *mut c_void,
    _expert_counts: *mut i32,
    _expert_offsets: *mut i32,
    _num_experts: i32,
    _topk: i32,
    _size_m: i32,
    _size_n: i32,
    _size_k: i32,
    _dtype: i32,
    _is_prefill: bool,
    _stream: i64,
) {
    unavailable("moe_gemm_wmma")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn moe_gemm_gguf(
    _input: *const f32,
    _weights: *const c_void,
    _sorted_token_ids: *const i32,
    _expert_ids: *const i32,
    _topk_weights: *const f32,
    _output: *mut c_void,
    _num_experts: i32,
    _topk: i32,
    _size_m: i32,
    _size_n: i32,
    _size_k: i32,
    _gguf_dtype: i32,
    _stream: i64,
) {
    unavailable("moe_gemm_gguf")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn moe_gemm_gguf_prefill(
    _input: *const c_void,
    _weights: *const u8,
    _sorted_token_ids: *const i32,
    _expert_ids: *const i32,
    _topk_weights: *const f32,
    _output: *mut c_void,
    _num_experts: i32,
    _topk: i32,
    _size_m: i32,
    _size_n: i32,
    _size_k: i32,
    _input_dtype: i32,
    _gguf_dtype: i32,
    _stream: i64,
) {
    unavailable("moe_gemm_gguf_prefill")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_0_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_0_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_1_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_1_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_0_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_0_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_1_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_1_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q8_0_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q8_0_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q2_k_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q2_k_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q3_k_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q3_k_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_k_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_k_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_k_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_k_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q6_k_bf16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q6_k_bf16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_0_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_0_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_1_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_1_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_0_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_0_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_1_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_1_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q8_0_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q8_0_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q2_k_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q2_k_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q3_k_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q3_k_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_k_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_k_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_k_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_k_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q6_k_f32_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q6_k_f32_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_0_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_0_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_1_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_1_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_0_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_0_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_1_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_1_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q8_0_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q8_0_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q2_k_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q2_k_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q3_k_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q3_k_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q4_k_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q4_k_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q5_k_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q5_k_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_q6_k_f16_plain(
    _vx: *const c_void,
    _vy: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i32,
    _nrows_x: i32,
    _stride_col_y: i32,
    _stride_col_dst: i32,
    _b_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_q6_k_f16_plain")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_quantize_q8_1_bf16(
    _x: *const c_void,
    _vy: *mut c_void,
    _kx: i32,
    _kx_padded: i32,
    _num_rows: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_quantize_q8_1_bf16")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_quantize_q8_1_f16(
    _x: *const c_void,
    _vy: *mut c_void,
    _kx: i32,
    _kx_padded: i32,
    _num_rows: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_quantize_q8_1_f16")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmvq_gguf_quantize_q8_1_f32(
    _x: *const c_void,
    _vy: *mut c_void,
    _kx: i32,
    _kx_padded: i32,
    _num_rows: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmvq_gguf_quantize_q8_1_f32")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_quantize_q8_1_D4(
    _x: *const c_void,
    _ids: *const i32,
    _vy: *mut c_void,
    _type_x: i32,
    _ne00: i64,
    _s01: i64,
    _s02: i64,
    _s03: i64,
    _ne0: i64,
    _ne1: i64,
    _ne2: i64,
    _ne3: i64,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_quantize_q8_1_D4")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_quantize_q8_1_DS4(
    _x: *const c_void,
    _ids: *const i32,
    _vy: *mut c_void,
    _type_x: i32,
    _ne00: i64,
    _s01: i64,
    _s02: i64,
    _s03: i64,
    _ne0: i64,
    _ne1: i64,
    _ne2: i64,
    _ne3: i64,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_quantize_q8_1_DS4")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_quantize_q8_1_D2S6(
    _x: *const c_void,
    _ids: *const i32,
    _vy: *mut c_void,
    _type_x: i32,
    _ne00: i64,
    _s01: i64,
    _s02: i64,
    _s03: i64,
    _ne0: i64,
    _ne1: i64,
    _ne2: i64,
    _ne3: i64,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_quantize_q8_1_D2S6")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q4_0(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q4_0")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q4_1(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q4_1")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q5_0(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q5_0")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q5_1(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q5_1")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q8_0(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q8_0")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q2_k(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q2_k")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q3_k(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q3_k")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q4_k(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q4_k")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q5_k(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q5_k")
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn launch_mmq_gguf_q6_k(
    _tmp_fixup: *mut c_void,
    _x: *const c_void,
    _y: *const c_void,
    _dst: *mut c_void,
    _ncols_x: i64,
    _nrows_x: i64,
    _ncols_y: i64,
    _stride_row_x: i64,
    _stride_col_dst: i64,
    _cc: i32,
    _nsm: i32,
    _smpbo: i64,
    _warp_size: i32,
    _stream: *mut c_void,
) {
    unavailable("launch_mmq_gguf_q6_k")
}
