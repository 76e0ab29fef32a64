/* In-code transformer layouts: the logical tensors of a decoder-only
 * transformer and two ways of laying them out, Megatron-style (training)
 * and vLLM-style (inference). A stepping stone for the HF config.json
 * front-end: tests and plan_bench build realistic layouts from a handful
 * of numbers.
 *
 * Logical tensors (HF names; N is the layer):
 *   model.embed_tokens.weight                        [V, H]
 *   model.layers.N.input_layernorm.weight            [H]
 *   model.layers.N.self_attn.{q,k,v}_proj.weight     [heads*hd | kv*hd, H]
 *   model.layers.N.self_attn.o_proj.weight           [H, heads*hd]
 *   model.layers.N.post_attention_layernorm.weight   [H]
 *   dense:  model.layers.N.mlp.{gate,up}_proj.weight [I, H]
 *           model.layers.N.mlp.down_proj.weight      [H, I]
 *   MoE:    model.layers.N.mlp.gate.weight           [E, H]   (router)
 *           model.layers.N.mlp.experts.{gate,up}_proj.weight  [E, Im, H]
 *           model.layers.N.mlp.experts.down_proj.weight       [E, H, Im]
 *   model.norm.weight                                [H]
 *   lm_head.weight                                   [V, H]   (untied only)
 * Every layer is MoE when experts > 0 (no dense prefix, no shared expert).
 *
 * Rank order. Megatron: tp fastest, then dp, then pp:
 *   rank = first + tp_i + tp * (dp_i + dp * pp_i).
 * vLLM: tp fastest, then dp: rank = first + tp_i + tp * dp_i.
 *
 * Expert convention. Megatron (expert tensor parallelism 1): the tp*dp
 * ranks of a stage, in rank order, form the mesh [tp*dp/ep, ep] (ep
 * fastest) with (Replicate, Shard(0)): consecutive blocks of ep ranks each
 * hold all experts, E/ep per rank. Each rank's fc1 buffer is the stack of
 * its experts' [gate_e; up_e] (concat along dim 1 of [E, Im, H]), fc2 the
 * stack of down_e. vLLM: the tp*dp ranks form [ep, tp*dp/ep] (expert TP
 * fastest) with (Shard(0), Shard(1)) for w13 = concat(gate, up) along
 * dim 1 and (Shard(0), Shard(2)) for w2 = down: ep = tp*dp is vLLM's
 * expert-parallel mode, ep = 1 its default (experts' intermediate dim
 * split over tp*dp, "TP flattened across DP").
 */
#ifndef RESHARD_BENCH_MODEL_LAYOUTS_H
#define RESHARD_BENCH_MODEL_LAYOUTS_H

#include <stdint.h>

#include "reshard.h"

typedef struct ml_model {
  int layers;
  int hidden;
  int heads;
  int kv_heads;
  int head_dim;
  int intermediate;     /* dense MLP */
  int64_t vocab;
  int experts;          /* 0: dense */
  int moe_intermediate; /* per expert */
  int tied_embeddings;  /* lm_head is embed_tokens */
  reshard_dtype_t dtype;
} ml_model;

typedef struct ml_megatron {
  int tp, pp, dp, ep; /* ep: 1 when dense */
} ml_megatron;

typedef struct ml_vllm {
  int tp, dp, ep;
} ml_vllm;

/* Logical parameters (no padding, no replicas). */
int64_t ml_num_params(const ml_model *m);
/* Logical tensors the layouts declare. */
int ml_num_tensors(const ml_model *m);

int ml_megatron_ranks(const ml_megatron *p);
int ml_vllm_ranks(const ml_vllm *p);

/* Builders; ranks start at first_rank. Configurations the real frameworks
 * reject (tp not dividing kv_heads for Megatron, ep not dividing tp*dp,
 * experts not divisible by ep, ...) are RESHARD_ERROR_INVALID_ARGUMENT with
 * the reason in reshard_last_error(). */
reshard_result_t ml_megatron_layout(const ml_model *m, const ml_megatron *p,
                                    int first_rank, reshard_layout_t **out);
reshard_result_t ml_vllm_layout(const ml_model *m, const ml_vllm *p,
                                int first_rank, reshard_layout_t **out);

/* Both sides at once: source ranks 0..S-1 and destination ranks S..S+D-1,
 * or, colocated, both from 0. *nranks: the communicator size needed. */
reshard_result_t ml_build_pair(const ml_model *m, const ml_megatron *src,
                               const ml_vllm *dst, int colocate,
                               reshard_layout_t **src_out,
                               reshard_layout_t **dst_out, int *nranks);

#endif
