/* The Megatron-core (training) layout of a model, with the Transformer
 * Engine spec's modules and parameter names. Sources (Megatron-LM
 * megatron/core, NVIDIA/Megatron-LM d98e8a64, 2026-08-22):
 *   rank order       parallel_state.py initialize_model_parallel, order
 *                    "tp-cp-ep-dp-pp" (RankGenerator; the decoder's with
 *                    ep = 1): rank = tp_i + tp * (cp_i + cp * (dp_i + dp *
 *                    pp_i)); experts: the expert RankGenerator, with
 *                    tp = etp, cp = 1 and dp = expert_data_parallel_size
 *                    = world / (etp * ep * pp), so inside a stage rank =
 *                    etp_i + etp * (ep_i + ep * edp_i), edp = tp * cp *
 *                    dp / (ep * etp)
 *   etp default      model_parallel_config.py ModelParallelConfig
 *                    .__post_init__: expert_tensor_parallel_size = tp
 *   stage layers     transformer/transformer_block.py get_num_layers_to_build
 *                    (see rm_megatron_stages); parameter names number the
 *                    layers of a stage from 0 (TransformerBlock builds its
 *                    ModuleList with local indices)
 *   names            models/gpt/gpt_layer_specs.py
 *                    get_gpt_layer_with_transformer_engine_submodules:
 *                    GQA layers fuse input_layernorm into linear_qkv
 *                    (layer_norm_weight); dense MLPs fuse pre_mlp_layernorm
 *                    into linear_fc1 (layer_norm_weight); MoE layers keep
 *                    pre_mlp_layernorm; MLA layers keep input_layernorm and
 *                    fuse q_a/kv_a layernorms into linear_q_up_proj /
 *                    linear_kv_up_proj; moe_module_specs.py: TEGroupedMLP
 *                    (mlp.experts.linear_fc1.weight<i>, one parameter per
 *                    local expert i) when moe_grouped_gemm, SequentialMLP
 *                    (mlp.experts.local_experts.<i>.linear_fc1.weight)
 *                    otherwise
 *   fused QKV        transformer/attention.py get_query_key_value_tensors:
 *                    rows per query group [q (heads/groups * hd); k; v]
 *   fc1              transformer/mlp.py: gated fc1 = [gate shard; up shard]
 *                    per TP rank (per expert and ETP rank for experts)
 *   vocabulary       tensor_parallel/layers.py VocabParallelEmbedding,
 *                    tensor_parallel/utils.py vocab_range_from_global_vocab_size:
 *                    the rows split evenly over TP (divisibility asserted)
 *   router           transformer/moe/router.py TopKRouter: weight [E, H]
 *                    replicated in params_dtype; expert_bias [E] fp32, a
 *                    persistent buffer (state_dict, not named_parameters)
 *   MLA              transformer/multi_latent_attention.py: q/kv down
 *                    projections duplicated (replicated), up projections
 *                    column-parallel, linear_proj row-parallel
 *
 * Per pipeline stage s (ranks first + s*S .. + S - 1, S = tp*cp*dp), the
 * mesh [dp*cp, tp] (tp fastest) carries everything but the routed experts
 * (context-parallel ranks hold the same weights as their DP replicas:
 * both index the mesh's replicated axis):
 *   column-parallel (Replicate, Shard(0)): fused QKV (interleaved per KV
 *     group), fused gate/up (linear_fc1), MLA q_up / kv_up, shared experts'
 *     fc1, the vocabulary (spec key vocab=<rows>, default vocab_size);
 *   row-parallel (Replicate, Shard(1)): linear_proj, linear_fc2;
 *   replicated: norms, biases of row-parallel layers, the router, MLA's
 *     q_down / kv_down projections and the fused layernorms.
 * Routed experts: on EP rank r, local expert i is global expert
 * r * E/ep + i; its fc1 = [gate slice; up slice] and fc2 are split over
 * ETP and replicated over expert-DP, each local expert its own buffer
 * (one parameter per local expert in both TEGroupedMLP and SequentialMLP):
 * for every EP rank a part on that rank's [expert-DP, ETP] mesh, a window
 * of the stacked tensors (or the expert's own tensors in per-expert mode).
 * Block scales: every weight buffer is followed by its "<name>_scale_inv"
 * buffer of the weights' scales, arranged the same way (Transformer
 * Engine keeps fp8 scales inside its tensors, so these names are not
 * Megatron's). */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "models_internal.h"

#define CK(call)                         \
  do {                                   \
    r = (call);                          \
    if (r != RESHARD_SUCCESS) goto fail; \
  } while (0)

static reshard_result_t check_megatron(const rm_model *m, const rm_parallel *p, int etp, int64_t vocab) {
  const rm_config *c = &m->c;
  if (rm_sglang_key(p))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: key '%s' is SGLang's, not Megatron's",
                    rm_sglang_key(p));
  if (p->sp_moe >= 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: key 'sp_moe' is vLLM's, not Megatron's");
  if (p->w31)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: key 'w31' is vLLM's, not Megatron's");
  if (p->dp_shard || p->dp_replicate)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: key '%s' is FSDP2's, not Megatron's (dp)",
                    p->dp_shard ? "dp_shard" : "dp_replicate");
  if (!c->mla && c->kv_heads % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "megatron layout: tp %d does not divide the %lld query groups (num_key_value_heads): not modelled "
                    "(Megatron-core then splits linear_qkv evenly across groups and gathers them back)",
                    p->tp, (long long)c->kv_heads);
  if (vocab < c->vocab || vocab % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "megatron layout: vocab %lld: the embedding rows must be at least vocab_size %lld and divisible "
                    "by tp %d (VocabParallelEmbedding splits them evenly)%s",
                    (long long)vocab, (long long)c->vocab, p->tp,
                    p->vocab ? "" : "; say vocab=<rows> with the padded row count the trainer built");
  int dense = 0;
  for (int l = 0; l < m->layers; l++) dense |= m->layer[l].gate >= 0;
  if (dense && c->intermediate % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d does not divide intermediate_size %lld",
                    p->tp, (long long)c->intermediate);
  if (c->experts % p->ep) /* moe_layer.py: num_moe_experts % ep_size == 0 */
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: ep %d does not divide the %lld experts", p->ep,
                    (long long)c->experts);
  if (c->experts > 0 && c->moe_intermediate % etp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: etp %d does not divide the expert intermediate size %lld",
                    etp, (long long)c->moe_intermediate);
  if (c->shared_intermediate % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d does not divide the shared experts' intermediate size %lld",
                    p->tp, (long long)c->shared_intermediate);
  return RESHARD_SUCCESS;
}

/* One buffer per local expert i and projection: on EP rank er it holds
 * expert er * elocal + i, split over ETP on er's [expert-DP, ETP] mesh.
 * `local` is the layer's number inside its stage. */
static reshard_result_t expert_buffers(rm_builder *B, int l, int local, int elocal, int grouped, const int *emeshes) {
  const rm_model *m = B->m;
  const rm_layer *t = &m->layer[l];
  const int ep = (int)(m->c.experts / elocal), stacked = !m->per_expert;
  const int64_t H = m->c.hidden, I = m->c.moe_intermediate;
  /* stacked [E, I, H] / [E, H, I] windows, or per-expert [I, H] / [H, I] */
  const reshard_placement_t fc1s[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t fc2s[2] = {reshard_replicate(), reshard_shard(2)};
  const reshard_placement_t fc1x[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t fc2x[2] = {reshard_replicate(), reshard_shard(1)};
  const int64_t w1[3] = {1, I, H}, w2[3] = {1, H, I};
  reshard_part_t *parts = malloc((size_t)ep * 2 * sizeof *parts);
  int64_t(*org)[3] = malloc((size_t)ep * sizeof *org);
  const int64_t **origins = malloc((size_t)ep * 2 * sizeof *origins);
  reshard_result_t r = RESHARD_SUCCESS;
  if (!parts || !org || !origins) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "megatron layout: out of memory");
    goto done;
  }
  char n[256];
  for (int i = 0; i < elocal && r == RESHARD_SUCCESS; i++) {
    for (int er = 0; er < ep; er++) {
      int e = er * elocal + i;
      org[er][0] = e;
      org[er][1] = org[er][2] = 0;
      origins[2 * er] = origins[2 * er + 1] = org[er];
      if (stacked) {
        parts[2 * er] = (reshard_part_t){t->egate, emeshes[er], fc1s, w1};
        parts[2 * er + 1] = (reshard_part_t){t->eup, emeshes[er], fc1s, w1};
      } else {
        parts[2 * er] = (reshard_part_t){rm_expert(m, l, e, 0), emeshes[er], fc1x, NULL};
        parts[2 * er + 1] = (reshard_part_t){rm_expert(m, l, e, 1), emeshes[er], fc1x, NULL};
      }
    }
    if (grouped) rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.linear_fc1.weight%d", local, i);
    else rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc1.weight", local, i);
    r = rm_add_weights(B, n, stacked ? 1 : 0, 1, 2 * ep, parts, stacked ? origins : NULL);
    if (r != RESHARD_SUCCESS) break;
    for (int er = 0; er < ep; er++) {
      origins[er] = org[er];
      parts[er] = stacked ? (reshard_part_t){t->edown, emeshes[er], fc2s, w2}
                          : (reshard_part_t){rm_expert(m, l, er * elocal + i, 2), emeshes[er], fc2x, NULL};
    }
    if (grouped) rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.linear_fc2.weight%d", local, i);
    else rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc2.weight", local, i);
    r = rm_add_weights(B, n, 0, 1, ep, parts, stacked ? origins : NULL);
  }
done:
  free(parts);
  free(org);
  free(origins);
  return r;
}

reshard_result_t rm_megatron_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: NULL argument");
  *out = NULL;
  const rm_config *c = &m->c;
  /* dp: every replica of a stage's dense weights, data- and
   * context-parallel (the stage is tp * cp * dp ranks) */
  const int tp = p->tp, dp = (int)((int64_t)p->dp * (p->cp ? p->cp : 1)), pp = p->pp, ep = p->ep, etp = p->etp ? p->etp : p->tp;
  const int64_t H = c->hidden, vocab = p->vocab ? p->vocab : c->vocab;
  RS_CHECK(rm_check_common(m, p, etp, first_rank, "megatron"));
  RS_CHECK(check_megatron(m, p, etp, vocab));
  int *stage_start = malloc(((size_t)pp + 1) * sizeof *stage_start);
  if (!stage_start) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "megatron layout: out of memory");
  reshard_layout_t *L = NULL;
  rm_builder B = {NULL, m};
  int *eranks = NULL, *emeshes = NULL;
  reshard_result_t r;
  CK(rm_megatron_stages(m, p, stage_start));
  CK(reshard_layout_create(&L));
  B.L = L;
  CK(rm_declare_tensors(L, m));
  const int edp = tp * dp / (ep * etp), elocal = c->experts ? (int)(c->experts / ep) : 0;
  if (c->experts > 0) {
    eranks = malloc((size_t)edp * (size_t)etp * sizeof *eranks);
    emeshes = malloc((size_t)ep * sizeof *emeshes);
    if (!eranks || !emeshes) CK(rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "megatron layout: out of memory"));
  }

  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  char n[256];
  for (int s = 0; s < pp; s++) {
    const int start = first_rank + s * tp * dp;
    int mesh;
    CK(reshard_layout_add_mesh_strided(L, 2, (const int[]){dp, tp}, start, 1, &mesh));
    for (int er = 0; c->experts > 0 && er < ep; er++) {
      for (int i = 0; i < edp; i++)
        for (int j = 0; j < etp; j++) eranks[i * etp + j] = start + i * ep * etp + er * etp + j;
      CK(reshard_layout_add_mesh(L, 2, (const int[]){edp, etp}, eranks, &emeshes[er]));
    }
    if (s == 0) CK(rm_buf_vocab(L, "embedding.word_embeddings.weight", m->embed, mesh, vocab, H));
    for (int l = stage_start[s]; l < stage_start[s + 1]; l++) {
      const rm_layer *t = &m->layer[l];
      const int local = l - stage_start[s];
#define BUF(suffix) rm_fmt(n, sizeof n, "decoder.layers.%d.%s", local, suffix)
      if (!c->mla) {
        CK(rm_weight1(&B, BUF("self_attention.linear_qkv.layer_norm_weight"), t->ln1, mesh, rep));
        CK(rm_add_qkv(&B, BUF("self_attention.linear_qkv.weight"), 0, t->q, t->k, t->v, mesh, 1));
        if (t->q_bias >= 0)
          CK(rm_add_qkv(&B, BUF("self_attention.linear_qkv.bias"), 0, t->q_bias, t->k_bias, t->v_bias, mesh, 1));
        if (t->q_norm >= 0) {
          CK(rm_weight1(&B, BUF("self_attention.q_layernorm.weight"), t->q_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attention.k_layernorm.weight"), t->k_norm, mesh, rep));
        }
      } else {
        CK(rm_weight1(&B, BUF("input_layernorm.weight"), t->ln1, mesh, rep));
        if (t->q_a >= 0) {
          CK(rm_weight1(&B, BUF("self_attention.linear_q_down_proj.weight"), t->q_a, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attention.linear_q_up_proj.layer_norm_weight"), t->q_a_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attention.linear_q_up_proj.weight"), t->q_b, mesh, col));
        } else {
          CK(rm_weight1(&B, BUF("self_attention.linear_q_proj.weight"), t->q, mesh, col));
        }
        CK(rm_weight1(&B, BUF("self_attention.linear_kv_down_proj.weight"), t->kv_a, mesh, rep));
        CK(rm_weight1(&B, BUF("self_attention.linear_kv_up_proj.layer_norm_weight"), t->kv_a_norm, mesh, rep));
        CK(rm_weight1(&B, BUF("self_attention.linear_kv_up_proj.weight"), t->kv_b, mesh, col));
      }
      CK(rm_weight1(&B, BUF("self_attention.linear_proj.weight"), t->o, mesh, row));
      if (t->o_bias >= 0) CK(rm_weight1(&B, BUF("self_attention.linear_proj.bias"), t->o_bias, mesh, rep));
      if (t->gate >= 0) {
        CK(rm_weight1(&B, BUF("mlp.linear_fc1.layer_norm_weight"), t->ln2, mesh, rep));
        CK(rm_add_gate_up(&B, BUF("mlp.linear_fc1.weight"), t->gate, t->up, mesh, 1));
        CK(rm_weight1(&B, BUF("mlp.linear_fc2.weight"), t->down, mesh, row));
      } else {
        CK(rm_weight1(&B, BUF("pre_mlp_layernorm.weight"), t->ln2, mesh, rep));
        CK(rm_weight1(&B, BUF("mlp.router.weight"), t->router, mesh, rep));
        if (t->router_bias >= 0) CK(rm_weight1(&B, BUF("mlp.router.expert_bias"), t->router_bias, mesh, rep));
        CK(expert_buffers(&B, l, local, elocal, p->grouped_gemm, emeshes));
        if (t->sgate >= 0) {
          CK(rm_add_gate_up(&B, BUF("mlp.shared_experts.linear_fc1.weight"), t->sgate, t->sup, mesh, 1));
          CK(rm_weight1(&B, BUF("mlp.shared_experts.linear_fc2.weight"), t->sdown, mesh, row));
        }
      }
#undef BUF
    }
    if (s == pp - 1) {
      CK(rm_weight1(&B, "decoder.final_layernorm.weight", m->norm, mesh, rep));
      /* Tied embeddings: with pp > 1 the last stage keeps its own copy of
       * the embedding as output layer (a second buffer of the same logical
       * tensor); with pp == 1 the output layer is the embedding buffer. */
      if (m->lm_head >= 0) CK(rm_buf_vocab(L, "output_layer.weight", m->lm_head, mesh, vocab, H));
      else if (pp > 1) CK(rm_buf_vocab(L, "output_layer.weight", m->embed, mesh, vocab, H));
    }
  }
  free(stage_start);
  free(eranks);
  free(emeshes);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  free(stage_start);
  free(eranks);
  free(emeshes);
  reshard_layout_destroy(L);
  return r;
}
