/* The logical tensors of each architecture family, with their HF names
 * (see models.h for the naming of stacked experts). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "models_internal.h"

static reshard_result_t add(rm_model *m, int *id, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static reshard_result_t add(rm_model *m, int *id, int ndim, int64_t a, int64_t b, int64_t c, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  if (m->ntensors == m->cap_tensors) {
    int cap = m->cap_tensors ? 2 * m->cap_tensors : 64;
    rm_tensor *t = realloc(m->tensors, (size_t)cap * sizeof *t);
    if (!t) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
    m->tensors = t;
    m->cap_tensors = cap;
  }
  rm_tensor *t = &m->tensors[m->ntensors];
  memset(t, 0, sizeof *t);
  if (!(t->name = strdup(name))) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
  t->ndim = ndim;
  int64_t dims[3] = {a, b, c}, count = 1;
  for (int d = 0; d < ndim; d++) {
    t->shape[d] = dims[d];
    if (__builtin_mul_overflow(count, dims[d], &count))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': tensor '%s' has more than 2^63 elements", m->path,
                      name);
  }
  if (__builtin_add_overflow(m->params, count, &m->params))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': more than 2^63 parameters", m->path);
  *id = m->ntensors++;
  return RESHARD_SUCCESS;
}

#define L(l, id, nd, a, b, c, suffix) RS_CHECK(add(m, id, nd, a, b, c, "model.layers.%d." suffix, l))

/* Llama-style attention with grouped KV heads (llama, mistral, qwen2,
 * qwen3, qwen3_moe, mixtral). */
static reshard_result_t gqa_attention(rm_model *m, int l, rm_layer *t) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
  L(l, &t->q, 2, q, H, 0, "self_attn.q_proj.weight");
  if (c->qkv_bias) L(l, &t->q_bias, 1, q, 0, 0, "self_attn.q_proj.bias");
  L(l, &t->k, 2, kv, H, 0, "self_attn.k_proj.weight");
  if (c->qkv_bias) L(l, &t->k_bias, 1, kv, 0, 0, "self_attn.k_proj.bias");
  L(l, &t->v, 2, kv, H, 0, "self_attn.v_proj.weight");
  if (c->qkv_bias) L(l, &t->v_bias, 1, kv, 0, 0, "self_attn.v_proj.bias");
  L(l, &t->o, 2, H, q, 0, "self_attn.o_proj.weight");
  if (c->o_bias) L(l, &t->o_bias, 1, H, 0, 0, "self_attn.o_proj.bias");
  if (c->qk_norm) {
    L(l, &t->q_norm, 1, c->head_dim, 0, 0, "self_attn.q_norm.weight");
    L(l, &t->k_norm, 1, c->head_dim, 0, 0, "self_attn.k_norm.weight");
  }
  return RESHARD_SUCCESS;
}

/* DeepSeek multi-head latent attention. */
static reshard_result_t mla_attention(rm_model *m, int l, rm_layer *t) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, qk = c->heads * (c->qk_nope + c->qk_rope);
  if (c->q_lora) {
    L(l, &t->q_a, 2, c->q_lora, H, 0, "self_attn.q_a_proj.weight");
    L(l, &t->q_a_norm, 1, c->q_lora, 0, 0, "self_attn.q_a_layernorm.weight");
    L(l, &t->q_b, 2, qk, c->q_lora, 0, "self_attn.q_b_proj.weight");
  } else {
    L(l, &t->q, 2, qk, H, 0, "self_attn.q_proj.weight");
  }
  L(l, &t->kv_a, 2, c->kv_lora + c->qk_rope, H, 0, "self_attn.kv_a_proj_with_mqa.weight");
  L(l, &t->kv_a_norm, 1, c->kv_lora, 0, 0, "self_attn.kv_a_layernorm.weight");
  L(l, &t->kv_b, 2, c->heads * (c->qk_nope + c->v_head), c->kv_lora, 0, "self_attn.kv_b_proj.weight");
  L(l, &t->o, 2, H, c->heads * c->v_head, 0, "self_attn.o_proj.weight");
  return RESHARD_SUCCESS;
}

static reshard_result_t dense_mlp(rm_model *m, int l, rm_layer *t) {
  const int64_t H = m->c.hidden, I = m->c.intermediate;
  L(l, &t->gate, 2, I, H, 0, "mlp.gate_proj.weight");
  L(l, &t->up, 2, I, H, 0, "mlp.up_proj.weight");
  L(l, &t->down, 2, H, I, 0, "mlp.down_proj.weight");
  return RESHARD_SUCCESS;
}

static reshard_result_t moe_mlp(rm_model *m, int l, rm_layer *t) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, E = c->experts, I = c->moe_intermediate, S = c->shared_intermediate;
  if (c->arch == RM_ARCH_MIXTRAL) {
    /* The checkpoint's block_sparse_moe.experts.<e>.w1 (gate), w3 (up) and
     * w2 (down), stacked over e. */
    L(l, &t->router, 2, E, H, 0, "block_sparse_moe.gate.weight");
    L(l, &t->egate, 3, E, I, H, "block_sparse_moe.experts.w1.weight");
    L(l, &t->eup, 3, E, I, H, "block_sparse_moe.experts.w3.weight");
    L(l, &t->edown, 3, E, H, I, "block_sparse_moe.experts.w2.weight");
    return RESHARD_SUCCESS;
  }
  L(l, &t->router, 2, E, H, 0, "mlp.gate.weight");
  if (c->router_bias) L(l, &t->router_bias, 1, E, 0, 0, "mlp.gate.e_score_correction_bias");
  L(l, &t->egate, 3, E, I, H, "mlp.experts.gate_proj.weight");
  L(l, &t->eup, 3, E, I, H, "mlp.experts.up_proj.weight");
  L(l, &t->edown, 3, E, H, I, "mlp.experts.down_proj.weight");
  if (S > 0) {
    L(l, &t->sgate, 2, S, H, 0, "mlp.shared_experts.gate_proj.weight");
    L(l, &t->sup, 2, S, H, 0, "mlp.shared_experts.up_proj.weight");
    L(l, &t->sdown, 2, H, S, 0, "mlp.shared_experts.down_proj.weight");
  }
  return RESHARD_SUCCESS;
}

_Static_assert(sizeof(rm_layer) % sizeof(int) == 0, "rm_layer holds only int tensor ids");

reshard_result_t rm_build_tensors(rm_model *m) {
  const rm_config *c = &m->c;
  m->layer = malloc((size_t)m->layers * sizeof *m->layer);
  if (!m->layer) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
  /* Every role id starts at -1: an int array view of the struct. */
  for (int l = 0; l < m->layers; l++) {
    int *ids = (int *)&m->layer[l];
    for (size_t k = 0; k < sizeof(rm_layer) / sizeof(int); k++) ids[k] = -1;
  }
  m->lm_head = -1;
  RS_CHECK(add(m, &m->embed, 2, c->vocab, c->hidden, 0, "model.embed_tokens.weight"));
  for (int l = 0; l < m->layers; l++) {
    rm_layer *t = &m->layer[l];
    L(l, &t->ln1, 1, c->hidden, 0, 0, "input_layernorm.weight");
    RS_CHECK(c->mla ? mla_attention(m, l, t) : gqa_attention(m, l, t));
    L(l, &t->ln2, 1, c->hidden, 0, 0, "post_attention_layernorm.weight");
    RS_CHECK(rm_layer_is_moe(c, l) ? moe_mlp(m, l, t) : dense_mlp(m, l, t));
  }
  RS_CHECK(add(m, &m->norm, 1, c->hidden, 0, 0, "model.norm.weight"));
  if (!c->tied) RS_CHECK(add(m, &m->lm_head, 2, c->vocab, c->hidden, 0, "lm_head.weight"));
  return RESHARD_SUCCESS;
}
