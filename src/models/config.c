/* config.json -> rm_config, and the rm_model life cycle.
 *
 * JSON library: jansson (Debian libjansson-dev). Chosen over cJSON because
 * it reports the line, column and reason of a syntax error (our messages
 * name them), keeps JSON integers as 64-bit json_int_t distinct from reals
 * (a vocabulary or a 1T-parameter count never goes through a double), can
 * reject duplicate keys while parsing, and ships a pkg-config file that
 * CMake finds with pkg_check_modules like cmocka. cJSON stores every number
 * as a double and reports only a pointer into the text on errors. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "models_internal.h"

/* Dims above this are certainly a typo, and keeping every size below 2^31
 * lets products of two or three of them stay exact in int64. */
#define RM_DIM_MAX ((int64_t)INT32_MAX)

static const struct {
  const char *cls;  /* "architectures"[0] */
  const char *type; /* "model_type" */
} arch_names[RM_NUM_ARCHS] = {
    [RM_ARCH_LLAMA] = {"LlamaForCausalLM", "llama"},
    [RM_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral"},
    [RM_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
    [RM_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
    [RM_ARCH_QWEN3_MOE] = {"Qwen3MoeForCausalLM", "qwen3_moe"},
    [RM_ARCH_MIXTRAL] = {"MixtralForCausalLM", "mixtral"},
    [RM_ARCH_DEEPSEEK_V3] = {"DeepseekV3ForCausalLM", "deepseek_v3"},
};

#define SUPPORTED "llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3 (kimi_k2)"

const char *rm_arch_name(rm_arch arch) {
  return arch >= 0 && arch < RM_NUM_ARCHS ? arch_names[arch].type : "invalid";
}

int rm_layer_is_moe(const rm_config *c, int layer) {
  if (c->experts == 0) return 0;
  if (c->dense_only && c->dense_only[layer]) return 0;
  if (layer < c->first_dense) return 0;
  /* deepseek: layer % moe_layer_freq == 0; qwen3_moe: (layer + 1) %
   * decoder_sparse_step == 0. Both are 1 in every shipped model. */
  if (c->arch == RM_ARCH_DEEPSEEK_V3) return layer % c->moe_freq == 0;
  return (layer + 1) % c->moe_freq == 0;
}

/* ---------------- typed key reading ---------------- */

typedef struct jcfg {
  const char *path;
  json_t *root;
} jcfg;

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "unknown";
}

/* An integer key in [min, RM_DIM_MAX]. Absent or null: *out = dflt when
 * !required, else a "missing key" error naming the file and the key. */
static reshard_result_t get_int(const jcfg *j, const char *key, int required, int64_t dflt, int64_t min,
                                int64_t *out) {
  json_t *v = json_object_get(j->root, key);
  if (!v || json_is_null(v)) {
    if (required)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': missing key '%s'%s", j->path, key,
                      v ? " (it is null)" : "");
    *out = dflt;
    return RESHARD_SUCCESS;
  }
  if (!json_is_integer(v))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key '%s' must be an integer, found %s", j->path,
                    key, json_kind(v));
  json_int_t x = json_integer_value(v);
  if (x < min || x > RM_DIM_MAX)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key '%s' = %lld is outside [%lld, %lld]", j->path,
                    key, (long long)x, (long long)min, (long long)RM_DIM_MAX);
  *out = (int64_t)x;
  return RESHARD_SUCCESS;
}

static reshard_result_t get_bool(const jcfg *j, const char *key, int dflt, int *out) {
  json_t *v = json_object_get(j->root, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return RESHARD_SUCCESS;
  }
  if (!json_is_boolean(v))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key '%s' must be true or false, found %s",
                    j->path, key, json_kind(v));
  *out = json_is_true(v);
  return RESHARD_SUCCESS;
}

/* NULL when absent or null. */
static reshard_result_t get_string(const jcfg *j, const char *key, const char **out) {
  json_t *v = json_object_get(j->root, key);
  *out = NULL;
  if (!v || json_is_null(v)) return RESHARD_SUCCESS;
  if (!json_is_string(v))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key '%s' must be a string, found %s", j->path, key,
                    json_kind(v));
  *out = json_string_value(v);
  return RESHARD_SUCCESS;
}

static reshard_result_t find_arch(const jcfg *j, rm_arch *out) {
  json_t *archs = json_object_get(j->root, "architectures");
  const char *cls = NULL, *type = NULL;
  if (archs && !json_is_null(archs)) {
    if (!json_is_array(archs) || json_array_size(archs) < 1 || !json_is_string(json_array_get(archs, 0)))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "config '%s': key 'architectures' must be a non-empty array of class names, found %s%s", j->path,
                      !json_is_array(archs)           ? json_kind(archs)
                      : json_array_size(archs) < 1    ? "an empty array"
                                                      : "an array whose first entry is ",
                      json_is_array(archs) && json_array_size(archs) >= 1 ? json_kind(json_array_get(archs, 0)) : "");
    cls = json_string_value(json_array_get(archs, 0));
  }
  RS_CHECK(get_string(j, "model_type", &type));
  if (!cls && !type)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': missing key 'architectures' (and 'model_type')",
                    j->path);
  for (int a = 0; a < RM_NUM_ARCHS; a++) {
    if (cls && !strcmp(cls, arch_names[a].cls)) {
      *out = (rm_arch)a;
      return RESHARD_SUCCESS;
    }
  }
  for (int a = 0; a < RM_NUM_ARCHS; a++) {
    if (type && !strcmp(type, arch_names[a].type)) {
      *out = (rm_arch)a;
      return RESHARD_SUCCESS;
    }
  }
  /* Kimi K2 ships as model_type "kimi_k2" with the DeepSeek-V3 classes. */
  if (type && !strcmp(type, "kimi_k2")) {
    *out = RM_ARCH_DEEPSEEK_V3;
    return RESHARD_SUCCESS;
  }
  return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                  "config '%s': unknown architecture '%s' (model_type '%s'); supported: " SUPPORTED, j->path,
                  cls ? cls : "", type ? type : "");
}

static reshard_result_t unsupported_if(const jcfg *j, const char *key, const char *why) {
  int on = 0;
  RS_CHECK(get_bool(j, key, 0, &on));
  if (on)
    return rs_error(RESHARD_ERROR_UNSUPPORTED, "config '%s': key '%s' = true is not supported (%s)", j->path, key,
                    why);
  return RESHARD_SUCCESS;
}

static reshard_result_t read_mla(const jcfg *j, rm_config *c) {
  c->mla = 1;
  RS_CHECK(get_int(j, "q_lora_rank", 0, 0, 1, &c->q_lora)); /* null: plain q_proj */
  RS_CHECK(get_int(j, "kv_lora_rank", 1, 0, 1, &c->kv_lora));
  RS_CHECK(get_int(j, "qk_nope_head_dim", 1, 0, 1, &c->qk_nope));
  RS_CHECK(get_int(j, "qk_rope_head_dim", 1, 0, 1, &c->qk_rope));
  RS_CHECK(get_int(j, "v_head_dim", 1, 0, 1, &c->v_head));
  RS_CHECK(unsupported_if(j, "attention_bias", "MLA projections have no bias in DeepSeek-V3"));
  int64_t shared = 0;
  RS_CHECK(get_int(j, "n_routed_experts", 0, 0, 1, &c->experts));
  if (c->experts > 0) {
    RS_CHECK(get_int(j, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate));
    RS_CHECK(get_int(j, "n_shared_experts", 0, 0, 0, &shared));
    RS_CHECK(get_int(j, "first_k_dense_replace", 0, 0, 0, &c->first_dense));
    RS_CHECK(get_int(j, "moe_layer_freq", 0, 1, 1, &c->moe_freq));
    c->shared_intermediate = shared * c->moe_intermediate;
    /* HF's DeepseekV3TopkRouter always has the bias; vLLM creates it for
     * topk_method "noaux_tc", the method of every DeepSeek-V3 checkpoint. */
    const char *topk = NULL;
    RS_CHECK(get_string(j, "topk_method", &topk));
    c->router_bias = !topk || !strcmp(topk, "noaux_tc");
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t read_config(const jcfg *j, rm_config *c) {
  RS_CHECK(find_arch(j, &c->arch));
  RS_CHECK(get_int(j, "vocab_size", 1, 0, 1, &c->vocab));
  RS_CHECK(get_int(j, "hidden_size", 1, 0, 1, &c->hidden));
  RS_CHECK(get_int(j, "num_hidden_layers", 1, 0, 1, &c->layers));
  RS_CHECK(get_int(j, "num_attention_heads", 1, 0, 1, &c->heads));
  RS_CHECK(get_int(j, "num_key_value_heads", 0, c->heads, 1, &c->kv_heads));
  RS_CHECK(get_bool(j, "tie_word_embeddings", 0, &c->tied));
  c->intermediate = -1;
  c->moe_freq = 1;
  if (c->arch == RM_ARCH_DEEPSEEK_V3) {
    RS_CHECK(read_mla(j, c));
    /* Dense layers: the first_k_dense_replace prefix, or all of them. */
    int dense = c->experts == 0 || c->first_dense > 0 || c->moe_freq > 1;
    if (dense) RS_CHECK(get_int(j, "intermediate_size", 1, 0, 1, &c->intermediate));
    return RESHARD_SUCCESS;
  }
  if (c->heads % c->kv_heads)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "config '%s': num_attention_heads %lld is not a multiple of num_key_value_heads %lld", j->path,
                    (long long)c->heads, (long long)c->kv_heads);
  /* Qwen3 and Llama 3.2 say head_dim; older configs imply hidden / heads. */
  int64_t dflt_hd = c->hidden / c->heads;
  RS_CHECK(get_int(j, "head_dim", 0, dflt_hd, 1, &c->head_dim));
  if (c->head_dim < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': hidden_size %lld < num_attention_heads %lld and no head_dim",
                    j->path, (long long)c->hidden, (long long)c->heads);
  int attention_bias = 0;
  switch (c->arch) {
    case RM_ARCH_QWEN2:
      c->qkv_bias = 1; /* Qwen2Attention: q/k/v bias always, o never */
      break;
    case RM_ARCH_QWEN3:
    case RM_ARCH_QWEN3_MOE:
      /* vLLM's Qwen3Attention (vllm/model_executor/models/qwen3.py) builds
       * qkv_proj with bias=attention_bias and o_proj with bias=False, so
       * neither side holds an o_proj.bias, whatever the config says. */
      c->qk_norm = 1;
      RS_CHECK(get_bool(j, "attention_bias", 0, &attention_bias));
      c->qkv_bias = attention_bias;
      break;
    case RM_ARCH_LLAMA:
      RS_CHECK(get_bool(j, "attention_bias", 0, &attention_bias));
      c->qkv_bias = c->o_bias = attention_bias;
      break;
    default: /* mistral, mixtral: no attention bias */
      break;
  }
  if (c->arch == RM_ARCH_LLAMA) RS_CHECK(unsupported_if(j, "mlp_bias", "no shipped Llama uses MLP biases"));
  if (c->arch == RM_ARCH_MIXTRAL) {
    RS_CHECK(get_int(j, "num_local_experts", 1, 0, 1, &c->experts));
    RS_CHECK(get_int(j, "intermediate_size", 1, 0, 1, &c->moe_intermediate));
    return RESHARD_SUCCESS;
  }
  if (c->arch == RM_ARCH_QWEN3_MOE) {
    RS_CHECK(get_int(j, "num_experts", 1, 0, 0, &c->experts));
    RS_CHECK(get_int(j, "decoder_sparse_step", 0, 1, 1, &c->moe_freq));
    if (c->experts > 0) RS_CHECK(get_int(j, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate));
    json_t *only = json_object_get(j->root, "mlp_only_layers");
    int dense = c->experts == 0 || c->moe_freq > 1;
    if (only && !json_is_null(only)) {
      if (!json_is_array(only))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key 'mlp_only_layers' must be an array, found %s",
                        j->path, json_kind(only));
      if (json_array_size(only) > 0) {
        c->dense_only = calloc((size_t)c->layers, 1);
        if (!c->dense_only) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", j->path);
      }
      for (size_t i = 0; i < json_array_size(only); i++) {
        json_t *v = json_array_get(only, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->layers)
          return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                          "config '%s': key 'mlp_only_layers' entry %zu must be a layer index in [0, %lld)", j->path,
                          i, (long long)c->layers);
        c->dense_only[json_integer_value(v)] = 1;
        dense = 1;
      }
    }
    if (dense) RS_CHECK(get_int(j, "intermediate_size", 1, 0, 1, &c->intermediate));
    return RESHARD_SUCCESS;
  }
  return get_int(j, "intermediate_size", 1, 0, 1, &c->intermediate);
}

/* ---------------- rm_model ---------------- */

/* quantization_config.weight_block_size: [bn, bk] positive integers. */
static reshard_result_t read_block_size(const jcfg *j, rm_config *c) {
  json_t *q = json_object_get(j->root, "quantization_config");
  json_t *b = q && json_is_object(q) ? json_object_get(q, "weight_block_size") : NULL;
  if (!b)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "config '%s': block scales need key 'quantization_config.weight_block_size' ([out, in] block of "
                    "the fp8 checkpoint), which is missing",
                    j->path);
  if (!json_is_array(b) || json_array_size(b) != 2)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "config '%s': key 'quantization_config.weight_block_size' must be an array of 2 integers", j->path);
  for (int i = 0; i < 2; i++) {
    json_t *v = json_array_get(b, (size_t)i);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > RM_DIM_MAX)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "config '%s': key 'quantization_config.weight_block_size' entry %d must be a positive integer",
                      j->path, i);
    c->block[i] = json_integer_value(v);
  }
  return RESHARD_SUCCESS;
}

/* The modules an fp8 checkpoint keeps unquantized, as vLLM reads them
 * (quantization/fp8.py Fp8Config.from_config): quantization_config's
 * ignored_layers, or modules_to_not_convert when that is absent or empty.
 * Names are vLLM module prefixes; for the families here they are HF's
 * (the models' hf_to_vllm_mapper renames nothing: get_rename_mapper drops
 * the stacked q/k/v and gate/up entries). */
static reshard_result_t read_skipped(const jcfg *j, rm_model *m) {
  json_t *q = json_object_get(j->root, "quantization_config");
  if (!q || !json_is_object(q)) return RESHARD_SUCCESS;
  static const char *const keys[2] = {"ignored_layers", "modules_to_not_convert"};
  for (int k = 0; k < 2; k++) {
    json_t *a = json_object_get(q, keys[k]);
    if (!a || json_is_null(a)) continue;
    if (!json_is_array(a))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "config '%s': key 'quantization_config.%s' must be an array of module names, found %s", j->path,
                      keys[k], json_kind(a));
    size_t n = json_array_size(a);
    if (n == 0) continue;
    if (n > (1u << 24))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': key 'quantization_config.%s' has %zu entries",
                      j->path, keys[k], n);
    if (!(m->skip = calloc(n, sizeof *m->skip)))
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", j->path);
    for (size_t i = 0; i < n; i++) {
      json_t *v = json_array_get(a, i);
      if (!json_is_string(v))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                        "config '%s': key 'quantization_config.%s' entry %zu must be a string, found %s", j->path,
                        keys[k], i, json_kind(v));
      if (!(m->skip[i] = strdup(json_string_value(v))))
        return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", j->path);
      m->nskip = (int)i + 1;
    }
    return RESHARD_SUCCESS;
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rm_model_load(const char *config_path, int layers, reshard_dtype_t dtype, rm_model **out) {
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.layers = layers;
  o.dtype = dtype;
  return rm_model_load_ex(config_path, &o, out);
}

reshard_result_t rm_model_load_ex(const char *config_path, const rm_model_options *opts, rm_model **out) {
  rs_error_clear();
  if (!config_path || !opts || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "rm_model_load: NULL argument");
  *out = NULL;
  const int layers = opts->layers;
  const reshard_dtype_t dtype = opts->dtype;
  if (reshard_dtype_size(dtype) == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': invalid dtype %d", config_path, (int)dtype);
  if (layers < 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': layers %d must be >= 0 (0: all)", config_path,
                    layers);
  json_error_t jerr;
  json_t *root = json_load_file(config_path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    /* jansson reports line -1 when the file could not be read at all. */
    if (jerr.line < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': cannot read: %s", config_path, jerr.text);
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': malformed JSON at line %d column %d: %s",
                    config_path, jerr.line, jerr.column, jerr.text);
  }
  reshard_result_t r = RESHARD_SUCCESS;
  rm_model *m = calloc(1, sizeof *m);
  if (!m || !(m->path = strdup(config_path))) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "config '%s': out of memory", config_path);
    goto fail;
  }
  jcfg j = {config_path, root};
  if (!json_is_object(root)) {
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': the top level must be an object, found %s",
                 config_path, json_kind(root));
    goto fail;
  }
  RS_CHECK_GOTO(read_config(&j, &m->c), r, fail);
  if (opts->block_scales && opts->block[0] > 0 && opts->block[1] > 0) {
    m->c.block[0] = opts->block[0];
    m->c.block[1] = opts->block[1];
  } else if (opts->block_scales) {
    RS_CHECK_GOTO(read_block_size(&j, &m->c), r, fail);
  }
  if (opts->block_scales) RS_CHECK_GOTO(read_skipped(&j, m), r, fail);
  if (layers > m->c.layers) {
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "config '%s': layers %d exceeds num_hidden_layers %lld",
                 config_path, layers, (long long)m->c.layers);
    goto fail;
  }
  m->layers = layers ? layers : (int)m->c.layers;
  m->dtype = dtype;
  m->per_expert = opts->per_expert != 0;
  m->block_scales = opts->block_scales != 0;
  RS_CHECK_GOTO(rm_build_tensors(m), r, fail);
  json_decref(root);
  *out = m;
  return RESHARD_SUCCESS;
fail:
  json_decref(root);
  rm_model_free(m);
  return r;
}

void rm_model_free(rm_model *m) {
  if (!m) return;
  for (int i = 0; i < m->ntensors; i++) free((char *)m->tensors[i].name);
  free(m->tensors);
  free(m->layer);
  free(m->experts);
  free(m->role);
  free(m->c.dense_only);
  for (int i = 0; i < m->nskip; i++) free(m->skip[i]);
  free(m->skip);
  free(m->path);
  free(m);
}

const char *rm_model_arch(const rm_model *m) { return m ? rm_arch_name(m->c.arch) : "invalid"; }
int rm_model_layers(const rm_model *m) { return m ? m->layers : 0; }
int rm_model_num_tensors(const rm_model *m) { return m ? m->ntensors : 0; }
int64_t rm_model_num_params(const rm_model *m) { return m ? m->params : 0; }
int rm_model_per_expert(const rm_model *m) { return m ? m->per_expert : 0; }
int rm_model_block_scales(const rm_model *m) { return m ? m->block_scales : 0; }
reshard_dtype_t rm_model_dtype(const rm_model *m) { return m ? m->dtype : RESHARD_NUM_DTYPES; }
int rm_model_num_experts(const rm_model *m) { return m ? (int)m->c.experts : 0; }
const char *rm_model_path(const rm_model *m) { return m ? m->path : ""; }

const rm_tensor *rm_model_tensor(const rm_model *m, int i) {
  return m && i >= 0 && i < m->ntensors ? &m->tensors[i] : NULL;
}
