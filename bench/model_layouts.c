/* In-code Megatron and vLLM layouts of a transformer; see model_layouts.h
 * for the tensors, rank orders and the expert convention. Only the public
 * API is used to build the layouts, so that this file can move behind the
 * HF config front-end unchanged. */
#include "model_layouts.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"

#define NAME_MAX_LEN 160

#define CK(call)                                  \
  do {                                            \
    r = (call);                                   \
    if (r != RESHARD_SUCCESS) goto fail;          \
  } while (0)

typedef struct layer_ids {
  int ln1, q, k, v, o, ln2;
  int gate, up, down;            /* dense */
  int router, egate, eup, edown; /* MoE */
} layer_ids;

typedef struct model_ids {
  int embed, norm, lm_head; /* lm_head: -1 when tied */
  layer_ids *layer;
} model_ids;

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

int64_t ml_num_params(const ml_model *m) {
  const int64_t H = m->hidden, hd = m->head_dim;
  int64_t attn = (int64_t)m->heads * hd * H * 2 + (int64_t)m->kv_heads * hd * H * 2;
  int64_t mlp = m->experts > 0 ? (int64_t)m->experts * H + 3 * (int64_t)m->experts * m->moe_intermediate * H
                               : 3 * (int64_t)m->intermediate * H;
  int64_t per_layer = attn + mlp + 2 * H;
  return m->vocab * H * (m->tied_embeddings ? 1 : 2) + H + (int64_t)m->layers * per_layer;
}

int ml_num_tensors(const ml_model *m) {
  return 2 + !m->tied_embeddings + m->layers * (m->experts > 0 ? 10 : 9);
}

int ml_megatron_ranks(const ml_megatron *p) { return p->tp * p->pp * p->dp; }
int ml_vllm_ranks(const ml_vllm *p) { return p->tp * p->dp; }

static reshard_result_t check_model(const ml_model *m) {
  if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->kv_heads < 1 || m->head_dim < 1 || m->vocab < 1 ||
      m->experts < 0 || (m->experts == 0 && m->intermediate < 1) || (m->experts > 0 && m->moe_intermediate < 1))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "model: every size must be positive (experts >= 0)");
  if (m->heads % m->kv_heads)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "model: %d heads are not a multiple of %d KV heads", m->heads, m->kv_heads);
  if (reshard_dtype_size(m->dtype) == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "model: invalid dtype %d", (int)m->dtype);
  return RESHARD_SUCCESS;
}

static reshard_result_t add(reshard_layout_t *L, const char *name, reshard_dtype_t dt, int ndim, int64_t a, int64_t b,
                            int64_t c, int *id) {
  int64_t shape[3] = {a, b, c};
  return reshard_layout_add_tensor(L, name, dt, ndim, shape, id);
}

/* Declares the logical tensors, identically on both sides. */
static reshard_result_t declare_tensors(reshard_layout_t *L, const ml_model *m, model_ids *ids) {
  const int64_t H = m->hidden, hd = m->head_dim, I = m->intermediate, E = m->experts, Im = m->moe_intermediate;
  const reshard_dtype_t dt = m->dtype;
  char n[NAME_MAX_LEN];
  ids->layer = calloc((size_t)m->layers, sizeof *ids->layer);
  if (!ids->layer) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "model: out of memory");
  RS_CHECK(add(L, "model.embed_tokens.weight", dt, 2, m->vocab, H, 0, &ids->embed));
  for (int l = 0; l < m->layers; l++) {
    layer_ids *t = &ids->layer[l];
#define T(suffix, nd, a, b, c, id)                                        \
  do {                                                                    \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);               \
    RS_CHECK(add(L, n, dt, nd, a, b, c, id));                             \
  } while (0)
    T("input_layernorm.weight", 1, H, 0, 0, &t->ln1);
    T("self_attn.q_proj.weight", 2, m->heads * hd, H, 0, &t->q);
    T("self_attn.k_proj.weight", 2, m->kv_heads * hd, H, 0, &t->k);
    T("self_attn.v_proj.weight", 2, m->kv_heads * hd, H, 0, &t->v);
    T("self_attn.o_proj.weight", 2, H, m->heads * hd, 0, &t->o);
    T("post_attention_layernorm.weight", 1, H, 0, 0, &t->ln2);
    if (E == 0) {
      T("mlp.gate_proj.weight", 2, I, H, 0, &t->gate);
      T("mlp.up_proj.weight", 2, I, H, 0, &t->up);
      T("mlp.down_proj.weight", 2, H, I, 0, &t->down);
    } else {
      T("mlp.gate.weight", 2, E, H, 0, &t->router);
      T("mlp.experts.gate_proj.weight", 3, E, Im, H, &t->egate);
      T("mlp.experts.up_proj.weight", 3, E, Im, H, &t->eup);
      T("mlp.experts.down_proj.weight", 3, E, H, Im, &t->edown);
    }
#undef T
  }
  RS_CHECK(add(L, "model.norm.weight", dt, 1, H, 0, 0, &ids->norm));
  ids->lm_head = -1;
  if (!m->tied_embeddings) RS_CHECK(add(L, "lm_head.weight", dt, 2, m->vocab, H, 0, &ids->lm_head));
  return RESHARD_SUCCESS;
}

/* A vocabulary-parallel buffer: rows padded to vpad, Shard(0) over the
 * mesh's last axis, replicated over the others. */
static reshard_result_t add_vocab(reshard_layout_t *L, const char *name, int tensor, int mesh, int mesh_ndim,
                                  int64_t vpad, int64_t H) {
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  for (int a = 0; a < mesh_ndim; a++) pl[a] = reshard_replicate();
  pl[mesh_ndim - 1] = reshard_shard(0);
  int64_t padded[2] = {vpad, H};
  reshard_part_t part = {tensor, mesh, pl, padded};
  return reshard_layout_add_fused(L, name, 0, 1, 1, &part, NULL);
}

/* ---------------- Megatron ---------------- */

reshard_result_t ml_megatron_layout(const ml_model *m, const ml_megatron *p, int first_rank,
                                    reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: NULL argument");
  *out = NULL;
  RS_CHECK(check_model(m));
  const int tp = p->tp, pp = p->pp, dp = p->dp, ep = p->ep;
  if (tp < 1 || pp < 1 || dp < 1 || ep < 1 || first_rank < 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d, pp %d, dp %d, ep %d and first rank %d must be positive", tp, pp, dp, ep, first_rank);
  if (pp > m->layers)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: pp %d exceeds the %d layers", pp, m->layers);
  if (m->kv_heads % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: tp %d does not divide the %d query groups (KV heads)", tp, m->kv_heads);
  if (m->experts > 0 && ((tp * dp) % ep || m->experts % ep))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: ep %d must divide tp*dp = %d and the %d experts", ep, tp * dp, m->experts);
  if (m->experts == 0 && ep != 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: ep %d on a dense model", ep);

  const int64_t H = m->hidden, vpad = round_up(m->vocab, 128 * (int64_t)tp);
  reshard_layout_t *L = NULL;
  model_ids ids = {0};
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  CK(declare_tensors(L, m, &ids));

  const reshard_placement_t rep2[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  const reshard_placement_t expert[2] = {reshard_replicate(), reshard_shard(0)};
  char n[NAME_MAX_LEN];
  int layer = 0;
  for (int s = 0; s < pp; s++) {
    int mesh, emesh = -1;
    int shape[2] = {dp, tp};
    int start = first_rank + s * tp * dp;
    CK(reshard_layout_add_mesh_strided(L, 2, shape, start, 1, &mesh));
    if (m->experts > 0) {
      int eshape[2] = {tp * dp / ep, ep};
      CK(reshard_layout_add_mesh_strided(L, 2, eshape, start, 1, &emesh));
    }
    if (s == 0) CK(add_vocab(L, "embedding.word_embeddings.weight", ids.embed, mesh, 2, vpad, H));
    int nl = m->layers / pp + (s < m->layers % pp);
    for (int end = layer + nl; layer < end; layer++) {
      const layer_ids *t = &ids.layer[layer];
#define BUF(suffix) (snprintf(n, sizeof n, "decoder.layers.%d.%s", layer, suffix), n)
      CK(reshard_layout_add_fused(L, BUF("input_layernorm.weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->ln1, mesh, rep2, NULL}}, NULL));
      reshard_part_t qkv[3] = {{t->q, mesh, col, NULL}, {t->k, mesh, col, NULL}, {t->v, mesh, col, NULL}};
      CK(reshard_layout_add_fused(L, BUF("self_attention.linear_qkv.weight"), 0, m->kv_heads, 3, qkv, NULL));
      CK(reshard_layout_add_fused(L, BUF("self_attention.linear_proj.weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->o, mesh, row, NULL}}, NULL));
      CK(reshard_layout_add_fused(L, BUF("pre_mlp_layernorm.weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->ln2, mesh, rep2, NULL}}, NULL));
      if (m->experts == 0) {
        reshard_part_t fc1[2] = {{t->gate, mesh, col, NULL}, {t->up, mesh, col, NULL}};
        CK(reshard_layout_add_fused(L, BUF("mlp.linear_fc1.weight"), 0, 1, 2, fc1, NULL));
        CK(reshard_layout_add_fused(L, BUF("mlp.linear_fc2.weight"), 0, 1, 1,
                                    (reshard_part_t[]){{t->down, mesh, row, NULL}}, NULL));
      } else {
        CK(reshard_layout_add_fused(L, BUF("mlp.router.weight"), 0, 1, 1,
                                    (reshard_part_t[]){{t->router, mesh, rep2, NULL}}, NULL));
        reshard_part_t fc1[2] = {{t->egate, emesh, expert, NULL}, {t->eup, emesh, expert, NULL}};
        CK(reshard_layout_add_fused(L, BUF("mlp.experts.linear_fc1.weight"), 1, 1, 2, fc1, NULL));
        CK(reshard_layout_add_fused(L, BUF("mlp.experts.linear_fc2.weight"), 0, 1, 1,
                                    (reshard_part_t[]){{t->edown, emesh, expert, NULL}}, NULL));
      }
#undef BUF
    }
    if (s == pp - 1) {
      CK(reshard_layout_add_fused(L, "decoder.final_layernorm.weight", 0, 1, 1,
                                  (reshard_part_t[]){{ids.norm, mesh, rep2, NULL}}, NULL));
      /* Tied embeddings: the last stage keeps its own copy of the
       * embedding as the output layer (one buffer when pp == 1). */
      if (!m->tied_embeddings) CK(add_vocab(L, "output_layer.weight", ids.lm_head, mesh, 2, vpad, H));
      else if (pp > 1) CK(add_vocab(L, "output_layer.weight", ids.embed, mesh, 2, vpad, H));
    }
  }
  free(ids.layer);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  free(ids.layer);
  reshard_layout_destroy(L);
  return r;
}

/* ---------------- vLLM ---------------- */

reshard_result_t ml_vllm_layout(const ml_model *m, const ml_vllm *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: NULL argument");
  *out = NULL;
  RS_CHECK(check_model(m));
  const int tp = p->tp, dp = p->dp, ep = p->ep, kv = m->kv_heads;
  if (tp < 1 || dp < 1 || ep < 1 || first_rank < 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d, dp %d, ep %d and first rank %d must be positive", tp, dp, ep, first_rank);
  if (tp > kv ? tp % kv : kv % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: tp %d and %d KV heads: one must divide the other", tp, kv);
  if (m->experts > 0 && ((tp * dp) % ep || m->experts % ep))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: ep %d must divide tp*dp = %d and the %d experts", ep, tp * dp, m->experts);
  if (m->experts == 0 && ep != 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "vllm layout: ep %d on a dense model", ep);

  const int64_t H = m->hidden, vpad = round_up(m->vocab, 64);
  reshard_layout_t *L = NULL;
  model_ids ids = {0};
  reshard_result_t r;
  CK(reshard_layout_create(&L));
  CK(declare_tensors(L, m, &ids));

  int mesh, kvmesh, emesh = -1;
  int shape[2] = {dp, tp};
  CK(reshard_layout_add_mesh_strided(L, 2, shape, first_rank, 1, &mesh));
  const reshard_placement_t rep2[2] = {reshard_replicate(), reshard_replicate()};
  const reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_placement_t row[2] = {reshard_replicate(), reshard_shard(1)};
  /* tp > kv: each KV head is replicated on tp/kv consecutive TP ranks. */
  const reshard_placement_t kvrep[3] = {reshard_replicate(), reshard_shard(0), reshard_replicate()};
  const reshard_placement_t *kvpl = col;
  kvmesh = mesh;
  if (tp > kv) {
    int kshape[3] = {dp, kv, tp / kv};
    CK(reshard_layout_add_mesh_strided(L, 3, kshape, first_rank, 1, &kvmesh));
    kvpl = kvrep;
  }
  const reshard_placement_t w13[2] = {reshard_shard(0), reshard_shard(1)};
  const reshard_placement_t w2[2] = {reshard_shard(0), reshard_shard(2)};
  if (m->experts > 0) {
    int eshape[2] = {ep, tp * dp / ep};
    CK(reshard_layout_add_mesh_strided(L, 2, eshape, first_rank, 1, &emesh));
  }

  CK(add_vocab(L, "model.embed_tokens.weight", ids.embed, mesh, 2, vpad, H));
  char n[NAME_MAX_LEN];
  for (int l = 0; l < m->layers; l++) {
    const layer_ids *t = &ids.layer[l];
#define BUF(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    CK(reshard_layout_add_fused(L, BUF("input_layernorm.weight"), 0, 1, 1,
                                (reshard_part_t[]){{t->ln1, mesh, rep2, NULL}}, NULL));
    reshard_part_t qkv[3] = {{t->q, mesh, col, NULL}, {t->k, kvmesh, kvpl, NULL}, {t->v, kvmesh, kvpl, NULL}};
    CK(reshard_layout_add_fused(L, BUF("self_attn.qkv_proj.weight"), 0, 1, 3, qkv, NULL));
    CK(reshard_layout_add_fused(L, BUF("self_attn.o_proj.weight"), 0, 1, 1,
                                (reshard_part_t[]){{t->o, mesh, row, NULL}}, NULL));
    CK(reshard_layout_add_fused(L, BUF("post_attention_layernorm.weight"), 0, 1, 1,
                                (reshard_part_t[]){{t->ln2, mesh, rep2, NULL}}, NULL));
    if (m->experts == 0) {
      reshard_part_t gu[2] = {{t->gate, mesh, col, NULL}, {t->up, mesh, col, NULL}};
      CK(reshard_layout_add_fused(L, BUF("mlp.gate_up_proj.weight"), 0, 1, 2, gu, NULL));
      CK(reshard_layout_add_fused(L, BUF("mlp.down_proj.weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->down, mesh, row, NULL}}, NULL));
    } else {
      CK(reshard_layout_add_fused(L, BUF("mlp.gate.weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->router, mesh, rep2, NULL}}, NULL));
      reshard_part_t gu[2] = {{t->egate, emesh, w13, NULL}, {t->eup, emesh, w13, NULL}};
      CK(reshard_layout_add_fused(L, BUF("mlp.experts.w13_weight"), 1, 1, 2, gu, NULL));
      CK(reshard_layout_add_fused(L, BUF("mlp.experts.w2_weight"), 0, 1, 1,
                                  (reshard_part_t[]){{t->edown, emesh, w2, NULL}}, NULL));
    }
#undef BUF
  }
  CK(reshard_layout_add_fused(L, "model.norm.weight", 0, 1, 1,
                              (reshard_part_t[]){{ids.norm, mesh, rep2, NULL}}, NULL));
  if (!m->tied_embeddings) CK(add_vocab(L, "lm_head.weight", ids.lm_head, mesh, 2, vpad, H));
  free(ids.layer);
  *out = L;
  return RESHARD_SUCCESS;
fail:
  free(ids.layer);
  reshard_layout_destroy(L);
  return r;
}

reshard_result_t ml_build_pair(const ml_model *m, const ml_megatron *src, const ml_vllm *dst, int colocate,
                               reshard_layout_t **src_out, reshard_layout_t **dst_out, int *nranks) {
  if (!m || !src || !dst || !src_out || !dst_out || !nranks) {
    rs_error_clear();
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "ml_build_pair: NULL argument");
  }
  *src_out = *dst_out = NULL;
  int S = ml_megatron_ranks(src), D = ml_vllm_ranks(dst);
  RS_CHECK(ml_megatron_layout(m, src, 0, src_out));
  reshard_result_t r = ml_vllm_layout(m, dst, colocate ? 0 : S, dst_out);
  if (r != RESHARD_SUCCESS) {
    reshard_layout_destroy(*src_out);
    *src_out = NULL;
    return r;
  }
  *nranks = colocate ? (S > D ? S : D) : S + D;
  return RESHARD_SUCCESS;
}
