/* The vLLM (inference) layout of a model; conventions in models.h.
 *
 * Per pipeline stage (layers split like vLLM's get_pp_indices), the mesh
 * [dp, tp] carries:
 *   QKVParallelLinear qkv_proj = [q shard; k shard; v shard], the KV heads
 *     replicated on tp / kv consecutive TP ranks when tp > kv (their own
 *     mesh [dp, kv, tp/kv] with (Replicate, Shard(0), Replicate));
 *   MergedColumnParallelLinear gate_up_proj = [gate shard; up shard];
 *   RowParallelLinear o_proj, down_proj (Shard(1));
 *   VocabParallelEmbedding / ParallelLMHead, padded to a multiple of 64;
 *   MLA: fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa] replicated
 *     (when q_lora_rank is set), q_b_proj / kv_b_proj column-parallel,
 *     o_proj row-parallel, the layernorms replicated.
 * FusedMoE experts over the stage's tp*dp ranks as [ep, tp*dp/ep]: w13 =
 * per expert [gate (w1); up (w3)] stacked [E, 2I, H] with (Shard(0),
 * Shard(1)), w2 [E, H, I] with (Shard(0), Shard(2)). vLLM never replicates
 * experts: the ranks that share an EP coordinate split the intermediate
 * dim (ep = 1 is vLLM's default "TP flattened across DP", ep = tp*dp its
 * expert-parallel mode).
 * Per-expert models: the same w13_weight / w2_weight buffers (FusedMoE
 * loads each checkpoint expert into its slot of them), described as the
 * concatenation along dim 0 of every expert's parts, each on the mesh
 * [tp*dp/ep] of its EP rank (expert e on EP rank e / (E/ep)): [gate_e
 * shard; up_e shard] per local expert for w13 (Shard(0)), down_e shards
 * for w2 (Shard(1)); byte for byte the stacked mode's buffers.
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

static reshard_result_t check_vllm(const rm_model *m, const rm_parallel *p) {
  const rm_config *c = &m->c;
  const int tp = p->tp;
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
  if (c->shared_intermediate % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d does not divide the shared experts' intermediate size %lld",
                    tp, (long long)c->shared_intermediate);
  if (c->experts > 0) {
    int etp = tp * p->dp / p->ep;
    if (p->etp != 1 && p->etp != etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "vllm layout: etp %d: vLLM splits each expert over the tp x dp / ep = %d ranks that share an "
                      "EP rank (say etp=1 or etp=%d)",
                      p->etp, etp, etp);
    if (c->moe_intermediate % etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "vllm layout: tp x dp / ep = %d does not divide the expert intermediate size %lld", etp,
                      (long long)c->moe_intermediate);
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rm_vllm_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: NULL argument");
  *out = NULL;
  RS_CHECK(rm_check_common(m, p, first_rank, "vllm"));
  RS_CHECK(check_vllm(m, p));
  const rm_config *c = &m->c;
  const int tp = p->tp, dp = p->dp, pp = p->pp, ep = p->ep, kv = (int)c->kv_heads;
  const int64_t H = c->hidden, vpad = rm_round_up(c->vocab, 64);
  reshard_layout_t *L = NULL;
  rm_builder B = {NULL, m, NULL, 0, 0};
  int *emeshes = NULL;
  reshard_part_t *xparts = NULL;
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  B.L = L;
  CK(rm_declare_tensors(L, m));
  const int per_expert = m->per_expert && c->experts > 0;
  if (per_expert) {
    emeshes = malloc((size_t)ep * sizeof *emeshes);
    xparts = malloc((size_t)c->experts * 2 * sizeof *xparts);
    if (!emeshes || !xparts) CK(rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "vllm layout: out of memory"));
  }

  const reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t kvrep[3] = {reshard_replicate(), reshard_shard(0), reshard_replicate()};
  const reshard_placement_t w13[2] = {reshard_shard(0), reshard_shard(1)};
  const reshard_placement_t w2[2] = {reshard_shard(0), reshard_shard(2)};
  const reshard_placement_t xw13[1] = {reshard_shard(0)}, xw2[1] = {reshard_shard(1)};
  char n[256];
  for (int s = 0; s < pp; s++) {
    const int start = first_rank + s * tp * dp;
    int mesh, kvmesh, emesh = -1;
    CK(rm_mesh_strided(&B, 2, (const int[]){dp, tp}, start, 1, &mesh));
    const reshard_placement_t *kvpl = col;
    kvmesh = mesh;
    if (!c->mla && tp > kv) {
      CK(rm_mesh_strided(&B, 3, (const int[]){dp, kv, tp / kv}, start, 1, &kvmesh));
      kvpl = kvrep;
    }
    if (c->experts > 0 && !per_expert)
      CK(rm_mesh_strided(&B, 2, (const int[]){ep, tp * dp / ep}, start, 1, &emesh));
    for (int er = 0; per_expert && er < ep; er++)
      CK(rm_mesh_strided(&B, 1, (const int[]){tp * dp / ep}, start + er * (tp * dp / ep), 1, &emeshes[er]));
    /* vLLM builds embed_tokens on the first stage, and on the last one too
     * when the lm_head is tied to it. */
    if (s == 0 || (s == pp - 1 && m->lm_head < 0))
      CK(rm_buf_vocab(L, "model.embed_tokens.weight", m->embed, mesh, vpad, H));
    const char *moe = c->arch == RM_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
    int l0, nl;
    rm_stage_layers(m->layers, pp, s, 1, &l0, &nl);
    for (int l = l0; l < l0 + nl; l++) {
      const rm_layer *t = &m->layer[l];
#define BUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s", l, suffix)
#define MOEBUF(suffix) rm_fmt(n, sizeof n, "model.layers.%d.%s.%s", l, moe, suffix)
      CK(rm_weight1(&B, BUF("input_layernorm.weight"), t->ln1, mesh, rep));
      if (!c->mla) {
        reshard_part_t qkv[3] = {{t->q, mesh, col, NULL}, {t->k, kvmesh, kvpl, NULL}, {t->v, kvmesh, kvpl, NULL}};
        CK(rm_add_weights(&B, BUF("self_attn.qkv_proj.weight"), 0, 1, 3, qkv));
        if (t->q_bias >= 0) {
          reshard_part_t b[3] = {{t->q_bias, mesh, col, NULL}, {t->k_bias, kvmesh, kvpl, NULL}, {t->v_bias, kvmesh, kvpl, NULL}};
          CK(rm_add_weights(&B, BUF("self_attn.qkv_proj.bias"), 0, 1, 3, b));
        }
        if (t->q_norm >= 0) {
          CK(rm_weight1(&B, BUF("self_attn.q_norm.weight"), t->q_norm, mesh, rep));
          CK(rm_weight1(&B, BUF("self_attn.k_norm.weight"), t->k_norm, mesh, rep));
        }
      } else {
        if (t->q_a >= 0) {
          reshard_part_t qkv_a[2] = {{t->q_a, mesh, rep, NULL}, {t->kv_a, mesh, rep, NULL}};
          CK(rm_add_weights(&B, BUF("self_attn.fused_qkv_a_proj.weight"), 0, 1, 2, qkv_a));
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
        reshard_part_t gu[2] = {{t->gate, mesh, col, NULL}, {t->up, mesh, col, NULL}};
        CK(rm_add_weights(&B, BUF("mlp.gate_up_proj.weight"), 0, 1, 2, gu));
        CK(rm_weight1(&B, BUF("mlp.down_proj.weight"), t->down, mesh, row));
      } else {
        CK(rm_weight1(&B, MOEBUF("gate.weight"), t->router, mesh, rep));
        if (t->router_bias >= 0) CK(rm_weight1(&B, MOEBUF("gate.e_score_correction_bias"), t->router_bias, mesh, rep));
        if (per_expert) {
          const int E = (int)c->experts, elocal = E / ep;
          for (int e = 0; e < E; e++) {
            xparts[2 * e] = (reshard_part_t){rm_expert(m, l, e, 0), emeshes[e / elocal], xw13, NULL};
            xparts[2 * e + 1] = (reshard_part_t){rm_expert(m, l, e, 1), emeshes[e / elocal], xw13, NULL};
          }
          CK(rm_add_weights(&B, MOEBUF("experts.w13_weight"), 0, 1, 2 * E, xparts));
          for (int e = 0; e < E; e++) xparts[e] = (reshard_part_t){rm_expert(m, l, e, 2), emeshes[e / elocal], xw2, NULL};
          CK(rm_add_weights(&B, MOEBUF("experts.w2_weight"), 0, 1, E, xparts));
        } else {
          reshard_part_t gu[2] = {{t->egate, emesh, w13, NULL}, {t->eup, emesh, w13, NULL}};
          CK(rm_add_weights(&B, MOEBUF("experts.w13_weight"), 1, 1, 2, gu));
          CK(rm_weight1(&B, MOEBUF("experts.w2_weight"), t->edown, emesh, w2));
        }
        if (t->sgate >= 0) {
          reshard_part_t sgu[2] = {{t->sgate, mesh, col, NULL}, {t->sup, mesh, col, NULL}};
          CK(rm_add_weights(&B, BUF("mlp.shared_experts.gate_up_proj.weight"), 0, 1, 2, sgu));
          CK(rm_weight1(&B, BUF("mlp.shared_experts.down_proj.weight"), t->sdown, mesh, row));
        }
      }
#undef BUF
#undef MOEBUF
    }
    if (s == pp - 1) {
      CK(rm_weight1(&B, "model.norm.weight", m->norm, mesh, rep));
      if (m->lm_head >= 0) CK(rm_buf_vocab(L, "lm_head.weight", m->lm_head, mesh, vpad, H));
    }
  }
  rm_builder_free(&B);
  free(emeshes);
  free(xparts);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  rm_builder_free(&B);
  free(emeshes);
  free(xparts);
  reshard_layout_destroy(L);
  return r;
}
