/* The SGLang (inference) layout of a model. Sources: SGLang 0.5.23, the
 * wheel's python/sglang/srt (paths below are relative to it):
 *   rank order       runtime_context.py spawn_world_rank: world rank =
 *                    tp_size * pp_rank + tp_rank (one engine); --dp-size
 *                    replicas are separate engines, numbered outermost by
 *                    the RL framework that launches them (as vLLM's):
 *                    rank = first_rank + tp_i + tp * (pp_i + pp * dp_i)
 *   attention DP     runtime_context.py derive_attn_tp_size (attn_tp =
 *                    tp / attn_dp / attn_cp) and derive_attention_ranks
 *                    (tp_rank = attn_dp_rank * attn_tp + attn_tp_rank,
 *                    attn_cp 1); arg_groups/parallel_hook.py refuses
 *                    --dp-size > 1 with --attn-dp-size > 1 and needs
 *                    attn_dp to divide tp
 *   MoE ranks        runtime_context.py derive_spawn_ranks: inside the
 *                    TP group moe_tp fastest, then moe_ep, then moe_dp
 *                    (moe_tp = tp / ep / moe_dp; moe_dp 1 here)
 *   experts          layers/moe/fused_moe_triton/layer.py FusedMoE.__init__
 *                    (E / ep contiguous experts per EP rank, asserted to
 *                    divide; intermediate / moe_tp per rank), _load_w13
 *                    (w1 = gate the first half, w3 = up the second);
 *                    layers/quantization/unquant.py
 *                    UnquantizedFusedMoEMethod.create_weights:
 *                    experts.w13_weight [E_local, 2 I_local, H],
 *                    experts.w2_weight [E_local, H, I_local]
 *   fused linears    layers/linear.py QKVParallelLinear.__init__ (KV heads
 *                    replicated on kv_tp / kv ranks when kv_tp >= kv: the
 *                    vLLM rule), MergedColumnParallelLinear ([gate; up])
 *   vocabulary       layers/vocab_parallel_embedding.py
 *                    VocabParallelEmbedding.__init__: rows padded to 64
 *                    (DEFAULT_VOCAB_PADDING_SIZE), to 64 x tp when tp does
 *                    not divide that, split evenly over its group's tp
 *                    (the attention-TP group with use_attn_tp_group)
 *   stages           distributed/utils.py get_pp_indices (no
 *                    SGLANG_PP_LAYER_PARTITION): layers / pp each, one
 *                    more on each of the LAST layers % pp stages
 *   per model        models/llama.py LlamaModel / LlamaForCausalLM.__init__
 *                    (mistral.py MistralForCausalLM subclasses it),
 *                    qwen2.py Qwen2Model / Qwen2ForCausalLM, qwen3.py
 *                    Qwen3Model (a Qwen2Model) / Qwen3Attention /
 *                    Qwen3ForCausalLM, qwen3_moe.py Qwen3MoeAttention /
 *                    Qwen3MoeForCausalLM (model: qwen2_moe.py
 *                    Qwen2MoeModel), mixtral.py, deepseek_v2.py
 *                    DeepseekV2AttentionMLA / DeepseekV2MoE /
 *                    DeepseekV2DecoderLayer / DeepseekV2Model /
 *                    DeepseekV2ForCausalLM: see sg_arch below.
 * Not modelled (refused by name): moe_dp, attention CP, EPLB redundant
 * experts, the A2A backends (DeepEP, ...: shared experts then replicated),
 * the triton_kernels MoE backend (w13 transposed), fused shared experts,
 * SGLANG_ENABLE_EMBED_REPLICATION, the last stage's embed_tokens under
 * speculative decoding (deepseek_v2.py pp_stage_needs_embedding),
 * per-expert models and block scales. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "models_internal.h"

#define CK(call)                         \
  do {                                   \
    r = (call);                          \
    if (r != RESHARD_SUCCESS) goto fail; \
  } while (0)

/* What each model class does (sources above).
 *   attn_dp   attention built on the attention-TP group (parallel_group
 *             "attn_tp": Qwen3Attention, Qwen3MoeAttention,
 *             DeepseekV2AttentionMLA); the others on the whole TP group,
 *             so attention DP is refused for them
 *   embed_attn embed_tokens with use_attn_tp_group=is_dp_attention_enabled()
 *             (Qwen2Model, Qwen2MoeModel; DeepseekV2Model through
 *             vocab_parallel_embedding.py get_embedding_tp_kwargs)
 *   (lm_head with use_attn_tp_group=enable_dp_lm_head: Llama, Qwen3,
 *   Qwen3-MoE, DeepSeek; Qwen2ForCausalLM and MixtralForCausalLM build it
 *   without, but --enable-dp-lm-head needs attention DP, refused for them)
 *   head_every lm_head built on every stage, unconditionally (Llama when
 *             untied, Qwen3-MoE, Mixtral), loaded there from lm_head.weight
 *   tie_pp1   a tied lm_head is embed_tokens only when pp is 1
 *             (Qwen2/Qwen3/DeepSeek: "pp_group.world_size == 1 and
 *             tie_word_embeddings"; otherwise the last stage's own
 *             ParallelLMHead, loaded from the embedding) */
typedef struct sg_arch {
  int attn_dp, embed_attn, head_every, tie_pp1;
} sg_arch;

static sg_arch arch_of(rm_arch a) {
  switch (a) {
    case RM_ARCH_LLAMA:
    case RM_ARCH_MISTRAL: return (sg_arch){0, 0, 1, 0};
    case RM_ARCH_QWEN2: return (sg_arch){0, 1, 0, 1};
    case RM_ARCH_QWEN3: return (sg_arch){1, 1, 0, 1};
    case RM_ARCH_QWEN3_MOE: return (sg_arch){1, 1, 1, 0};
    case RM_ARCH_MIXTRAL: return (sg_arch){0, 0, 1, 0};
    default: return (sg_arch){1, 1, 0, 1}; /* deepseek_v3 */
  }
}

/* VocabParallelEmbedding.__init__: pad_vocab_size to 64, or to 64 x tp
 * when tp does not divide that. */
static int64_t sg_vocab_rows(int64_t vocab, int tp) {
  int64_t pad = rm_round_up(vocab, 64) % tp ? 64 * (int64_t)tp : 64;
  return rm_round_up(vocab, pad);
}

/* DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason (deepseek_v2.py):
 * on CUDA >= 8.0, without DeepEP-class backends, TBO/SBO or a quantization
 * keeping shared experts apart, a DeepseekV3ForCausalLM with 256 routed
 * experts, one shared expert and moe_ep_size 1 fuses the shared expert into
 * experts.w13_weight / w2_weight as expert 256 (FusedMoE
 * num_fused_shared_experts); 384 experts fuse only for Quark checkpoints. */
static int fuses_shared(const rm_model *m, const rm_parallel *p) {
  const rm_config *c = &m->c;
  if (p->shared_fusion == 0 || c->arch != RM_ARCH_DEEPSEEK_V3 || c->shared_intermediate <= 0) return 0;
  return c->experts == 256 && c->shared_intermediate == c->moe_intermediate && p->ep == 1;
}

static reshard_result_t refuse(const char *what) {
  return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: %s", what);
}

/* The other frameworks' keys and what SGLang or this builder does not do. */
static reshard_result_t check_keys(const rm_model *m, const rm_parallel *p, sg_arch a) {
  const rm_config *c = &m->c;
  if (p->vocab || p->first || p->last || !p->grouped_gemm || p->cp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: key '%s' is Megatron's (SGLang pads the vocabulary itself, splits stages with "
                    "get_pp_indices and has one kind of MoE layer)",
                    p->vocab ? "vocab" : p->first ? "first" : p->last ? "last" : !p->grouped_gemm ? "grouped_gemm" : "cp");
  if (p->sp_moe >= 0 || p->w31)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: key '%s' is vLLM's, not SGLang's",
                    p->sp_moe >= 0 ? "sp_moe" : "w31");
  if (p->dp_shard || p->dp_replicate)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: key '%s' is FSDP2's, not SGLang's (dp)",
                    p->dp_shard ? "dp_shard" : "dp_replicate");
  if (m->per_expert || m->block_scales)
    return rs_error(RESHARD_ERROR_UNSUPPORTED, "sglang layout: %s not modelled for SGLang",
                    m->per_expert ? "per-expert models are" : "block scales (fp8 checkpoints) are");
  const int adp = p->attn_dp ? p->attn_dp : 1;
  if (adp > 1 && !a.attn_dp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: attn_dp=%d for %s: its attention is built on the whole TP group (no "
                    "parallel_group=\"attn_tp\" in SGLang 0.5.23's model class), not modelled",
                    adp, rm_arch_name(c->arch));
  if (adp > 1 && p->dp > 1)
    return refuse("dp > 1 with attn_dp > 1: SGLang refuses --dp-size with --attn-dp-size (parallel_hook.py)");
  if (p->tp % adp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: attn_dp %d does not divide tp %d (parallel_hook.py: tp_size must be divisible by "
                    "attn_dp_size)",
                    adp, p->tp);
  if (p->dp_lm_head && adp == 1)
    return refuse("dp_lm_head=1 without attn_dp > 1: SGLang asserts \"--enable-dp-lm-head requires attention DP "
                  "(--attn-dp-size)\" (arg_groups/overrides.py _dp_lm_head_validation)");
  if (p->moe_dense_tp && c->arch != RM_ARCH_DEEPSEEK_V3)
    return refuse("moe_dense_tp is read by DeepSeek's dense layers only (layer_boundary/layout.py "
                  "is_dense_ffn_fully_dp in deepseek_v2.py DeepseekV2DecoderLayer)");
  if (p->moe_dense_tp && p->moe_dense_tp != 1 && p->moe_dense_tp != p->tp)
    return refuse("moe_dense_tp must be 1 or tp (validation_hook.py: \"moe_dense_tp_size only supports None, 1, or "
                  "tp_size\")");
  if (fuses_shared(m, p))
    return rs_error(RESHARD_ERROR_UNSUPPORTED,
                    "sglang layout: '%s' has 256 routed experts and one shared expert at ep 1, which SGLang fuses "
                    "into experts.w13_weight/w2_weight as an extra expert (deepseek_v2.py "
                    "shared_experts_fusion_disable_reason): not modelled; serve with --disable-shared-experts-fusion "
                    "and say shared_fusion=0",
                    m->path);
  return RESHARD_SUCCESS;
}

/* The shapes SGLang asserts. */
static reshard_result_t check_sglang(const rm_model *m, const rm_parallel *p, sg_arch a) {
  const rm_config *c = &m->c;
  RS_CHECK(check_keys(m, p, a));
  const int tp = p->tp, atp = tp / (p->attn_dp ? p->attn_dp : 1);
  if ((c->arch == RM_ARCH_QWEN3 || c->arch == RM_ARCH_QWEN3_MOE) && c->qkv_bias)
    return rs_error(RESHARD_ERROR_UNSUPPORTED,
                    "sglang layout: attention_bias for %s: SGLang's attention builds o_proj with bias=attention_bias "
                    "(qwen3.py Qwen3Attention), a parameter no checkpoint has: not modelled",
                    rm_arch_name(c->arch));
  if (m->lm_head < 0 && p->pp > 1 && (c->arch == RM_ARCH_LLAMA || c->arch == RM_ARCH_MISTRAL))
    return refuse("tie_word_embeddings with pp > 1 for llama: LlamaForCausalLM ties lm_head to model.embed_tokens, "
                  "a PPMissingLayer past the first stage (llama.py LlamaForCausalLM.__init__)");
  if (c->heads % atp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: attention tp %d does not divide the %lld heads",
                    atp, (long long)c->heads);
  if (!c->mla && (atp >= c->kv_heads ? atp % c->kv_heads : c->kv_heads % atp))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: attention tp %d and num_key_value_heads %lld: one must divide the other "
                    "(QKVParallelLinear)",
                    atp, (long long)c->kv_heads);
  int dense = 0;
  for (int l = 0; l < m->layers; l++) dense |= m->layer[l].gate >= 0;
  if (dense && p->moe_dense_tp != 1 && c->intermediate % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: tp %d does not divide intermediate_size %lld", tp,
                    (long long)c->intermediate);
  if (c->shared_intermediate > 0 && c->shared_intermediate % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: tp %d does not divide the shared experts' intermediate size %lld", tp,
                    (long long)c->shared_intermediate);
  if (c->experts > 0) {
    if (tp % p->ep || c->experts % p->ep)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "sglang layout: ep %d must divide tp %d (the EP group lies inside the TP group: "
                      "derive_spawn_ranks) and the %lld experts (FusedMoE.__init__)",
                      p->ep, tp, (long long)c->experts);
    const int mtp = tp / p->ep;
    if (p->etp && p->etp != mtp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "sglang layout: etp %d: SGLang splits each expert over moe_tp = tp / ep = %d ranks (say etp=%d "
                      "or leave it out)",
                      p->etp, mtp, mtp);
    if (c->moe_intermediate % mtp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "sglang layout: tp / ep = %d does not divide the expert intermediate size %lld", mtp,
                      (long long)c->moe_intermediate);
  }
  return RESHARD_SUCCESS;
}

/* SGLang's get_pp_indices (distributed/utils.py): the remainder's extra
 * layers go to the last stages. */
static void stage_layers(int layers, int pp, int s, int *first, int *count) {
  const int base = layers / pp, rem = layers % pp;
  if (s >= pp - rem) {
    *first = s * (base + 1) - (pp - rem);
    *count = base + 1;
  } else {
    *first = s * base;
    *count = base;
  }
}

/* One stage's meshes (over the same ranks): the whole TP group [dp, tp],
 * the attention groups [dp * attn_dp, attn_tp], the experts [dp, ep,
 * moe_tp]. */
typedef struct sg_stage {
  rm_builder B;
  const rm_parallel *p;
  int full, attn, emesh;
} sg_stage;

static reshard_result_t add_attention(sg_stage *g, int l, const rm_layer *t) {
  const rm_config *c = &g->B.m->c;
  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const int mesh = g->attn;
  char n[256];
#define BUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.self_attn.%s", l, suffix)
  if (!c->mla) {
    RS_CHECK(rm_add_qkv(&g->B, BUF("qkv_proj.weight"), 1, t->q, t->k, t->v, mesh, 1));
    if (t->q_bias >= 0) RS_CHECK(rm_add_qkv(&g->B, BUF("qkv_proj.bias"), 1, t->q_bias, t->k_bias, t->v_bias, mesh, 1));
    if (t->q_norm >= 0) {
      RS_CHECK(rm_weight1(&g->B, BUF("q_norm.weight"), t->q_norm, mesh, rep));
      RS_CHECK(rm_weight1(&g->B, BUF("k_norm.weight"), t->k_norm, mesh, rep));
    }
  } else if (t->q_a >= 0) {
    /* DeepseekV2AttentionMLA: fused_qkv_a_proj_with_mqa = ReplicatedLinear
     * [q_a_proj; kv_a_proj_with_mqa] (its load_weights fuses the two) */
    reshard_part_t qkv_a[2] = {{t->q_a, mesh, rep, NULL}, {t->kv_a, mesh, rep, NULL}};
    RS_CHECK(rm_add_weights(&g->B, BUF("fused_qkv_a_proj_with_mqa.weight"), 0, 1, 2, qkv_a, NULL));
    RS_CHECK(rm_weight1(&g->B, BUF("q_a_layernorm.weight"), t->q_a_norm, mesh, rep));
    RS_CHECK(rm_weight1(&g->B, BUF("q_b_proj.weight"), t->q_b, mesh, col));
  } else {
    RS_CHECK(rm_weight1(&g->B, BUF("q_proj.weight"), t->q, mesh, col));
    RS_CHECK(rm_weight1(&g->B, BUF("kv_a_proj_with_mqa.weight"), t->kv_a, mesh, rep));
  }
  if (c->mla) {
    RS_CHECK(rm_weight1(&g->B, BUF("kv_a_layernorm.weight"), t->kv_a_norm, mesh, rep));
    RS_CHECK(rm_weight1(&g->B, BUF("kv_b_proj.weight"), t->kv_b, mesh, col));
  }
  RS_CHECK(rm_weight1(&g->B, BUF("o_proj.weight"), t->o, mesh, row));
  if (t->o_bias >= 0) RS_CHECK(rm_weight1(&g->B, BUF("o_proj.bias"), t->o_bias, mesh, rep));
#undef BUF
  return RESHARD_SUCCESS;
}

/* The MLP of layer l: dense (over the whole TP group; replicated with
 * moe_dense_tp=1, DeepseekV2DecoderLayer's "replicated" parallel_group),
 * or router, routed experts and shared experts (DeepseekV2MoE:
 * DeepseekV2MLP on the "tp" group without an A2A backend). */
static reshard_result_t add_mlp(sg_stage *g, int l, const rm_layer *t) {
  const rm_model *m = g->B.m;
  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t w13[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(1)};
  const reshard_placement_t w2[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(2)};
  const char *moe = m->c.arch == RM_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
  char n[256];
#define BUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s", l, suffix)
#define MOEBUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s.%s", l, moe, suffix)
  if (t->gate >= 0) {
    const int replicated = g->p->moe_dense_tp == 1;
    RS_CHECK(rm_add_gate_up(&g->B, BUF("mlp.gate_up_proj.weight"), t->gate, t->up, g->full, replicated ? -1 : 1));
    RS_CHECK(rm_weight1(&g->B, BUF("mlp.down_proj.weight"), t->down, g->full, replicated ? rep : row));
    return RESHARD_SUCCESS;
  }
  RS_CHECK(rm_weight1(&g->B, MOEBUF("gate.weight"), t->router, g->full, rep));
  if (t->router_bias >= 0) RS_CHECK(rm_weight1(&g->B, MOEBUF("gate.e_score_correction_bias"), t->router_bias, g->full, rep));
  /* w13 per EP rank: its experts' [gate shard; up shard] (_load_w13) */
  reshard_part_t gu[2] = {{t->egate, g->emesh, w13, NULL}, {t->eup, g->emesh, w13, NULL}};
  RS_CHECK(rm_add_weights(&g->B, MOEBUF("experts.w13_weight"), 1, 1, 2, gu, NULL));
  RS_CHECK(rm_weight1(&g->B, MOEBUF("experts.w2_weight"), t->edown, g->emesh, w2));
  if (t->sgate >= 0) {
    RS_CHECK(rm_add_gate_up(&g->B, BUF("mlp.shared_experts.gate_up_proj.weight"), t->sgate, t->sup, g->full, 1));
    RS_CHECK(rm_weight1(&g->B, BUF("mlp.shared_experts.down_proj.weight"), t->sdown, g->full, row));
  }
#undef BUF
#undef MOEBUF
  return RESHARD_SUCCESS;
}

/* Stage s's embed_tokens, norm and lm_head (sg_arch): *head the tensor its
 * lm_head.weight holds, -1 for none (or tied to its embed_tokens). */
static void stage_ends(const rm_model *m, sg_arch a, int s, int pp, int *embed, int *norm, int *head) {
  const int first = s == 0, last = s == pp - 1, tied = m->lm_head < 0;
  const int src = tied ? m->embed : m->lm_head;
  *embed = first;
  *norm = last;
  if (a.head_every) *head = tied && m->c.arch != RM_ARCH_QWEN3_MOE && m->c.arch != RM_ARCH_MIXTRAL ? -1 : src;
  else *head = last && !(tied && a.tie_pp1 && pp == 1) ? src : -1;
}

static reshard_result_t add_stage(sg_stage *g, sg_arch a, int s, const int *ranks) {
  const rm_model *m = g->B.m;
  const rm_parallel *p = g->p;
  const int tp = p->tp, dp = p->dp, adp = p->attn_dp ? p->attn_dp : 1, atp = tp / adp;
  reshard_layout_t *L = g->B.L;
  RS_CHECK(reshard_layout_add_mesh(L, 2, (const int[]){dp, tp}, ranks, &g->full));
  RS_CHECK(reshard_layout_add_mesh(L, 2, (const int[]){dp * adp, atp}, ranks, &g->attn));
  if (m->c.experts > 0) RS_CHECK(reshard_layout_add_mesh(L, 3, (const int[]){dp, p->ep, tp / p->ep}, ranks, &g->emesh));
  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const int64_t H = m->c.hidden;
  int embed, norm, head;
  stage_ends(m, a, s, p->pp, &embed, &norm, &head);
  if (embed) {
    const int attn = a.embed_attn && adp > 1; /* use_attn_tp_group=is_dp_attention_enabled() */
    RS_CHECK(rm_buf_vocab(L, "model.embed_tokens.weight", m->embed, attn ? g->attn : g->full,
                          sg_vocab_rows(m->c.vocab, attn ? atp : tp), H));
  }
  int l0, nl;
  stage_layers(m->layers, p->pp, s, &l0, &nl);
  char n[256];
  for (int l = l0; l < l0 + nl; l++) {
    const rm_layer *t = &m->layer[l];
    RS_CHECK(rm_weight1(&g->B, rm_fmt(n, sizeof n, "model.layers.%d.input_layernorm.weight", l), t->ln1, g->full, rep));
    RS_CHECK(add_attention(g, l, t));
    RS_CHECK(rm_weight1(&g->B, rm_fmt(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l), t->ln2,
                        g->full, rep));
    RS_CHECK(add_mlp(g, l, t));
  }
  if (norm) RS_CHECK(rm_weight1(&g->B, "model.norm.weight", m->norm, g->full, rep));
  if (head >= 0) {
    const int attn = p->dp_lm_head; /* use_attn_tp_group=enable_dp_lm_head */
    RS_CHECK(rm_buf_vocab(L, "lm_head.weight", head, attn ? g->attn : g->full, sg_vocab_rows(m->c.vocab, attn ? atp : tp),
                          H));
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rm_sglang_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "sglang layout: NULL argument");
  *out = NULL;
  const sg_arch a = arch_of(m->c.arch);
  if (m->c.experts > 0 && p->ep >= 1 && p->tp >= 1 && p->tp % p->ep)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "sglang layout: ep %d must divide tp %d (the EP group lies inside the TP group: derive_spawn_ranks)",
                    p->ep, p->tp);
  /* the shared checks, on the attention's TP width (heads split over
   * attn_tp only) and without ep (checked above and in check_sglang) */
  rm_parallel q = *p;
  q.tp = p->attn_dp > 1 && p->tp % p->attn_dp == 0 ? p->tp / p->attn_dp : p->tp;
  if (m->c.experts > 0) q.ep = 1;
  RS_CHECK(rm_check_common(m, &q, 1, first_rank, "sglang"));
  RS_CHECK(check_sglang(m, p, a));
  const int tp = p->tp, dp = p->dp, pp = p->pp, flat = tp * dp;
  int *ranks = malloc((size_t)flat * sizeof *ranks);
  if (!ranks) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "sglang layout: out of memory");
  reshard_layout_t *L = NULL;
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  CK(rm_declare_tensors(L, m));
  for (int s = 0; s < pp; s++) {
    /* the stage's ranks in (dp, tp) order: spawn_world_rank, replicas outermost */
    for (int f = 0; f < flat; f++) ranks[f] = first_rank + f % tp + tp * (s + pp * (f / tp));
    sg_stage g = {{L, m}, p, -1, -1, -1};
    CK(add_stage(&g, a, s, ranks));
  }
  free(ranks);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  free(ranks);
  reshard_layout_destroy(L);
  return r;
}
