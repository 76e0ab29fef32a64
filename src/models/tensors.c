/* The logical tensors of each architecture family, with their HF names
 * (see models.h for the naming of stacked and per-expert experts and of
 * block scales). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "models_internal.h"

/* Appends one tensor named `name`; count_params: it counts towards the
 * model's parameters (block scales do not). */
static reshard_result_t push_tensor(rm_model *m, int *id, int ndim, const int64_t *dims, const char *name,
                                    reshard_dtype_t dtype, int count_params) {
  if (m->ntensors == m->cap_tensors) {
    if (m->cap_tensors > (1 << 28))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': more than 2^28 tensors", m->path);
    int cap = m->cap_tensors ? 2 * m->cap_tensors : 64;
    rm_tensor *t = realloc(m->tensors, (size_t)cap * sizeof *t);
    if (!t) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
    m->tensors = t;
    m->cap_tensors = cap;
  }
  rm_tensor *t = &m->tensors[m->ntensors];
  memset(t, 0, sizeof *t);
  t->scale = -1;
  t->dtype = dtype;
  if (!(t->name = strdup(name))) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
  m->ntensors++; /* owned from here on: rm_model_free frees the name */
  t->ndim = ndim;
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    t->shape[d] = dims[d];
    if (__builtin_mul_overflow(count, dims[d], &count))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': tensor '%s' has more than 2^63 elements", m->path,
                      name);
  }
  if (count_params && __builtin_add_overflow(m->params, count, &m->params))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': more than 2^63 parameters", m->path);
  *id = m->ntensors - 1;
  return RESHARD_SUCCESS;
}

static int listed(const rm_model *m, const char *module) {
  for (int i = 0; i < m->nskip; i++)
    if (!strcmp(m->skip[i], module)) return 1;
  return 0;
}

/* The fused vLLM layer that serves projection `proj` (HF's name) of this
 * model, with its shards, and whether the model class lists it in
 * packed_modules_mapping (mapped: is_layer_skipped then reads the shards'
 * names too). NULL when vLLM builds the projection as its own layer. */
static const char *fused_layer(const rm_model *m, const char *proj, const char *const **shards, int *n, int *mapped) {
  static const char *const qkv[3] = {"q_proj", "k_proj", "v_proj"}, *const gate_up[2] = {"gate_proj", "up_proj"},
                           *const qkv_a[2] = {"q_a_proj", "kv_a_proj_with_mqa"};
  const rm_config *c = &m->c;
  *mapped = 1;
  if (!c->mla && (!strcmp(proj, "q_proj") || !strcmp(proj, "k_proj") || !strcmp(proj, "v_proj"))) {
    *shards = qkv, *n = 3;
    return "qkv_proj"; /* llama.py, qwen2.py, qwen3.py, qwen3_moe.py, mixtral.py: qkv_proj */
  }
  if (c->mla && c->q_lora && (!strcmp(proj, "q_a_proj") || !strcmp(proj, "kv_a_proj_with_mqa"))) {
    *shards = qkv_a, *n = 2;
    return "fused_qkv_a_proj"; /* deepseek_v2.py: fused_qkv_a_proj when q_lora_rank is set */
  }
  if (!strcmp(proj, "gate_proj") || !strcmp(proj, "up_proj")) {
    *shards = gate_up, *n = 2;
    /* qwen3_moe.py Qwen3MoeForCausalLM.__init__ maps gate_up_proj only
     * when mlp_only_layers is non-empty, although decoder_sparse_step can
     * make dense layers without it */
    if (c->arch == RM_ARCH_QWEN3_MOE) {
      *mapped = 0;
      for (int64_t l = 0; c->dense_only && l < c->layers; l++) *mapped |= c->dense_only[l] != 0;
    }
    return "gate_up_proj"; /* every dense MLP and DeepSeek's shared experts */
  }
  return NULL;
}

/* Whether an fp8 checkpoint keeps the linear weight `name` (HF's) in the
 * model's dtype: vLLM's rule, quantization/utils/quant_utils.py
 * is_layer_skipped in the exact match mode Fp8Config sets, applied to the
 * layer vLLM builds (quantization/fp8.py Fp8Config.get_quant_method):
 *   - routed experts: one FusedMoE layer per MoE block, prefix
 *     <block>.experts (per-expert names included);
 *   - a fused layer (qkv_proj, gate_up_proj, fused_qkv_a_proj): skipped when
 *     its own name is listed or, where the class maps its shards, when all
 *     of them are; some but not all is an error in vLLM and here;
 *   - any other layer: its own name. */
static reshard_result_t quant_skipped(const rm_model *m, const char *name, int *skip) {
  char module[256], probe[300];
  *skip = 0;
  if (!m->nskip) return RESHARD_SUCCESS;
  snprintf(module, sizeof module, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
  const char *ex = strstr(module, ".experts.");
  if (ex) {
    snprintf(probe, sizeof probe, "%.*s", (int)(ex - module) + (int)strlen(".experts"), module);
    *skip = listed(m, probe);
    return RESHARD_SUCCESS;
  }
  const char *dot = strrchr(module, '.');
  const char *const *shards;
  int n, mapped;
  const char *fused = dot ? fused_layer(m, dot + 1, &shards, &n, &mapped) : NULL;
  if (!fused) {
    *skip = listed(m, module);
    return RESHARD_SUCCESS;
  }
  const int plen = (int)(dot - module);
  snprintf(probe, sizeof probe, "%.*s.%s", plen, module, fused);
  if ((*skip = listed(m, probe)) || !mapped) return RESHARD_SUCCESS;
  int first = -1;
  for (int k = 0; k < n; k++) {
    snprintf(probe, sizeof probe, "%.*s.%s", plen, module, shards[k]);
    int l = listed(m, probe);
    if (first >= 0 && l != first)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "config '%s': quantization_config's ignored_layers (or modules_to_not_convert) lists "
                      "'%.*s.%s' but not '%.*s.%s': vLLM serves them in one layer '%.*s.%s' and refuses to quantize "
                      "part of it (quant_utils.py is_layer_skipped)",
                      m->path, plen, module, shards[l ? k : 0], plen, module, shards[l ? 0 : k], plen, module, fused);
    first = l;
  }
  *skip = first;
  return RESHARD_SUCCESS;
}

/* A quantized weight (quant) of a model with block scales is fp8_e4m3 and
 * is followed by its weight_scale_inv, unless the checkpoint keeps its
 * module unquantized (quant_skipped). */
static reshard_result_t add_tensor(rm_model *m, int *id, int quant, int ndim, int64_t a, int64_t b, int64_t c,
                                   const char *name) {
  const int64_t dims[3] = {a, b, c};
  quant = quant && m->block_scales && ndim >= 2;
  if (quant) {
    int skip;
    RS_CHECK(quant_skipped(m, name, &skip));
    quant = !skip;
  }
  RS_CHECK(push_tensor(m, id, ndim, dims, name, quant ? RESHARD_FP8_E4M3 : m->dtype, 1));
  if (!quant) return RESHARD_SUCCESS;
  /* weight_scale_inv: one fp32 per [bn, bk] block of the last two dims */
  char sname[300];
  size_t n = strlen(name);
  const char *suffix = ".weight";
  size_t sl = strlen(suffix);
  if (n < sl || strcmp(name + n - sl, suffix))
    return rs_error(RESHARD_ERROR_INTERNAL, "config '%s': quantized tensor '%s' does not end in .weight", m->path, name);
  snprintf(sname, sizeof sname, "%.*s.weight_scale_inv", (int)(n - sl), name);
  int64_t sd[3] = {a, b, c};
  sd[ndim - 2] = (sd[ndim - 2] + m->c.block[0] - 1) / m->c.block[0];
  sd[ndim - 1] = (sd[ndim - 1] + m->c.block[1] - 1) / m->c.block[1];
  int sid;
  int wid = *id;
  RS_CHECK(push_tensor(m, &sid, ndim, sd, sname, RESHARD_FP32, 0));
  m->tensors[wid].scale = sid;
  return RESHARD_SUCCESS;
}

static reshard_result_t addf(rm_model *m, int *id, int quant, int ndim, int64_t a, int64_t b, int64_t c,
                             const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static reshard_result_t addf(rm_model *m, int *id, int quant, int ndim, int64_t a, int64_t b, int64_t c,
                             const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  return add_tensor(m, id, quant, ndim, a, b, c, name);
}

#define add(m, id, nd, a, b, c, ...) addf(m, id, 0, nd, a, b, c, __VA_ARGS__)

#define L(l, id, nd, a, b, c, suffix) RS_CHECK(addf(m, id, 0, nd, a, b, c, "model.layers.%d." suffix, l))
/* a linear weight: quantized in fp8 checkpoints */
#define Q(l, id, nd, a, b, c, suffix) RS_CHECK(addf(m, id, 1, nd, a, b, c, "model.layers.%d." suffix, l))

/* Llama-style attention with grouped KV heads (llama, mistral, qwen2,
 * qwen3, qwen3_moe, mixtral). */
static reshard_result_t gqa_attention(rm_model *m, int l, rm_layer *t) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
  Q(l, &t->q, 2, q, H, 0, "self_attn.q_proj.weight");
  if (c->qkv_bias) L(l, &t->q_bias, 1, q, 0, 0, "self_attn.q_proj.bias");
  Q(l, &t->k, 2, kv, H, 0, "self_attn.k_proj.weight");
  if (c->qkv_bias) L(l, &t->k_bias, 1, kv, 0, 0, "self_attn.k_proj.bias");
  Q(l, &t->v, 2, kv, H, 0, "self_attn.v_proj.weight");
  if (c->qkv_bias) L(l, &t->v_bias, 1, kv, 0, 0, "self_attn.v_proj.bias");
  Q(l, &t->o, 2, H, q, 0, "self_attn.o_proj.weight");
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
    Q(l, &t->q_a, 2, c->q_lora, H, 0, "self_attn.q_a_proj.weight");
    L(l, &t->q_a_norm, 1, c->q_lora, 0, 0, "self_attn.q_a_layernorm.weight");
    Q(l, &t->q_b, 2, qk, c->q_lora, 0, "self_attn.q_b_proj.weight");
  } else {
    Q(l, &t->q, 2, qk, H, 0, "self_attn.q_proj.weight");
  }
  Q(l, &t->kv_a, 2, c->kv_lora + c->qk_rope, H, 0, "self_attn.kv_a_proj_with_mqa.weight");
  L(l, &t->kv_a_norm, 1, c->kv_lora, 0, 0, "self_attn.kv_a_layernorm.weight");
  Q(l, &t->kv_b, 2, c->heads * (c->qk_nope + c->v_head), c->kv_lora, 0, "self_attn.kv_b_proj.weight");
  Q(l, &t->o, 2, H, c->heads * c->v_head, 0, "self_attn.o_proj.weight");
  return RESHARD_SUCCESS;
}

static reshard_result_t dense_mlp(rm_model *m, int l, rm_layer *t) {
  const int64_t H = m->c.hidden, I = m->c.intermediate;
  Q(l, &t->gate, 2, I, H, 0, "mlp.gate_proj.weight");
  Q(l, &t->up, 2, I, H, 0, "mlp.up_proj.weight");
  Q(l, &t->down, 2, H, I, 0, "mlp.down_proj.weight");
  return RESHARD_SUCCESS;
}

/* Routed experts: stacked [E, ...] tensors, or one tensor per expert and
 * projection in per-expert mode (the checkpoint's own tensors). */
static reshard_result_t routed_experts(rm_model *m, int l, rm_layer *t, const char *prefix, const char *const names[3]) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, E = c->experts, I = c->moe_intermediate;
  if (!m->per_expert) {
    RS_CHECK(addf(m, &t->egate, 1, 3, E, I, H, "model.layers.%d.%s.experts.%s.weight", l, prefix, names[0]));
    RS_CHECK(addf(m, &t->eup, 1, 3, E, I, H, "model.layers.%d.%s.experts.%s.weight", l, prefix, names[1]));
    RS_CHECK(addf(m, &t->edown, 1, 3, E, H, I, "model.layers.%d.%s.experts.%s.weight", l, prefix, names[2]));
    return RESHARD_SUCCESS;
  }
  int *ids = &m->experts[(size_t)l * (size_t)E * 3];
  for (int64_t e = 0; e < E; e++) {
    RS_CHECK(addf(m, &ids[e * 3 + 0], 1, 2, I, H, 0, "model.layers.%d.%s.experts.%lld.%s.weight", l, prefix,
                  (long long)e, names[0]));
    RS_CHECK(addf(m, &ids[e * 3 + 1], 1, 2, I, H, 0, "model.layers.%d.%s.experts.%lld.%s.weight", l, prefix,
                  (long long)e, names[1]));
    RS_CHECK(addf(m, &ids[e * 3 + 2], 1, 2, H, I, 0, "model.layers.%d.%s.experts.%lld.%s.weight", l, prefix,
                  (long long)e, names[2]));
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t moe_mlp(rm_model *m, int l, rm_layer *t) {
  const rm_config *c = &m->c;
  const int64_t H = c->hidden, E = c->experts, S = c->shared_intermediate;
  if (c->arch == RM_ARCH_MIXTRAL) {
    /* The checkpoint's block_sparse_moe.experts.<e>.w1 (gate), w3 (up) and
     * w2 (down). */
    static const char *const w[3] = {"w1", "w3", "w2"};
    L(l, &t->router, 2, E, H, 0, "block_sparse_moe.gate.weight");
    return routed_experts(m, l, t, "block_sparse_moe", w);
  }
  static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
  /* Qwen3-MoE's router takes the quant config (qwen3_moe.py
   * Qwen3MoeSparseMoeBlock.__init__: GateLinear(..., quant_config=...)):
   * fp8 unless the checkpoint lists it; DeepSeek's and Mixtral's get none
   * (deepseek_v2.py DeepseekV2MoE, mixtral.py MixtralMoE) */
  RS_CHECK(addf(m, &t->router, c->arch == RM_ARCH_QWEN3_MOE, 2, E, H, 0, "model.layers.%d.mlp.gate.weight", l));
  /* fp32 whatever the model's dtype: the checkpoint's, vLLM's
   * (DeepseekV2MoE: nn.Parameter(torch.empty(n_routed_experts,
   * dtype=torch.float32))) and Megatron-core's (TopKRouter.expert_bias,
   * torch.float32). Under aux-loss-free balancing it changes every step. */
  if (c->router_bias) {
    const int64_t dims[1] = {E};
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
    RS_CHECK(push_tensor(m, &t->router_bias, 1, dims, name, RESHARD_FP32, 1));
  }
  RS_CHECK(routed_experts(m, l, t, "mlp", proj));
  if (S > 0) {
    Q(l, &t->sgate, 2, S, H, 0, "mlp.shared_experts.gate_proj.weight");
    Q(l, &t->sup, 2, S, H, 0, "mlp.shared_experts.up_proj.weight");
    Q(l, &t->sdown, 2, H, S, 0, "mlp.shared_experts.down_proj.weight");
  }
  return RESHARD_SUCCESS;
}

/* Sets bits on tensor id (when there is one) and on its block scales. */
static void tag(rm_model *m, int id, unsigned char bits) {
  if (id < 0) return;
  m->role[id] |= bits;
  if (m->tensors[id].scale >= 0) m->role[m->tensors[id].scale] |= bits | RM_ROLE_FP8;
}

static reshard_result_t tag_roles(rm_model *m) {
  m->role = calloc((size_t)m->ntensors + 1, 1);
  if (!m->role) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
  for (int i = 0; i < m->ntensors; i++)
    if (m->tensors[i].dtype == RESHARD_FP8_E4M3 || m->tensors[i].scale >= 0) tag(m, i, RM_ROLE_FP8);
  for (int l = 0; l < m->layers; l++) {
    const rm_layer *t = &m->layer[l];
    tag(m, t->kv_b, RM_ROLE_KV_B);
    tag(m, t->egate, RM_ROLE_EXPERT);
    tag(m, t->eup, RM_ROLE_EXPERT);
    tag(m, t->edown, RM_ROLE_EXPERT);
    for (int64_t e = 0; m->experts && e < m->c.experts; e++)
      for (int k = 0; k < 3; k++) tag(m, rm_expert(m, l, (int)e, k), RM_ROLE_EXPERT);
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
  if (m->per_expert && c->experts > 0) {
    size_t n = (size_t)m->layers * (size_t)c->experts * 3;
    m->experts = malloc(n * sizeof *m->experts);
    if (!m->experts) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", m->path);
    for (size_t i = 0; i < n; i++) m->experts[i] = -1;
  }
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
  return tag_roles(m);
}
