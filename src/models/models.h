/* Model front-end: HuggingFace config.json -> logical tensors, and the
 * Megatron (training) and vLLM (inference) layouts over them.
 *
 * A library module for the tools, tests and examples (library target
 * reshard_models); the core library never depends on it.
 *
 * Parallel settings are written "tp=4,pp=2,dp=2,ep=8,etp=1" (missing keys
 * are 1). A side's rank count is tp x pp x dp, ranks ordered tp fastest,
 * then dp, then pp. Experts are sharded over ep x etp of the tp x dp ranks
 * of each pipeline stage (ep x etp must divide tp x dp), the convention of
 * Megatron-core and of vLLM's expert parallelism.
 *
 * Logical tensors carry the HF checkpoint names (N: layer):
 *   model.embed_tokens.weight                              [V, H]
 *   model.layers.N.input_layernorm.weight                  [H]
 *   GQA attention (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral):
 *     model.layers.N.self_attn.q_proj.weight               [heads*hd, H]
 *     model.layers.N.self_attn.{k,v}_proj.weight           [kv*hd, H]
 *     model.layers.N.self_attn.{q,k,v}_proj.bias           qwen2 always,
 *                                     llama/qwen3 when attention_bias
 *     model.layers.N.self_attn.o_proj.weight               [H, heads*hd]
 *     model.layers.N.self_attn.o_proj.bias                 [H] (attention_bias)
 *     model.layers.N.self_attn.{q,k}_norm.weight           [hd] (qwen3*)
 *   MLA attention (deepseek_v3, kimi_k2), with dq = qk_nope + qk_rope:
 *     model.layers.N.self_attn.q_a_proj.weight             [q_lora, H]
 *     model.layers.N.self_attn.q_a_layernorm.weight        [q_lora]
 *     model.layers.N.self_attn.q_b_proj.weight             [heads*dq, q_lora]
 *       (q_proj.weight [heads*dq, H] instead when q_lora_rank is null)
 *     model.layers.N.self_attn.kv_a_proj_with_mqa.weight   [kv_lora+qk_rope, H]
 *     model.layers.N.self_attn.kv_a_layernorm.weight       [kv_lora]
 *     model.layers.N.self_attn.kv_b_proj.weight            [heads*(qk_nope+v), kv_lora]
 *     model.layers.N.self_attn.o_proj.weight               [H, heads*v]
 *   model.layers.N.post_attention_layernorm.weight         [H]
 *   dense MLP: model.layers.N.mlp.{gate,up}_proj.weight    [I, H]
 *              model.layers.N.mlp.down_proj.weight         [H, I]
 *   MoE (qwen3_moe, deepseek_v3): router and STACKED experts, one logical
 *   tensor per layer and projection where the checkpoint has one per
 *   expert (model.layers.N.mlp.experts.<e>.gate_proj.weight is row e):
 *     model.layers.N.mlp.gate.weight                       [E, H]
 *     model.layers.N.mlp.gate.e_score_correction_bias      [E] (deepseek_v3)
 *     model.layers.N.mlp.experts.{gate,up}_proj.weight     [E, Im, H]
 *     model.layers.N.mlp.experts.down_proj.weight          [E, H, Im]
 *     model.layers.N.mlp.shared_experts.{gate,up}_proj.weight [S, H]
 *     model.layers.N.mlp.shared_experts.down_proj.weight   [H, S]
 *       (deepseek_v3: S = n_shared_experts * moe_intermediate_size)
 *   Mixtral keeps its checkpoint's block_sparse_moe names, stacked likewise
 *   (w1 = gate, w3 = up, w2 = down):
 *     model.layers.N.block_sparse_moe.gate.weight          [E, H]
 *     model.layers.N.block_sparse_moe.experts.{w1,w3}.weight [E, I, H]
 *     model.layers.N.block_sparse_moe.experts.w2.weight    [E, H, I]
 *   PER-EXPERT mode (rm_model_options.per_expert) lists instead one tensor
 *   per expert and projection, exactly as the checkpoint names them:
 *     model.layers.N.mlp.experts.<e>.{gate,up}_proj.weight [Im, H]
 *     model.layers.N.mlp.experts.<e>.down_proj.weight      [H, Im]
 *     (Mixtral: block_sparse_moe.experts.<e>.{w1,w3,w2}.weight)
 *   in expert order e = 0..E-1 at the place of the stacked tensors. The
 *   parameter count is the same in both modes.
 *   BLOCK SCALES (rm_model_options.block_scales, the DeepSeek-V3 / Kimi-K2
 *   fp8 checkpoint format, quantization_config.weight_block_size [bn, bk]):
 *   every linear weight of the decoder layers except the router (attention
 *   projections, dense and shared MLP, routed experts) is fp8_e4m3 and is
 *   followed by its scale tensor <name minus ".weight">.weight_scale_inv,
 *   fp32, shape [..., ceil(out / bn), ceil(in / bk)] (leading stacked dims
 *   kept). Embeddings, lm_head, norms, biases and the router keep the
 *   model's dtype.
 *   model.norm.weight                                      [H]
 *   lm_head.weight                                         [V, H] (untied only)
 * Which layers are MoE follows HF: qwen3_moe mlp_only_layers and
 * decoder_sparse_step, deepseek_v3 first_k_dense_replace and
 * moe_layer_freq. DeepSeek's multi-token-prediction layers
 * (num_nextn_predict_layers) are not part of the main model and are not
 * listed. Every tensor has the model's dtype.
 *
 * The layout builders' conventions (buffer names, fusions, meshes) are
 * described at the top of megatron.c and vllm.c. Rank order on both sides:
 * rank = first_rank + tp_i + tp * (dp_i + dp * pp_i). */
#ifndef RESHARD_MODELS_H
#define RESHARD_MODELS_H

#include <stdint.h>

#include "reshard.h"

typedef struct rm_model rm_model; /* opaque */

typedef struct rm_parallel {
  int tp, pp, dp, ep, etp;
} rm_parallel;

/* Parses "tp=4,pp=2,dp=2,ep=8" (any order, missing keys 1; also accepts
 * etp). RESHARD_ERROR_INVALID_ARGUMENT with a message naming the bad key. */
reshard_result_t rm_parse_parallel(const char *spec, rm_parallel *out);
int rm_parallel_ranks(const rm_parallel *p); /* tp * pp * dp */

/* Reads a config.json (architectures: llama, mistral, qwen2, qwen3,
 * qwen3_moe, mixtral, deepseek_v3). layers > 0 keeps the real shapes but
 * only that many layers (so real geometries fit a CPU machine); dtype is
 * the weights' dtype (the tools' --dtype). Stacked experts, no scales:
 * rm_model_load_ex with the other defaults of RM_MODEL_OPTIONS_INIT. */
/* Errors name the file and the key: malformed JSON (line, column),
 * missing or mistyped keys, unknown architectures are
 * RESHARD_ERROR_INVALID_ARGUMENT; features no supported model uses
 * (llama mlp_bias, deepseek attention_bias) RESHARD_ERROR_UNSUPPORTED.
 * The architecture comes from "architectures"[0] (LlamaForCausalLM, ...),
 * else from "model_type" (kimi_k2 is deepseek_v3). */
reshard_result_t rm_model_load(const char *config_path, int layers,
                               reshard_dtype_t dtype, rm_model **out);

typedef struct rm_model_options {
  int layers;            /* 0: all */
  reshard_dtype_t dtype; /* of every tensor not quantized */
  int per_expert;        /* one tensor per routed expert and projection */
  int block_scales;      /* fp8 weights + weight_scale_inv tensors; needs
                            quantization_config.weight_block_size */
} rm_model_options;
#define RM_MODEL_OPTIONS_INIT {0, RESHARD_BF16, 0, 0}

/* rm_model_load with every option. block_scales on a config without
 * quantization_config.weight_block_size is RESHARD_ERROR_INVALID_ARGUMENT
 * naming the key; per_expert on a dense model is accepted (no experts). */
reshard_result_t rm_model_load_ex(const char *config_path,
                                  const rm_model_options *opts,
                                  rm_model **out);
void rm_model_free(rm_model *m);

const char *rm_model_arch(const rm_model *m); /* "llama", ... */
reshard_dtype_t rm_model_dtype(const rm_model *m);
const char *rm_model_path(const rm_model *m);
int rm_model_num_experts(const rm_model *m); /* routed experts; 0: dense */
int rm_model_layers(const rm_model *m); /* kept layers */
int rm_model_num_tensors(const rm_model *m);
/* Elements of every tensor but the block scales (the same in both expert
 * modes). */
int64_t rm_model_num_params(const rm_model *m);
int rm_model_per_expert(const rm_model *m);
int rm_model_block_scales(const rm_model *m);

/* The logical tensors (HF names, shapes, dtype), in a stable order. */
typedef struct rm_tensor {
  const char *name;
  int ndim;
  int64_t shape[RESHARD_MAX_DIMS];
  reshard_dtype_t dtype;
  int scale; /* id of its weight_scale_inv tensor, -1 when none */
} rm_tensor;
const rm_tensor *rm_model_tensor(const rm_model *m, int i);

/* Layouts over ranks first_rank .. first_rank + rm_parallel_ranks(p) - 1.
 * Invalid combinations (tp not dividing heads, ep x etp not dividing
 * tp x dp, pp > layers, ...) are RESHARD_ERROR_INVALID_ARGUMENT with a
 * message naming the setting. The layouts declare exactly the model's
 * tensors, in the model's order (layout tensor id i is rm_model_tensor i).
 * Megatron: expert grid [tp*dp/(ep*etp), ep, etp], each expert's
 * intermediate dim split over etp, replicated over expert-DP. vLLM never
 * replicates experts: the tp*dp/ep ranks that share an EP rank split each
 * expert's intermediate dim (ep=1: vLLM's default, TP flattened across DP;
 * ep=tp*dp: its expert-parallel mode), so etp must be 1 or tp*dp/ep.
 * Per-expert models have the same parallel semantics: expert e lives on EP
 * rank e / (E / ep) of its stage (both sides), split and replicated as in
 * the stacked mode; see megatron.c and vllm.c for the buffers. With block
 * scales, each scale tensor is split like its weight, which needs every
 * split of a weight (and every fused part but the last) to fall on whole
 * blocks: RESHARD_ERROR_INVALID_ARGUMENT names the tensor otherwise. */
reshard_result_t rm_megatron_layout(const rm_model *m, const rm_parallel *p,
                                    int first_rank, reshard_layout_t **out);
reshard_result_t rm_vllm_layout(const rm_model *m, const rm_parallel *p,
                                int first_rank, reshard_layout_t **out);

#endif
