/* Buffers as the frameworks' parameters: their names on a rank, and what a
 * framework does to a parameter after loading that a sync must know. */
#include <stdlib.h>

#include "common/error.h"
#include "layout/layout.h"
#include "models_internal.h"

reshard_result_t rm_parameter_name(const reshard_layout_t *L, int buffer_id, int rank, const char **name) {
  rs_error_clear();
  if (!L || !name) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "rm_parameter_name: NULL argument");
  *name = NULL;
  const char *n = NULL;
  RS_CHECK(reshard_layout_buffer_name(L, buffer_id, &n));
  size_t bytes = 0;
  RS_CHECK(reshard_layout_buffer_bytes(L, buffer_id, rank, &bytes));
  int held = bytes > 0;
  if (!held) { /* a zero-byte share is still held (e.g. a padding-only shard) */
    unsigned char *in = rs_layout_rank_meshes(L, rank);
    if (!in) return RESHARD_ERROR_OUT_OF_MEMORY;
    held = rs_layout_buffer_on_rank(L, buffer_id, rank, in);
    free(in);
  }
  if (!held)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "rm_parameter_name: rank %d holds no part of buffer %d ('%s')",
                    rank, buffer_id, n);
  *name = n;
  return RESHARD_SUCCESS;
}

/* vLLM 0.33.0 (4ba787ec9); the functions named are where it happens. */
static const char *const KV_B =
    "vLLM's MLAAttention.process_weights_after_loading derives W_UK_T and W_UV from kv_b_proj.weight: views of it "
    "when it is bf16/fp16 on CUDA's default attention backends (nothing to re-run), dequantized copies when it is "
    "fp8 and on the AITER, DCP q-replicate and AMX paths (re-run process_weights_after_loading after the sync)";
static const char *const EXPERTS =
    "vLLM's fused-MoE backends may rewrite w13/w2 after loading (convert_to_*_moe_kernel_format): FlashInfer "
    "CUTLASS swaps w13 to [up; gate] (swap_w13_to_w31; the default for fp8 block-quantized experts with expert "
    "parallelism), FlashInfer TRT-LLM (the first choice on Blackwell) pads and permutes w13 and w2, AITER "
    "shuffles them; reshard writes the loaded layout ([gate; up]): serve with the Triton backend (Hopper's default "
    "for bf16) or re-run process_weights_after_loading after the sync";
static const char *const FP8 =
    "vLLM's DeepGEMM fp8 block kernels (the default on Hopper and Blackwell) requantize the fp8 weight and its "
    "scales to power-of-two (UE8M0) scales in place and move weight_scale_inv into DeepGEMM's layout after loading "
    "(deepgemm_post_process_fp8_weight_block); reshard writes the checkpoint's format: re-run "
    "process_weights_after_loading after the sync, or serve without DeepGEMM (VLLM_USE_DEEP_GEMM=0)";

static const char *const EXPERTS_FP8 =
    "vLLM's fp8 fused-MoE backends rewrite w13/w2 and their scales after loading (convert_to_fp8_moe_kernel_format): "
    "FlashInfer CUTLASS (the default with expert parallelism) swaps w13 and its scales to [up; gate], DeepGEMM "
    "requantizes weights and scales to UE8M0 in place and changes the scales' layout, TRT-LLM and AITER shuffle; "
    "reshard writes the checkpoint's format ([gate; up]): re-run process_weights_after_loading after the sync, or "
    "serve with the Triton backend";

/* SGLang 0.5.23 */
static const char *const SGL_KV_B =
    "SGLang's DeepseekV2WeightLoaderMixin.post_load_weights (models/deepseek_common/deepseek_weight_loader.py) splits "
    "kv_b_proj.weight into the attention's w_kc and w_vc, contiguous copies (bind_or_assign): re-run the model's "
    "post_load_weights after the sync";

const char *rm_after_load(const rm_model *m, rm_framework fw, const reshard_layout_t *L, int buffer_id) {
  if (!m || !L || buffer_id < 0 || buffer_id >= L->nbuffers) return NULL;
  if (fw == RM_FRAMEWORK_SGLANG) {
    const rs_buffer *b = &L->buffers[buffer_id];
    int t = b->kind == RS_BUFFER_FUSED ? L->parts[b->first_part].tensor : -1;
    return t >= 0 && t < m->ntensors && (m->role[t] & RM_ROLE_KV_B) ? SGL_KV_B : NULL;
  }
  if (fw != RM_FRAMEWORK_VLLM) return NULL;
  const rs_buffer *b = &L->buffers[buffer_id];
  if (b->kind != RS_BUFFER_FUSED) return NULL;
  int t = L->parts[b->first_part].tensor;
  if (t < 0 || t >= m->ntensors) return NULL;
  unsigned char role = m->role[t];
  if (role & RM_ROLE_KV_B) return KV_B;
  if (role & RM_ROLE_EXPERT) return role & RM_ROLE_FP8 ? EXPERTS_FP8 : EXPERTS;
  if (role & RM_ROLE_FP8) return FP8;
  return NULL;
}
