/* The Megatron-core (training) layout of a model; conventions in models.h.
 *
 * Per pipeline stage s (ranks first + s*tp*dp .. + tp*dp - 1), the mesh
 * [dp, tp] (tp fastest) carries everything but the routed experts:
 *   column-parallel (Replicate, Shard(0)): fused QKV (interleaved per KV
 *     group), fused gate/up (linear_fc1), MLA q_up / kv_up, shared experts'
 *     fc1, the vocabulary (padded to a multiple of 128 x tp);
 *   row-parallel (Replicate, Shard(1)): linear_proj, linear_fc2;
 *   replicated: norms, biases of row-parallel layers, the router, MLA's
 *     q_down / kv_down projections and their layernorms.
 * Routed experts use Megatron-core's expert grid over the same ranks,
 * [tp*dp / (ep*etp), ep, etp] (etp fastest, then ep, then expert-DP):
 * (Replicate, Shard(0), Shard(1)) for fc1 = per expert [gate slice; up
 * slice], (Replicate, Shard(0), Shard(2)) for fc2.
 * Per-expert models: SequentialMLP's buffers, per layer and local expert i
 * "decoder.layers.N.mlp.experts.local_experts.<i>.linear_fc{1,2}.weight";
 * on EP rank r the buffer holds expert r * E/ep + i ([gate slice; up
 * slice] for fc1), over the mesh [tp*dp / (ep*etp), etp] of that EP rank's
 * ranks with (Replicate, Shard(0)) for fc1 and (Replicate, Shard(1)) for
 * fc2: the stacked mode's bytes, one expert per buffer.
 * Block scales: every weight buffer is followed by its "<name>_scale_inv"
 * buffer of the weights' scales, arranged the same way. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "models_internal.h"

#define CK(call)                         \
  do {                                   \
    r = (call);                          \
    if (r != RESHARD_SUCCESS) goto fail; \
  } while (0)

static reshard_result_t check_megatron(const rm_model *m, const rm_parallel *p) {
  const rm_config *c = &m->c;
  if (!c->mla && c->kv_heads % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "megatron layout: tp %d does not divide the %lld query groups (num_key_value_heads); Megatron-core "
                    "shards whole KV groups",
                    p->tp, (long long)c->kv_heads);
  int dense = 0;
  for (int l = 0; l < m->layers; l++) dense |= m->layer[l].gate >= 0;
  if (dense && c->intermediate % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d does not divide intermediate_size %lld",
                    p->tp, (long long)c->intermediate);
  if (c->experts > 0 && c->moe_intermediate % p->etp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: etp %d does not divide the expert intermediate size %lld",
                    p->etp, (long long)c->moe_intermediate);
  if (c->shared_intermediate % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d does not divide the shared experts' intermediate size %lld",
                    p->tp, (long long)c->shared_intermediate);
  return RESHARD_SUCCESS;
}

/* SequentialMLP: buffer local_experts.<i> holds expert er * elocal + i on
 * EP rank er, so each buffer has one (fc2) or two (fc1) parts per EP rank. */
static reshard_result_t per_expert_buffers(rm_builder *B, int l, int elocal, const int *emeshes,
                                           const reshard_placement_t *fc1, const reshard_placement_t *fc2) {
  const rm_model *m = B->m;
  const int ep = (int)(m->c.experts / elocal);
  reshard_part_t *parts = malloc((size_t)ep * 2 * sizeof *parts);
  if (!parts) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "megatron layout: out of memory");
  char n[256];
  reshard_result_t r = RESHARD_SUCCESS;
  for (int i = 0; i < elocal && r == RESHARD_SUCCESS; i++) {
    for (int er = 0; er < ep; er++) {
      int e = er * elocal + i;
      parts[2 * er] = (reshard_part_t){rm_expert(m, l, e, 0), emeshes[er], fc1, NULL};
      parts[2 * er + 1] = (reshard_part_t){rm_expert(m, l, e, 1), emeshes[er], fc1, NULL};
    }
    rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc1.weight", l, i);
    r = rm_add_weights(B, n, 0, 1, 2 * ep, parts);
    if (r != RESHARD_SUCCESS) break;
    for (int er = 0; er < ep; er++) parts[er] = (reshard_part_t){rm_expert(m, l, er * elocal + i, 2), emeshes[er], fc2, NULL};
    rm_fmt(n, sizeof n, "decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc2.weight", l, i);
    r = rm_add_weights(B, n, 0, 1, ep, parts);
  }
  free(parts);
  return r;
}

reshard_result_t rm_megatron_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: NULL argument");
  *out = NULL;
  RS_CHECK(rm_check_common(m, p, first_rank, "megatron"));
  RS_CHECK(check_megatron(m, p));
  const rm_config *c = &m->c;
  const int tp = p->tp, dp = p->dp, pp = p->pp, ep = p->ep, etp = p->etp;
  const int64_t H = c->hidden, vpad = rm_round_up(c->vocab, 128 * (int64_t)tp);
  reshard_layout_t *L = NULL;
  rm_builder B = {NULL, m, NULL, 0, 0};
  int *eranks = NULL, *emeshes = NULL;
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  B.L = L;
  CK(rm_declare_tensors(L, m));
  const int per_expert = m->per_expert && c->experts > 0;
  const int edp = tp * dp / (ep * etp), elocal = (int)(c->experts / ep);
  if (per_expert) {
    eranks = malloc((size_t)edp * (size_t)etp * sizeof *eranks);
    emeshes = malloc((size_t)ep * sizeof *emeshes);
    if (!eranks || !emeshes) CK(rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "megatron layout: out of memory"));
  }

  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t efc1[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(1)};
  const reshard_placement_t efc2[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(2)};
  /* per-expert: the [expert-DP, etp] grid of one EP rank */
  const reshard_placement_t xfc1[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t xfc2[2] = {reshard_replicate(), reshard_shard(1)};
  char n[256];
  for (int s = 0; s < pp; s++) {
    const int start = first_rank + s * tp * dp;
    int mesh, emesh = -1;
    CK(rm_mesh_strided(&B, 2, (const int[]){dp, tp}, start, 1, &mesh));
    if (c->experts > 0 && !per_expert)
      CK(rm_mesh_strided(&B, 3, (const int[]){edp, ep, etp}, start, 1, &emesh));
    for (int er = 0; per_expert && er < ep; er++) {
      for (int i = 0; i < edp; i++)
        for (int j = 0; j < etp; j++) eranks[i * etp + j] = start + i * ep * etp + er * etp + j;
      CK(rm_mesh_ranks(&B, 2, (const int[]){edp, etp}, eranks, &emeshes[er]));
    }
    if (s == 0) CK(rm_buf_vocab(L, "embedding.word_embeddings.weight", m->embed, mesh, vpad, H));
    int l0, nl;
    rm_stage_layers(m->layers, pp, s, 0, &l0, &nl);
    for (int l = l0; l < l0 + nl; l++) {
      const rm_layer *t = &m->layer[l];
#define BUF(suffix) rm_fmt(n, sizeof n, "decoder.layers.%d.%s", l, suffix)
      CK(rm_weight1(&B, BUF("input_layernorm.weight"), t->ln1, mesh, rep));
      if (!c->mla) {
        reshard_part_t qkv[3] = {{t->q, mesh, col, NULL}, {t->k, mesh, col, NULL}, {t->v, mesh, col, NULL}};
        CK(rm_add_weights(&B, BUF("self_attention.linear_qkv.weight"), 0, (int)c->kv_heads, 3, qkv));
        if (t->q_bias >= 0) {
          reshard_part_t b[3] = {{t->q_bias, mesh, col, NULL}, {t->k_bias, mesh, col, NULL}, {t->v_bias, mesh, col, NULL}};
          CK(rm_add_weights(&B, BUF("self_attention.linear_qkv.bias"), 0, (int)c->kv_heads, 3, b));
        }
        if (t->q_norm >= 0) {
          CK(rm_weight1(&B, BUF("self_attention.q_layernorm.weight"), t->q_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attention.k_layernorm.weight"), t->k_norm, mesh, rep));
        }
      } else {
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
      CK(rm_weight1(&B, BUF("pre_mlp_layernorm.weight"), t->ln2, mesh, rep));
      if (t->gate >= 0) {
        reshard_part_t fc1[2] = {{t->gate, mesh, col, NULL}, {t->up, mesh, col, NULL}};
        CK(rm_add_weights(&B, BUF("mlp.linear_fc1.weight"), 0, 1, 2, fc1));
        CK(rm_weight1(&B, BUF("mlp.linear_fc2.weight"), t->down, mesh, row));
      } else {
        CK(rm_weight1(&B, BUF("mlp.router.weight"), t->router, mesh, rep));
        if (t->router_bias >= 0) CK(rm_weight1(&B, BUF("mlp.router.expert_bias"), t->router_bias, mesh, rep));
        if (per_expert) {
          CK(per_expert_buffers(&B, l, elocal, emeshes, xfc1, xfc2));
        } else {
          reshard_part_t fc1[2] = {{t->egate, emesh, efc1, NULL}, {t->eup, emesh, efc1, NULL}};
          CK(rm_add_weights(&B, BUF("mlp.experts.linear_fc1.weight"), 1, 1, 2, fc1));
          CK(rm_weight1(&B, BUF("mlp.experts.linear_fc2.weight"), t->edown, emesh, efc2));
        }
        if (t->sgate >= 0) {
          reshard_part_t sfc1[2] = {{t->sgate, mesh, col, NULL}, {t->sup, mesh, col, NULL}};
          CK(rm_add_weights(&B, BUF("mlp.shared_experts.linear_fc1.weight"), 0, 1, 2, sfc1));
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
      if (m->lm_head >= 0) CK(rm_buf_vocab(L, "output_layer.weight", m->lm_head, mesh, vpad, H));
      else if (pp > 1) CK(rm_buf_vocab(L, "output_layer.weight", m->embed, mesh, vpad, H));
    }
  }
  rm_builder_free(&B);
  free(eranks);
  free(emeshes);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  rm_builder_free(&B);
  free(eranks);
  free(emeshes);
  reshard_layout_destroy(L);
  return r;
}
