/*
 * reshard model front-end: HuggingFace config.json -> logical tensors, and
 * the Megatron-core (training) and vLLM (inference) layouts over them,
 * with each framework's own parameter names.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Installed as libreshard_models (shared and static; pkg-config
 * reshard_models, CMake reshard::reshard_models) beside libreshard, which it
 * uses; the core library never depends on it. Errors are reported like the
 * core's: a result code and reshard_last_error().
 *
 * In five lines:
 *   rm_model *m;  rm_model_load("config.json", 0, RESHARD_BF16, &m);
 *   rm_parallel t, v;  rm_parse_parallel("tp=4,pp=2", &t);  rm_parse_parallel("tp=2,dp=2", &v);
 *   rm_megatron_layout(m, &t, 0, &src);   ranks 0 .. 7
 *   rm_vllm_layout(m, &v, 8, &dst);       ranks 8 .. 11
 *   reshard_layout_find_buffer(dst, "model.layers.3.self_attn.qkv_proj.weight", rank, &id);
 *
 * RANKS. A side holds tp x pp x dp ranks from first_rank on, numbered as
 * the framework numbers them:
 *   Megatron-core (parallel_state.py, order "tp-cp-ep-dp-pp"):
 *     rank = first_rank + tp_i + tp * (dp_i + dp * pp_i); experts inside a
 *     stage: etp fastest, then ep, then expert-DP.
 *   vLLM (parallel_state.py initialize_model_parallel, DP x PP x TP):
 *     rank = first_rank + tp_i + tp * (pp_i + pp * dp_i); an RL framework
 *     that launches one engine per DP replica numbers them the same way.
 *
 * BUFFERS ARE PARAMETERS. Every buffer is named exactly as the framework
 * names that parameter on the ranks that hold it (model.named_parameters()
 * on that rank; Megatron's router expert_bias is in named_buffers()):
 *   Megatron-core, Transformer Engine spec: layers numbered from 0 on every
 *     pipeline stage (decoder.layers.0.self_attention.linear_qkv.weight on
 *     each stage), input_layernorm fused into linear_qkv.layer_norm_weight
 *     (GQA layers), pre_mlp_layernorm into mlp.linear_fc1.layer_norm_weight
 *     (dense MLPs), grouped experts mlp.experts.linear_fc1.weight<i> per
 *     local expert i (TEGroupedMLP; grouped_gemm=0: SequentialMLP's
 *     mlp.experts.local_experts.<i>.linear_fc1.weight);
 *   vLLM: its modules' names with global layer numbers
 *     (model.layers.2.self_attn.qkv_proj.weight, ...mlp.gate_up_proj...,
 *     ...mlp.experts.routed_experts.w13_weight: vLLM >= 0.24; older
 *     versions name it ...mlp.experts.w13_weight).
 * So names repeat across stages: (rank, name) -> buffer is
 * reshard_layout_find_buffer(L, name, rank, &id); buffer -> name on a rank
 * is rm_parameter_name. megatron.c and vllm.c list the sources (upstream
 * files and functions) of every rule.
 *
 * LOGICAL TENSORS carry the HF checkpoint names (N: global layer):
 *   model.embed_tokens.weight                              [V, H]
 *   model.layers.N.input_layernorm.weight                  [H]
 *   GQA attention (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral):
 *     model.layers.N.self_attn.q_proj.weight               [heads*hd, H]
 *     model.layers.N.self_attn.{k,v}_proj.weight           [kv*hd, H]
 *     model.layers.N.self_attn.{q,k,v}_proj.bias           qwen2 always,
 *                                     llama/qwen3 when attention_bias
 *     model.layers.N.self_attn.o_proj.weight               [H, heads*hd]
 *     model.layers.N.self_attn.o_proj.bias                 [H] (llama with
 *                   attention_bias; vLLM's Qwen3 has none whatever it says)
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
 *     model.layers.N.mlp.gate.e_score_correction_bias      [E] fp32, whatever
 *                    the model's dtype (deepseek_v3 with topk_method noaux_tc)
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
 *   parameter count and the buffers are the same in both modes.
 *   BLOCK SCALES (rm_model_options.block_scales, the DeepSeek-V3 / Kimi-K2
 *   fp8 checkpoint format, quantization_config.weight_block_size [bn, bk]):
 *   every linear weight of the decoder layers (attention projections,
 *   dense and shared MLP, routed experts, and Qwen3-MoE's router, which
 *   vLLM builds with the quant config) is fp8_e4m3 and is followed by its
 *   scale tensor <name minus ".weight">.weight_scale_inv, fp32, shape
 *   [..., ceil(out / bn), ceil(in / bk)] (leading stacked dims kept),
 *   unless quantization_config.ignored_layers (or modules_to_not_convert)
 *   lists the vLLM layer that serves it: its own name, the fused layer's
 *   (qkv_proj, gate_up_proj, fused_qkv_a_proj) or all of that layer's
 *   shards' names, <block>.experts for routed experts (vLLM's
 *   Fp8Config and is_layer_skipped; listing part of a fused layer is
 *   RESHARD_ERROR_INVALID_ARGUMENT, as vLLM refuses it). Embeddings,
 *   lm_head, norms, biases and the other routers keep the model's dtype.
 *   model.norm.weight                                      [H]
 *   lm_head.weight                                         [V, H] (untied only)
 * Which layers are MoE follows HF: qwen3_moe mlp_only_layers and
 * decoder_sparse_step, deepseek_v3 first_k_dense_replace and
 * moe_layer_freq. DeepSeek's multi-token-prediction layers
 * (num_nextn_predict_layers) are not part of the main model and are not
 * listed. Every other tensor has the model's dtype.
 *
 * NOT MODELLED: Megatron with tp not dividing the KV heads (linear_qkv
 * then split evenly across groups), vLLM's EPLB redundant experts, round_robin expert
 * placement, VLLM_PP_LAYER_PARTITION, added (LoRA) vocabulary, prefill
 * context parallelism, the last stage's extra embed_tokens under
 * EAGLE-style speculative decoding (models/utils.py
 * spec_decode_needs_target_embed); Megatron's virtual pipeline stages,
 * pipeline_model_parallel_layout, context parallelism,
 * account_for_embedding/loss_in_pipeline_split, fused MLA down projections
 * (mla_down_proj_fusion) and linear_q_proj.layer_norm_weight (MLA without
 * q_lora, Megatron-LM after 2026-07), moe_single_grouped_weight; fp8
 * parameters inside Transformer Engine (the *_scale_inv buffers of the
 * Megatron side are not Megatron's names).
 */
#ifndef RESHARD_MODELS_H
#define RESHARD_MODELS_H

#include <stdint.h>

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rm_model rm_model; /* opaque */

/* One side's parallel settings. Use RM_PARALLEL_INIT or rm_parse_parallel:
 * some defaults are not zero. */
typedef struct rm_parallel {
  int tp, pp, dp, ep; /* >= 1 */
  /* Expert tensor parallelism; 0: the framework's default. Megatron-core
   * defaults expert_tensor_parallel_size to tp; vLLM splits each expert
   * over the tp x dp / ep ranks that share an EP rank (the only etp it
   * has). */
  int etp;
  /* Megatron: the embedding and output rows the trainer built (Megatron-LM
   * pads the tokenizer's vocabulary to a multiple of
   * make_vocab_size_divisible_by x tp; Megatron-Bridge does not pad);
   * 0: vocab_size, unpadded. Not derivable from config.json. */
  int64_t vocab;
  /* Megatron: num_layers_in_first_pipeline_stage / _last_; 0: not given
   * (then pp must divide the layers). */
  int first, last;
  /* Megatron: 1 (default) grouped experts, TEGroupedMLP (parameters
   * mlp.experts.linear_fc1.weight<i>); 0: SequentialMLP
   * (mlp.experts.local_experts.<i>.linear_fc1.weight). */
  int grouped_gemm;
  /* vLLM: -1 (default) sequence-parallel MoE as vLLM decides it; 0 or 1:
   * forced (see rm_vllm_layout). */
  int sp_moe;
  /* vLLM: 0 (default) routed experts' w13 per expert as loaded, [gate
   * (w1); up (w3)]; 1: [up (w3); gate (w1)], the format FlashInfer
   * CUTLASS's fused-MoE kernels read (fused_moe/oracle/unquantized.py
   * convert_to_unquantized_kernel_format: swap_w13_to_w31), so a vLLM
   * serving with that backend is written in its live format. */
  int w31;
  /* FSDP2 (rm_fsdp_layout): the ranks each parameter is sharded over
   * (Shard(0)) and the replicas of that group (HSDP); 0: unset, 1. */
  int dp_shard, dp_replicate;
  /* Megatron: context_parallel_size; 0: unset, 1. Context-parallel ranks
   * hold the same weights (they split the sequence), so a stage's dense
   * weights are replicated over cp x dp ranks and its experts over
   * tp x cp x dp / (ep x etp) (see rm_megatron_layout). */
  int cp;
  /* SGLang (rm_sglang_layout): attn_dp, the attention data-parallel groups
   * inside the TP group (--attn-dp-size; the deprecated --dp-size N
   * --enable-dp-attention), 0: unset, 1; dp_lm_head 1: lm_head split over
   * the attention-TP group (--enable-dp-lm-head); moe_dense_tp 1: the dense
   * MLP layers of a MoE model replicated (--moe-dense-tp-size 1; tp is
   * SGLang's other value, 0: unset); shared_fusion -1: SGLang's default
   * shared-experts fusion rule, 0: --disable-shared-experts-fusion. */
  int attn_dp, dp_lm_head, moe_dense_tp, shared_fusion;
} rm_parallel;
#define RM_PARALLEL_INIT {1, 1, 1, 1, 0, 0, 0, 0, 1, -1, 0, 0, 0, 0, 0, 0, 0, -1}

/* Parses "tp=4,pp=2,dp=2,ep=8" (any order; missing keys keep their
 * RM_PARALLEL_INIT defaults). Keys: tp, pp, dp, ep, etp (Megatron and
 * vLLM); cp, vocab, first, last, grouped_gemm (Megatron); sp_moe, w31 (vLLM);
 * dp_shard, dp_replicate (FSDP2); attn_dp, dp_lm_head, moe_dense_tp,
 * shared_fusion (SGLang). A layout builder refuses the other
 * frameworks' keys when they are set.
 * RESHARD_ERROR_INVALID_ARGUMENT with a message naming the bad key. */
reshard_result_t rm_parse_parallel(const char *spec, rm_parallel *out);
/* The ranks a side of this spec takes: tp * pp * dp (* cp where set:
 * Megatron; * dp_shard * dp_replicate where set: FSDP2); 0 for NULL or an
 * overflow. */
int rm_parallel_ranks(const rm_parallel *p);

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
                            quantization_config.weight_block_size, or: */
  int64_t block[2];      /* the [out, in] block when > 0 (a bf16 checkpoint
                            served in fp8, or another block than the
                            config's); 0: the config's */
} rm_model_options;
#define RM_MODEL_OPTIONS_INIT {0, RESHARD_BF16, 0, 0, {0, 0}}

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

/* Layouts over ranks first_rank .. first_rank + rm_parallel_ranks(p) - 1,
 * numbered as above. The layouts declare exactly the model's tensors, in
 * the model's order (layout tensor id i is rm_model_tensor i). What the
 * framework refuses is RESHARD_ERROR_INVALID_ARGUMENT naming the setting
 * and the rule: tp not dividing the heads (or, Megatron, the KV groups),
 * ep x etp not dividing tp x dp, pp > layers, the other framework's keys.
 *
 * Megatron-core: etp defaults to tp (ModelParallelConfig; Megatron-Bridge
 * sets 1 when ep > 1: say etp=1 there); expert grid [tp*dp/(ep*etp), ep,
 * etp] per stage, each expert's intermediate dim split over etp,
 * replicated over expert-DP; ep must divide the experts; pp must divide
 * the layers unless first=<n> and/or last=<n> give the first / last
 * stage's (the stages left share the rest evenly, get_num_layers_to_build);
 * the embedding and output rows are vocab=<rows>, default vocab_size (no
 * padding, as Megatron-Bridge; Megatron-LM pads the tokenizer's vocabulary
 * to a multiple of make_vocab_size_divisible_by x tp: pass that), at least
 * vocab_size and divisible by tp.
 *
 * vLLM: ep is 1 (each expert split over all tp x dp ranks of a stage,
 * flattened dp-major) or tp x dp (whole experts, the first E % ep EP ranks
 * holding one more), nothing else (FusedMoEParallelConfig.make); etp is
 * then implied (tp x dp / ep; a given etp must equal it). Shared experts
 * are replicated instead of TP-sharded under sequence-parallel MoE: by
 * default (vLLM's use_sequence_parallel_moe with its default all2all
 * backend) when ep > 1, tp > 1 and dp > 1; sp_moe=0 / sp_moe=1 force it
 * (other all2all backends). Pipeline stages follow get_pp_indices; what a
 * stage builds besides its layers follows each model class: Qwen3-MoE and
 * Mixtral build model.embed_tokens, model.norm and lm_head on every stage
 * (Qwen3MoeModel / MixtralModel.__init__), Llama, Mistral, Qwen2 and Qwen3
 * embed_tokens on the first stage (and the last when tied), norm and
 * lm_head on the last, DeepSeek-V3 embed_tokens on the first and norm and
 * lm_head on the last, never tied (a tied config's lm_head.weight is
 * written from the embedding). Each such replica is a destination.
 *
 * Both: per-expert models have the same parallel semantics; with block
 * scales, each scale tensor is split like its weight, which needs every
 * split of a weight (and every fused part but the last) to fall on whole
 * blocks: RESHARD_ERROR_INVALID_ARGUMENT names the tensor otherwise. */
reshard_result_t rm_megatron_layout(const rm_model *m, const rm_parallel *p,
                                    int first_rank, reshard_layout_t **out);
reshard_result_t rm_vllm_layout(const rm_model *m, const rm_parallel *p,
                                int first_rank, reshard_layout_t **out);

/* SGLang 0.5.23 (sglang/srt; src/models/sglang.c cites every rule). Ranks:
 * one engine of tp x pp ranks numbered tp fastest, then pp
 * (runtime_context.py spawn_world_rank: tp_size * pp_rank + tp_rank), its
 * dp replicas (--dp-size without attention DP) outermost: rank =
 * first_rank + tp_i + tp * (pp_i + pp * dp_i), as vLLM. Inside the TP
 * group (runtime_context.py derive_attention_ranks, derive_spawn_ranks):
 * attention groups tp_i = attn_dp_i * (tp / attn_dp) + attn_tp_i, experts
 * tp_i = ep_i * (tp / ep) + moe_tp_i (moe_dp 1). Names are SGLang's
 * named_parameters(): qkv_proj, gate_up_proj, experts.w13_weight /
 * w2_weight (no routed_experts level), DeepSeek's
 * fused_qkv_a_proj_with_mqa. Attention (Qwen3, Qwen3-MoE, DeepSeek: the
 * attn_tp group) is split over tp / attn_dp and replicated over the
 * attention groups; dense MLPs over the whole tp (DeepSeek's dense layers
 * replicated with moe_dense_tp=1); routed experts whole on ep ranks
 * (E / ep each, contiguous; ep must divide E and tp), each split over
 * tp / ep; the vocabulary padded to 64 (64 x its group's size when that
 * does not divide the padded rows) and split over tp, or over the
 * attention group (embed_tokens under attention DP in the Qwen and
 * DeepSeek families; lm_head with dp_lm_head=1). Stage ends follow each
 * model class (see sglang.c). Refused, naming the setting: attn_dp for
 * Llama, Mistral, Qwen2, Mixtral (their attention runs on the whole TP
 * group) and with dp > 1; dp_lm_head without attn_dp > 1 (SGLang asserts
 * it needs attention DP); moe_dense_tp but for DeepSeek; DeepSeek's
 * default shared-experts fusion (256 routed experts, one shared, ep 1:
 * say shared_fusion=0 and serve with --disable-shared-experts-fusion);
 * tied Llama / Mistral with pp > 1; Qwen3 attention_bias (SGLang adds an
 * o_proj bias no checkpoint has); per-expert models and block scales
 * (not modelled); the other frameworks' keys. */
reshard_result_t rm_sglang_layout(const rm_model *m, const rm_parallel *p,
                                  int first_rank, reshard_layout_t **out);

/* The layout PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) gives a
 * HuggingFace transformers model of this config, without torch: for
 * planning tools and dry runs, and the twin of the Python
 * reshard.Layout.from_module of such a model (tests/python/real/
 * fsdp_world.py shows they give every rank the same boxes). Every tensor
 * is one buffer named as named_parameters() names it (HF's names, the
 * model's tensors), Shard(0) with torch.chunk's pieces over dp_shard
 * ranks (FSDPParam._init_sharded_param: _chunk_with_empty of dim 0); with
 * dp_replicate > 1 (HSDP), (Replicate(), Shard(0)) over a [dp_replicate,
 * dp_shard] mesh, ranks first_rank + replica * dp_shard + shard
 * (init_device_mesh's row-major order). Only dp_shard and dp_replicate
 * are taken; tensor parallelism under FSDP2 follows each framework's own
 * plan, read it from the live model (from_module). MoE models are refused:
 * transformers 5 holds experts fused (modeling_qwen3_moe.py
 * Qwen3MoeExperts: gate_up_proj [E, 2 I, H], down_proj [E, H, I]), not
 * the checkpoint's tensors; so are block scales (the trainer holds its
 * dtype). */
reshard_result_t rm_fsdp_layout(const rm_model *m, const rm_parallel *p,
                                int first_rank, reshard_layout_t **out);

/* The framework's name of buffer_id on `rank`: the buffer's name when the
 * rank holds any part of it (see BUFFERS ARE PARAMETERS), else
 * RESHARD_ERROR_INVALID_ARGUMENT naming the buffer and the rank (*name is
 * NULL on every failure). Works on any layout. */
reshard_result_t rm_parameter_name(const reshard_layout_t *layout,
                                   int buffer_id, int rank,
                                   const char **name);

typedef enum rm_framework {
  RM_FRAMEWORK_MEGATRON = 0,
  RM_FRAMEWORK_VLLM = 1,
  RM_FRAMEWORK_SGLANG = 2
} rm_framework;

/* Whether the framework rewrites or copies the parameter of buffer_id (of
 * a layout built for m by that framework's builder) after loading, so that
 * writing the checkpoint's values into it is wrong or incomplete until
 * the caller re-runs the framework's post-load step: NULL when not, else
 * a static string saying what the framework does, where, and what to
 * re-run. vLLM (0.33): MLA's kv_b_proj (W_UK_T / W_UV), the routed
 * experts' w13 / w2 (fused-MoE backends that reorder, pad or shuffle),
 * every fp8 block-quantized weight and scale (DeepGEMM's UE8M0
 * requantization). SGLang (0.5.23): MLA's kv_b_proj (w_kc / w_vc copies,
 * post_load_weights). Megatron: none. */
const char *rm_after_load(const rm_model *m, rm_framework framework,
                          const reshard_layout_t *layout, int buffer_id);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_MODELS_H */
