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
 * slice], (Replicate, Shard(0), Shard(2)) for fc2. */
#include <stdio.h>

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
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  CK(rm_declare_tensors(L, m));

  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t efc1[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(1)};
  const reshard_placement_t efc2[3] = {reshard_replicate(), reshard_shard(0), reshard_shard(2)};
  char n[256];
  for (int s = 0; s < pp; s++) {
    const int start = first_rank + s * tp * dp;
    int mesh, emesh = -1;
    CK(reshard_layout_add_mesh_strided(L, 2, (const int[]){dp, tp}, start, 1, &mesh));
    if (c->experts > 0)
      CK(reshard_layout_add_mesh_strided(L, 3, (const int[]){tp * dp / (ep * etp), ep, etp}, start, 1, &emesh));
    if (s == 0) CK(rm_buf_vocab(L, "embedding.word_embeddings.weight", m->embed, mesh, vpad, H));
    int l0, nl;
    rm_stage_layers(m->layers, pp, s, 0, &l0, &nl);
    for (int l = l0; l < l0 + nl; l++) {
      const rm_layer *t = &m->layer[l];
#define BUF(suffix) rm_fmt(n, sizeof n, "decoder.layers.%d.%s", l, suffix)
      CK(rm_buf1(L, BUF("input_layernorm.weight"), t->ln1, mesh, rep));
      if (!c->mla) {
        reshard_part_t qkv[3] = {{t->q, mesh, col, NULL}, {t->k, mesh, col, NULL}, {t->v, mesh, col, NULL}};
        CK(reshard_layout_add_fused(L, BUF("self_attention.linear_qkv.weight"), 0, (int)c->kv_heads, 3, qkv, NULL));
        if (t->q_bias >= 0) {
          reshard_part_t b[3] = {{t->q_bias, mesh, col, NULL}, {t->k_bias, mesh, col, NULL}, {t->v_bias, mesh, col, NULL}};
          CK(reshard_layout_add_fused(L, BUF("self_attention.linear_qkv.bias"), 0, (int)c->kv_heads, 3, b, NULL));
        }
        if (t->q_norm >= 0) {
          CK(rm_buf1(L, BUF("self_attention.q_layernorm.weight"), t->q_norm, mesh, rep));
          CK(rm_buf1(L, BUF("self_attention.k_layernorm.weight"), t->k_norm, mesh, rep));
        }
      } else {
        if (t->q_a >= 0) {
          CK(rm_buf1(L, BUF("self_attention.linear_q_down_proj.weight"), t->q_a, mesh, rep));
          CK(rm_buf1(L, BUF("self_attention.linear_q_up_proj.layer_norm_weight"), t->q_a_norm, mesh, rep));
          CK(rm_buf1(L, BUF("self_attention.linear_q_up_proj.weight"), t->q_b, mesh, col));
        } else {
          CK(rm_buf1(L, BUF("self_attention.linear_q_proj.weight"), t->q, mesh, col));
        }
        CK(rm_buf1(L, BUF("self_attention.linear_kv_down_proj.weight"), t->kv_a, mesh, rep));
        CK(rm_buf1(L, BUF("self_attention.linear_kv_up_proj.layer_norm_weight"), t->kv_a_norm, mesh, rep));
        CK(rm_buf1(L, BUF("self_attention.linear_kv_up_proj.weight"), t->kv_b, mesh, col));
      }
      CK(rm_buf1(L, BUF("self_attention.linear_proj.weight"), t->o, mesh, row));
      if (t->o_bias >= 0) CK(rm_buf1(L, BUF("self_attention.linear_proj.bias"), t->o_bias, mesh, rep));
      CK(rm_buf1(L, BUF("pre_mlp_layernorm.weight"), t->ln2, mesh, rep));
      if (t->gate >= 0) {
        reshard_part_t fc1[2] = {{t->gate, mesh, col, NULL}, {t->up, mesh, col, NULL}};
        CK(reshard_layout_add_fused(L, BUF("mlp.linear_fc1.weight"), 0, 1, 2, fc1, NULL));
        CK(rm_buf1(L, BUF("mlp.linear_fc2.weight"), t->down, mesh, row));
      } else {
        CK(rm_buf1(L, BUF("mlp.router.weight"), t->router, mesh, rep));
        if (t->router_bias >= 0) CK(rm_buf1(L, BUF("mlp.router.expert_bias"), t->router_bias, mesh, rep));
        reshard_part_t fc1[2] = {{t->egate, emesh, efc1, NULL}, {t->eup, emesh, efc1, NULL}};
        CK(reshard_layout_add_fused(L, BUF("mlp.experts.linear_fc1.weight"), 1, 1, 2, fc1, NULL));
        CK(rm_buf1(L, BUF("mlp.experts.linear_fc2.weight"), t->edown, emesh, efc2));
        if (t->sgate >= 0) {
          reshard_part_t sfc1[2] = {{t->sgate, mesh, col, NULL}, {t->sup, mesh, col, NULL}};
          CK(reshard_layout_add_fused(L, BUF("mlp.shared_experts.linear_fc1.weight"), 0, 1, 2, sfc1, NULL));
          CK(rm_buf1(L, BUF("mlp.shared_experts.linear_fc2.weight"), t->sdown, mesh, row));
        }
      }
#undef BUF
    }
    if (s == pp - 1) {
      CK(rm_buf1(L, "decoder.final_layernorm.weight", m->norm, mesh, rep));
      /* Tied embeddings: with pp > 1 the last stage keeps its own copy of
       * the embedding as output layer (a second buffer of the same logical
       * tensor); with pp == 1 the output layer is the embedding buffer. */
      if (m->lm_head >= 0) CK(rm_buf_vocab(L, "output_layer.weight", m->lm_head, mesh, vpad, H));
      else if (pp > 1) CK(rm_buf_vocab(L, "output_layer.weight", m->embed, mesh, vpad, H));
    }
  }
  *out = L;
  return RESHARD_SUCCESS;
fail:
  reshard_layout_destroy(L);
  return r;
}
