/* Internals of the model front-end, shared by its files:
 *   config.c    config.json -> rm_config (jansson), rm_model life cycle
 *   tensors.c   rm_config -> logical tensors per architecture family
 *   parallel.c  "tp=..,pp=.." parsing, checks and stage splits
 *   build.c     helpers both layout builders use
 *   megatron.c  the Megatron-core (training) layout
 *   vllm.c      the vLLM (inference) layout
 *   sglang.c    the SGLang (inference) layout */
#ifndef RESHARD_MODELS_INTERNAL_H
#define RESHARD_MODELS_INTERNAL_H

#include <stdint.h>

#include "reshard_models.h"

typedef enum rm_arch {
  RM_ARCH_LLAMA = 0,
  RM_ARCH_MISTRAL,
  RM_ARCH_QWEN2,
  RM_ARCH_QWEN3,
  RM_ARCH_QWEN3_MOE,
  RM_ARCH_MIXTRAL,
  RM_ARCH_DEEPSEEK_V3,
  RM_NUM_ARCHS
} rm_arch;

/* What a config.json says, in the front-end's terms (HF defaults filled
 * in). Sizes are int64 so that products never overflow before the layout
 * checks them. */
typedef struct rm_config {
  rm_arch arch;
  int64_t vocab, hidden, layers;
  int64_t heads, kv_heads, head_dim;
  int64_t intermediate; /* dense MLP; -1 when the config has none */
  int tied;             /* tie_word_embeddings */
  int qkv_bias;         /* q/k/v_proj.bias (qwen2 always; attention_bias) */
  int o_bias;           /* o_proj.bias (attention_bias of llama, qwen3) */
  int qk_norm;          /* q_norm / k_norm (qwen3, qwen3_moe) */
  /* MoE */
  int64_t experts;          /* 0: dense */
  int64_t moe_intermediate; /* per expert */
  int64_t shared_intermediate; /* n_shared_experts * moe_intermediate */
  int router_bias;          /* e_score_correction_bias (noaux_tc) */
  int64_t first_dense;      /* first_k_dense_replace */
  int64_t moe_freq;         /* moe_layer_freq / decoder_sparse_step */
  unsigned char *dense_only; /* [layers]: mlp_only_layers (qwen3_moe) */
  /* MLA (deepseek_v3) */
  int mla;
  int64_t q_lora, kv_lora, qk_nope, qk_rope, v_head;
  /* quantization_config.weight_block_size [bn, bk]; 0 when absent */
  int64_t block[2];
} rm_config;

/* Tensor indices of one layer's roles; -1 where the layer has none. The
 * layouts declare the model's tensors in order, so these are also their
 * layout tensor ids. */
typedef struct rm_layer {
  int ln1, ln2;
  /* GQA attention */
  int q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
  /* MLA: q is q_proj when q_lora_rank is null */
  int q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;
  /* dense MLP */
  int gate, up, down;
  /* MoE: router, its bias, stacked experts, shared experts */
  int router, router_bias, egate, eup, edown, sgate, sup, sdown;
} rm_layer;

struct rm_model {
  char *path;
  rm_config c;
  reshard_dtype_t dtype;
  int layers; /* kept */
  int per_expert, block_scales;
  /* quantization_config.ignored_layers (or modules_to_not_convert): the
   * modules vLLM keeps unquantized in an fp8 checkpoint (tensors.c
   * rm_quant_skipped); NULL-free array of nskip names, block scales only */
  char **skip;
  int nskip;
  /* per-expert mode: ids of expert e's gate, up and down of layer l at
   * experts[(l * E + e) * 3 + k]; -1 in dense layers. NULL otherwise. */
  int *experts;
  rm_tensor *tensors;
  int ntensors, cap_tensors;
  int64_t params;
  int embed, norm, lm_head; /* lm_head -1 when tied */
  rm_layer *layer;          /* [layers] */
  unsigned char *role;      /* [ntensors]: RM_ROLE_* bits (tensors.c) */
};

/* What a tensor is, for what frameworks do to it after loading
 * (rm_after_load); a block scale has its weight's bits and RM_ROLE_FP8. */
enum {
  RM_ROLE_KV_B = 1,   /* MLA kv_b_proj */
  RM_ROLE_EXPERT = 2, /* a routed expert's gate, up or down */
  RM_ROLE_FP8 = 4     /* block-quantized: fp8 weight or its scales */
};

const char *rm_arch_name(rm_arch arch);
int rm_layer_is_moe(const rm_config *c, int layer);

/* tensors.c: fills m->tensors, m->layer, ids and params from m->c. */
reshard_result_t rm_build_tensors(rm_model *m);

/* parallel.c */
/* Checks what both sides share: positive sizes, rank count in int range,
 * pp <= layers, tp dividing the heads, ep/etp only on MoE models, ep x etp
 * dividing tp x dp. etp: the side's resolved
 * expert tensor parallelism. `side` names the builder in messages. */
reshard_result_t rm_check_common(const rm_model *m, const rm_parallel *p, int etp, int first_rank,
                                 const char *side);
/* The SGLang key set in p (attn_dp, dp_lm_head, moe_dense_tp,
 * shared_fusion), NULL when none: the other builders refuse it. */
const char *rm_sglang_key(const rm_parallel *p);
/* Megatron's layers per stage: stage s holds [start[s], start[s+1]);
 * start has pp + 1 entries. Refuses what get_num_layers_to_build refuses. */
reshard_result_t rm_megatron_stages(const rm_model *m, const rm_parallel *p, int *start);
/* vLLM's layers per stage (get_pp_indices). */
void rm_vllm_stage_layers(int layers, int pp, int stage, int *first, int *count);

/* build.c */
reshard_result_t rm_declare_tensors(reshard_layout_t *L, const rm_model *m);
/* Vocabulary-parallel buffer on a [dp, tp] mesh: rows padded to vpad,
 * Shard(0) over tp, replicated over dp. */
reshard_result_t rm_buf_vocab(reshard_layout_t *L, const char *name,
                              int tensor, int mesh, int64_t vpad,
                              int64_t hidden);
/* A layout under construction, of a model. */
typedef struct rm_builder {
  reshard_layout_t *L;
  const rm_model *m;
} rm_builder;

/* A buffer of weights, fused like reshard_layout_add_fused (or, with
 * origins, reshard_layout_add_windows), and, when the parts' tensors have
 * block scales, the buffer of their scales named `name`_scale_inv (vLLM's
 * and the checkpoint's spelling when name ends in "weight"), split and
 * fused the same way. Checked first: every split and every fused part but
 * the last fall on whole blocks, otherwise the scales could not be split
 * like their weights. */
reshard_result_t rm_add_weights(rm_builder *b, const char *name, int concat_dim, int num_groups, int num_parts,
                                const reshard_part_t *parts, const int64_t *const *origins);
/* Attention q, k, v (weights or biases) as Megatron-core's linear_qkv
 * (vllm = 0) or vLLM's qkv_proj (vllm = 1), through the core's builders
 * (reshard_layout_add_megatron_qkv / _vllm_qkv), on mesh's axis tp_axis;
 * with block scales, the scales the same way in units of blocks (whole
 * blocks per head). */
reshard_result_t rm_add_qkv(rm_builder *b, const char *name, int vllm, int q, int k, int v, int mesh, int tp_axis);
/* [gate; up] through reshard_layout_add_gate_up (tp_axis -1: replicated),
 * scales likewise after rm_add_weights' whole-block checks. */
reshard_result_t rm_add_gate_up(rm_builder *b, const char *name, int gate, int up, int mesh, int tp_axis);
/* rm_add_weights with one part. */
reshard_result_t rm_weight1(rm_builder *b, const char *name, int tensor,
                            int mesh, const reshard_placement_t *pl);
/* Expert e's gate (k = 0), up (1) or down (2) in per-expert mode. */
static inline int rm_expert(const rm_model *m, int layer, int e, int k) {
  return m->experts[((size_t)layer * (size_t)m->c.experts + (size_t)e) * 3 + (size_t)k];
}
/* printf into a caller's buffer, for buffer names. */
const char *rm_fmt(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int64_t rm_round_up(int64_t v, int64_t m);

#endif
