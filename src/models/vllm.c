/* The vLLM (inference) layout of a model. Sources (vLLM 0.33.0, 4ba787ec9;
 * names of the routed experts from 0.24 on):
 *   rank order       vllm/distributed/parallel_state.py
 *                    initialize_model_parallel: ranks reshaped (DP, PP, PCP,
 *                    TP), TP fastest: rank = tp_i + tp * (pp_i + pp * dp_i)
 *                    (PCP 1); the EP group of a stage orders its ranks
 *                    dp-major, ep_rank = dp_i * tp + tp_i
 *   MoE sharding     vllm/model_executor/layers/fused_moe/config.py
 *                    FusedMoEParallelConfig.make: EP off: ep 1, each expert
 *                    split over the tp x dp ranks (flattened tp rank
 *                    dp_i * tp + tp_i); EP on: ep = tp x dp, experts whole.
 *                    Nothing else exists.
 *   expert placement fused_moe/expert_map_manager.py determine_expert_map,
 *                    "linear" (the default): EP rank r holds experts
 *                    [r * (E/ep) + min(r, E % ep), ...), the first E % ep
 *                    ranks one more
 *   w13 / w2         fused_moe/unquantized_fused_moe_method.py
 *                    create_weights, routed_experts.py _load_w13:
 *                    w13 [E_local, 2 I_local, H] = [gate (w1); up (w3)]
 *                    ([up; gate] with spec key w31=1: FlashInfer
 *                    CUTLASS's live format, oracle/unquantized.py
 *                    convert_to_unquantized_kernel_format ->
 *                    quantization/utils/flashinfer_utils.py
 *                    swap_w13_to_w31),
 *                    w2 [E_local, H, I_local]
 *   fused linears    vllm/model_executor/layers/linear.py QKVParallelLinear
 *                    ([q; k; v] shards, KV heads replicated on tp / kv
 *                    consecutive ranks when tp > kv), MergedColumnParallel
 *                    Linear ([gate; up] shards)
 *   vocabulary       vocab_parallel_embedding.py: rows padded to a
 *                    multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE), split
 *                    evenly over tp
 *   stages           vllm/distributed/utils.py get_pp_indices (see
 *                    rm_vllm_stage_layers); models/utils.py make_layers:
 *                    parameter names keep the global layer index
 *   stage ends       which stages build embed_tokens, the final norm and
 *                    lm_head, per architecture (see stage_ends):
 *                    models/llama.py LlamaModel.__init__ and
 *                    LlamaForCausalLM.__init__ (mistral.py
 *                    MistralForCausalLM subclasses LlamaForCausalLM),
 *                    qwen2.py Qwen2Model.__init__ and
 *                    Qwen2ForCausalLM.__init__, qwen3.py Qwen3Model
 *                    (a Qwen2Model) and Qwen3ForCausalLM.__init__:
 *                    embed_tokens where get_pp_group().is_first_rank or
 *                    (tie_word_embeddings and is_last_rank), norm and
 *                    lm_head where is_last_rank, PPMissingLayer elsewhere;
 *                    a tied lm_head is embed_tokens' parameter
 *                    (ParallelLMHead.tie_weights), which named_parameters
 *                    lists once, as model.embed_tokens.weight;
 *                    models/qwen3_moe.py Qwen3MoeModel.__init__ and
 *                    Qwen3MoeForCausalLM.__init__, mixtral.py
 *                    MixtralModel.__init__ and MixtralForCausalLM.__init__:
 *                    all three on EVERY stage, unconditionally, and
 *                    load_weights (AutoWeightsLoader) loads them there;
 *                    models/deepseek_v2.py DeepseekV2Model.__init__ and
 *                    DeepseekV2ForCausalLM.__init__ (DeepseekV3ForCausalLM
 *                    subclasses it): embed_tokens where is_first_rank only,
 *                    norm and lm_head where is_last_rank, and no tying: a
 *                    tied config still gets its own lm_head parameter,
 *                    which reshard fills from the embedding
 *   DeepSeek MLA/MoE models/deepseek_v2.py DeepseekV2MLAAttention
 *                    (fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa]
 *                    replicated), DeepseekV2MoE (gate replicated,
 *                    e_score_correction_bias fp32 when topk_method is
 *                    noaux_tc, shared experts DeepseekV2MLP with
 *                    disable_tp under sequence-parallel MoE:
 *                    vllm/config/parallel.py use_sequence_parallel_moe =
 *                    EP on, tp > 1, dp > 1 and an all2all backend among
 *                    them the default allgather_reducescatter)
 *
 * Per pipeline stage, the mesh [dp, tp] carries:
 *   qkv_proj = [q shard; k shard; v shard], the KV heads replicated on
 *     tp / kv consecutive TP ranks when tp > kv
 *     (reshard_layout_add_vllm_qkv, src/layout/builders.c);
 *   gate_up_proj = [gate shard; up shard] (reshard_layout_add_gate_up);
 *   o_proj, down_proj row-parallel (Shard(1));
 *   embed_tokens / lm_head, padded to a multiple of 64, and the final
 *     norm, on the stages stage_ends names;
 *   MLA: fused_qkv_a_proj replicated (when q_lora_rank is set), q_b_proj /
 *     kv_b_proj column-parallel, o_proj row-parallel, the layernorms
 *     replicated; shared experts column/row-parallel, or replicated under
 *     sequence-parallel MoE (spec key sp_moe, default vLLM's rule).
 * Routed experts over the stage's tp*dp ranks in EP order as [ep,
 * tp*dp/ep]: w13 [E, 2I, H] with (Shard(0), Shard(1)) (the first E % ep
 * EP ranks one expert more), w2 with (Shard(0), Shard(2)).
 * Per-expert models: the same w13_weight / w2_weight buffers (FusedMoE
 * loads each checkpoint expert into its slot of them), described as the
 * concatenation along dim 0 of every expert's parts, each on the mesh
 * [tp*dp/ep] of its EP rank: [gate_e shard; up_e shard] per local expert
 * for w13 (Shard(0)), down_e shards for w2 (Shard(1)); byte for byte the
 * stacked mode's buffers.
 * Block scales: every weight buffer is followed by its "<name>_scale_inv"
 * buffer (vLLM's weight_scale_inv, w13_weight_scale_inv, ...), the
 * weights' scales arranged the same way. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "models_internal.h"

#define CK(call)                         \
  do {                                   \
    r = (call);                          \
    if (r != RESHARD_SUCCESS) goto fail; \
  } while (0)

/* use_sequence_parallel_moe (vllm/config/parallel.py) with the default
 * all2all backend, unless the spec says otherwise */
static int sp_moe_of(const rm_parallel *p) { return p->sp_moe >= 0 ? p->sp_moe : p->ep > 1 && p->tp > 1 && p->dp > 1; }

static reshard_result_t check_vllm(const rm_model *m, const rm_parallel *p, int sp_moe) {
  const rm_config *c = &m->c;
  const int tp = p->tp;
  if (rm_sglang_key(p))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: key '%s' is SGLang's, not vLLM's (vLLM's data parallelism is dp, its experts ep)",
                    rm_sglang_key(p));
  if (p->vocab || p->first || p->last || !p->grouped_gemm)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: key '%s' is Megatron's (vLLM pads the vocabulary to 64, splits stages with "
                    "get_pp_indices and has one kind of MoE layer)",
                    p->vocab ? "vocab" : p->first ? "first" : p->last ? "last" : "grouped_gemm");
  /* vLLM's context parallelism (decode_context_parallel_size) runs on the
   * TP ranks and adds none: no key of its own changes where weights are */
  if (p->cp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: key 'cp' is Megatron's (context_parallel_size); vLLM's decode context "
                    "parallelism shares the TP ranks and does not change the weights' layout: leave it out");
  if (p->dp_shard || p->dp_replicate)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: key '%s' is FSDP2's, not vLLM's (dp)",
                    p->dp_shard ? "dp_shard" : "dp_replicate");
  if (p->w31 && c->experts == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: w31=1 given for the dense model '%s' (it orders routed experts' w13)", m->path);
  if (!c->mla && (tp > c->kv_heads ? tp % c->kv_heads : c->kv_heads % tp))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: tp %d and num_key_value_heads %lld: one must divide the other (QKVParallelLinear)",
                    tp, (long long)c->kv_heads);
  int64_t vpad = rm_round_up(c->vocab, 64);
  if (vpad % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d does not divide the padded vocabulary %lld",
                    tp, (long long)vpad);
  int dense = 0;
  for (int l = 0; l < m->layers; l++) dense |= m->layer[l].gate >= 0;
  if (dense && c->intermediate % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d does not divide intermediate_size %lld", tp,
                    (long long)c->intermediate);
  if (c->shared_intermediate % tp && !sp_moe) /* replicated under sequence-parallel MoE */
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d does not divide the shared experts' intermediate size %lld",
                    tp, (long long)c->shared_intermediate);
  if (c->experts > 0) {
    const int flat = tp * p->dp;
    if (p->sp_moe == 1 && p->ep == 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "vllm layout: sp_moe=1 needs expert parallelism (ep=%d): vLLM's use_sequence_parallel_moe "
                      "requires enable_expert_parallel",
                      flat);
    int etp = flat / p->ep;
    if (p->etp && p->etp != etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "vllm layout: etp %d: vLLM splits each expert over the tp x dp / ep = %d ranks that share an "
                      "EP rank (say etp=%d or leave it out)",
                      p->etp, etp, etp);
    if (c->moe_intermediate % etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "vllm layout: tp x dp / ep = %d does not divide the expert intermediate size %lld", etp,
                      (long long)c->moe_intermediate);
  }
  return RESHARD_SUCCESS;
}

/* What stage s of pp builds besides its layers (the "stage ends" sources
 * above): *embed whether it has model.embed_tokens.weight, *norm whether it
 * has model.norm.weight, *head the tensor its lm_head.weight holds (-1:
 * none, or tied to its embed_tokens). Every stage that builds one of them
 * holds a whole replica, loaded like the first / last stage's. */
static void stage_ends(const rm_model *m, int s, int pp, int *embed, int *norm, int *head) {
  const rm_arch a = m->c.arch;
  const int every = a == RM_ARCH_QWEN3_MOE || a == RM_ARCH_MIXTRAL; /* no is_first/last_rank tests */
  const int first = every || s == 0, last = every || s == pp - 1, tied = m->lm_head < 0;
  if (a == RM_ARCH_DEEPSEEK_V3) { /* never ties */
    *embed = first;
    *norm = last;
    *head = last ? (tied ? m->embed : m->lm_head) : -1;
    return;
  }
  *embed = first || (last && tied);
  *norm = last;
  *head = last && !tied ? m->lm_head : -1;
}

/* The first expert of EP rank r under vLLM's linear placement. */
static int expert_start(int E, int ep, int r) { return r * (E / ep) + (r < E % ep ? r : E % ep); }

reshard_result_t rm_vllm_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: NULL argument");
  *out = NULL;
  const rm_config *c = &m->c;
  const int64_t flat64 = (int64_t)p->tp * p->dp;
  if (c->experts > 0 && p->ep != 1 && p->ep != flat64 && p->tp >= 1 && p->dp >= 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "vllm layout: ep %d: vLLM has expert parallelism off (ep=1) or over all tp x dp = %lld ranks of a "
                    "stage (ep=%lld), nothing between (FusedMoEParallelConfig.make)",
                    p->ep, (long long)flat64, (long long)flat64);
  /* etp is implied (ep x etp = tp x dp): nothing to check against it */
  RS_CHECK(rm_check_common(m, p, 1, first_rank, "vllm"));
  const int tp = p->tp, dp = p->dp, pp = p->pp, ep = p->ep, flat = tp * dp;
  const int sp_moe = sp_moe_of(p);
  RS_CHECK(check_vllm(m, p, sp_moe));
  const int64_t H = c->hidden, vpad = rm_round_up(c->vocab, 64);
  const int E = (int)c->experts;
  reshard_layout_t *L = NULL;
  rm_builder B = {NULL, m};
  int *ranks = malloc((size_t)flat * sizeof *ranks), *emeshes = NULL;
  int64_t *esplit = NULL;
  reshard_part_t *xparts = NULL;
  reshard_result_t r;
  if (!ranks) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "vllm layout: out of memory");
  CK(reshard_layout_create(&L));
  B.L = L;
  CK(rm_declare_tensors(L, m));
  const int per_expert = m->per_expert && E > 0;
  if (E > 0) {
    emeshes = malloc((size_t)ep * sizeof *emeshes);
    esplit = malloc((size_t)ep * sizeof *esplit);
    xparts = per_expert ? malloc((size_t)E * 2 * sizeof *xparts) : NULL;
    if (!emeshes || !esplit || (per_expert && !xparts))
      CK(rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "vllm layout: out of memory"));
    for (int er = 0; er < ep; er++) esplit[er] = expert_start(E, ep, er + 1) - expert_start(E, ep, er);
  }

  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  /* uneven experts (E % ep) only happen with ep = tp x dp */
  const int64_t *sizes = E > 0 && E % ep ? esplit : NULL;
  const reshard_placement_t w13[2] = {reshard_shard_sizes(0, sizes), reshard_shard(1)};
  const reshard_placement_t w2[2] = {reshard_shard_sizes(0, sizes), reshard_shard(2)};
  const reshard_placement_t xw13[1] = {reshard_shard(0)}, xw2[1] = {reshard_shard(1)};
  const reshard_placement_t *shared_row = sp_moe ? rep : row;
  char n[256];
  for (int s = 0; s < pp; s++) {
    /* The stage's ranks in (dp, tp) order, which is also the EP order. */
    for (int f = 0; f < flat; f++) ranks[f] = first_rank + f % tp + tp * (s + pp * (f / tp));
    int mesh, emesh = -1;
    CK(reshard_layout_add_mesh(L, 2, (const int[]){dp, tp}, ranks, &mesh));
    if (E > 0 && !per_expert) CK(reshard_layout_add_mesh(L, 2, (const int[]){ep, flat / ep}, ranks, &emesh));
    for (int er = 0; per_expert && er < ep; er++)
      CK(reshard_layout_add_mesh(L, 1, (const int[]){flat / ep}, ranks + er * (flat / ep), &emeshes[er]));
    int embed, norm, head;
    stage_ends(m, s, pp, &embed, &norm, &head);
    if (embed) CK(rm_buf_vocab(L, "model.embed_tokens.weight", m->embed, mesh, vpad, H));
    const char *moe = c->arch == RM_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
    int l0, nl;
    rm_vllm_stage_layers(m->layers, pp, s, &l0, &nl);
    for (int l = l0; l < l0 + nl; l++) {
      const rm_layer *t = &m->layer[l];
#define BUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s", l, suffix)
#define MOEBUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s.%s", l, moe, suffix)
      CK(rm_weight1(&B, BUF("input_layernorm.weight"), t->ln1, mesh, rep));
      if (!c->mla) {
        CK(rm_add_qkv(&B, BUF("self_attn.qkv_proj.weight"), 1, t->q, t->k, t->v, mesh, 1));
        if (t->q_bias >= 0)
          CK(rm_add_qkv(&B, BUF("self_attn.qkv_proj.bias"), 1, t->q_bias, t->k_bias, t->v_bias, mesh, 1));
        if (t->q_norm >= 0) {
          CK(rm_weight1(&B, BUF("self_attn.q_norm.weight"), t->q_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attn.k_norm.weight"), t->k_norm, mesh, rep));
        }
      } else {
        if (t->q_a >= 0) {
          reshard_part_t qkv_a[2] = {{t->q_a, mesh, rep, NULL}, {t->kv_a, mesh, rep, NULL}};
          CK(rm_add_weights(&B, BUF("self_attn.fused_qkv_a_proj.weight"), 0, 1, 2, qkv_a, NULL));
          CK(rm_weight1(&B, BUF("self_attn.q_a_layernorm.weight"), t->q_a_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attn.q_b_proj.weight"), t->q_b, mesh, col));
        } else {
          CK(rm_weight1(&B, BUF("self_attn.q_proj.weight"), t->q, mesh, col));
          CK(rm_weight1(&B, BUF("self_attn.kv_a_proj_with_mqa.weight"), t->kv_a, mesh, rep));
        }
        CK(rm_weight1(&B, BUF("self_attn.kv_a_layernorm.weight"), t->kv_a_norm, mesh, rep));
        CK(rm_weight1(&B, BUF("self_attn.kv_b_proj.weight"), t->kv_b, mesh, col));
      }
      CK(rm_weight1(&B, BUF("self_attn.o_proj.weight"), t->o, mesh, row));
      if (t->o_bias >= 0) CK(rm_weight1(&B, BUF("self_attn.o_proj.bias"), t->o_bias, mesh, rep));
      CK(rm_weight1(&B, BUF("post_attention_layernorm.weight"), t->ln2, mesh, rep));
      if (t->gate >= 0) {
        CK(rm_add_gate_up(&B, BUF("mlp.gate_up_proj.weight"), t->gate, t->up, mesh, 1));
        CK(rm_weight1(&B, BUF("mlp.down_proj.weight"), t->down, mesh, row));
      } else {
        CK(rm_weight1(&B, MOEBUF("gate.weight"), t->router, mesh, rep));
        if (t->router_bias >= 0) CK(rm_weight1(&B, MOEBUF("gate.e_score_correction_bias"), t->router_bias, mesh, rep));
        if (per_expert) {
          for (int er = 0; er < ep; er++)
            for (int e = expert_start(E, ep, er); e < expert_start(E, ep, er + 1); e++) {
              /* [gate; up] per expert, or [up; gate] under w31 */
              xparts[2 * e] = (reshard_part_t){rm_expert(m, l, e, p->w31), emeshes[er], xw13, NULL};
              xparts[2 * e + 1] = (reshard_part_t){rm_expert(m, l, e, !p->w31), emeshes[er], xw13, NULL};
            }
          CK(rm_add_weights(&B, MOEBUF("experts.routed_experts.w13_weight"), 0, 1, 2 * E, xparts, NULL));
          for (int er = 0; er < ep; er++)
            for (int e = expert_start(E, ep, er); e < expert_start(E, ep, er + 1); e++)
              xparts[e] = (reshard_part_t){rm_expert(m, l, e, 2), emeshes[er], xw2, NULL};
          CK(rm_add_weights(&B, MOEBUF("experts.routed_experts.w2_weight"), 0, 1, E, xparts, NULL));
        } else {
          reshard_part_t gu[2] = {{t->egate, emesh, w13, NULL}, {t->eup, emesh, w13, NULL}};
          if (p->w31) { /* FlashInfer CUTLASS's [up (w3); gate (w1)] (rm_parallel.w31) */
            const reshard_part_t g = gu[0];
            gu[0] = gu[1];
            gu[1] = g;
          }
          CK(rm_add_weights(&B, MOEBUF("experts.routed_experts.w13_weight"), 1, 1, 2, gu, NULL));
          CK(rm_weight1(&B, MOEBUF("experts.routed_experts.w2_weight"), t->edown, emesh, w2));
        }
        if (t->sgate >= 0) {
          CK(rm_add_gate_up(&B, BUF("mlp.shared_experts.gate_up_proj.weight"), t->sgate, t->sup, mesh,
                            sp_moe ? -1 : 1));
          CK(rm_weight1(&B, BUF("mlp.shared_experts.down_proj.weight"), t->sdown, mesh, shared_row));
        }
      }
#undef BUF
#undef MOEBUF
    }
    if (norm) CK(rm_weight1(&B, "model.norm.weight", m->norm, mesh, rep));
    if (head >= 0) CK(rm_buf_vocab(L, "lm_head.weight", head, mesh, vpad, H));
  }
  free(ranks);
  free(emeshes);
  free(esplit);
  free(xparts);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  free(ranks);
  free(emeshes);
  free(esplit);
  free(xparts);
  reshard_layout_destroy(L);
  return r;
}
