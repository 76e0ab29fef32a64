/* The model front-end (src/models): config.json parsing, logical tensors
 * and parameter totals of the shipped public configs, parallel settings,
 * the frameworks' in-memory arrangements, and byte-exact Megatron -> vLLM
 * reshards of small synthetic models of every architecture. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout/layout.h"
#include "reshard_models.h"
#include "reshard.h"
#include "support/harness.h"

#ifndef RESHARD_CONFIG_DIR
#error "RESHARD_CONFIG_DIR must name the shipped configs/ directory"
#endif

/* ---------------------------------------------------------------- helpers */

static char tmpdir[64];
static char written[64][128];
static int nwritten;

static int setup_tmpdir(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/reshard_models_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
  (void)state;
  for (int i = 0; i < nwritten; i++) unlink(written[i]);
  return rmdir(tmpdir);
}

/* Writes text (single quotes standing for double quotes, for legibility)
 * to tmpdir/name; returns the path (static storage, one per name). */
static const char *write_config(const char *name, const char *text) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  for (int i = 0; i < nwritten; i++)
    if (!strcmp(written[i], path)) goto write;
  assert_true(nwritten < 64);
  snprintf(written[nwritten++], sizeof written[0], "%s", path);
write:;
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (const char *c = text; *c; c++) fputc(*c == '\'' ? '"' : *c, f);
  fclose(f);
  for (int i = 0; i < nwritten; i++)
    if (!strcmp(written[i], path)) return written[i];
  return NULL;
}

static const char *shipped(const char *file) {
  static char path[16][256];
  static int next;
  char *p = path[next++ % 16];
  snprintf(p, 256, "%s/%s", RESHARD_CONFIG_DIR, file);
  return p;
}

static rm_model *load(const char *path, int layers) {
  rm_model *m = NULL;
  reshard_result_t r = rm_model_load(path, layers, RESHARD_BF16, &m);
  if (r != RESHARD_SUCCESS) print_error("rm_model_load(%s): %s\n", path, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  assert_non_null(m);
  return m;
}

static const rm_tensor *find_tensor(const rm_model *m, const char *name) {
  for (int i = 0; i < rm_model_num_tensors(m); i++)
    if (!strcmp(rm_model_tensor(m, i)->name, name)) return rm_model_tensor(m, i);
  return NULL;
}

/* Asserts the tensor exists with the given shape (ndim entries). */
static void expect_shape(const rm_model *m, const char *name, int ndim, const int64_t *shape) {
  const rm_tensor *t = find_tensor(m, name);
  if (!t) print_error("%s: no tensor '%s'\n", rm_model_path(m), name);
  assert_non_null(t);
  if (t->ndim != ndim) print_error("%s: ndim %d, expected %d\n", name, t->ndim, ndim);
  assert_int_equal(t->ndim, ndim);
  for (int d = 0; d < ndim; d++) {
    if (t->shape[d] != shape[d])
      print_error("%s: shape[%d] = %lld, expected %lld\n", name, d, (long long)t->shape[d], (long long)shape[d]);
    assert_int_equal(t->shape[d], shape[d]);
  }
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define EXPECT_SHAPE(m, name, ...) \
  expect_shape(m, name, (int)(sizeof SHAPE(__VA_ARGS__) / sizeof(int64_t)), SHAPE(__VA_ARGS__))

static rm_parallel par(const char *spec) {
  rm_parallel p;
  reshard_result_t r = rm_parse_parallel(spec, &p);
  if (r) print_error("rm_parse_parallel(%s): %s\n", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return p;
}

static reshard_layout_t *megatron(const rm_model *m, const char *spec, int first) {
  rm_parallel p = par(spec);
  reshard_layout_t *L = NULL;
  reshard_result_t r = rm_megatron_layout(m, &p, first, &L);
  if (r) print_error("megatron %s: %s\n", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return L;
}

static reshard_layout_t *vllm(const rm_model *m, const char *spec, int first) {
  rm_parallel p = par(spec);
  reshard_layout_t *L = NULL;
  reshard_result_t r = rm_vllm_layout(m, &p, first, &L);
  if (r) print_error("vllm %s: %s\n", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return L;
}

/* Every element of every tensor is held by some rank of [0, nranks): a
 * layout that forgot a tensor (or a slice of one) would still pass the
 * byte-exact checks, which only see what the destination declares. */
static void expect_full_coverage(const reshard_layout_t *L, int nranks, const char *side) {
  int nt = reshard_layout_num_tensors(L);
  unsigned char **seen = calloc((size_t)nt, sizeof *seen);
  int64_t *numel = calloc((size_t)nt, sizeof *numel);
  for (int t = 0; t < nt; t++) {
    int ndim;
    int64_t shape[RESHARD_MAX_DIMS];
    assert_int_equal(reshard_layout_tensor_info(L, t, NULL, NULL, &ndim, shape), 0);
    numel[t] = 1;
    for (int d = 0; d < ndim; d++) numel[t] *= shape[d];
    seen[t] = calloc((size_t)numel[t] + 1, 1);
  }
  for (int r = 0; r < nranks; r++) {
    size_t n;
    assert_int_equal(reshard_layout_fragments(L, r, NULL, 0, &n), 0);
    reshard_fragment_info_t *f = calloc(n ? n : 1, sizeof *f);
    assert_int_equal(reshard_layout_fragments(L, r, f, n, &n), 0);
    for (size_t i = 0; i < n; i++) {
      const rs_tensor *t = &L->tensors[f[i].tensor_id];
      int64_t idx[RESHARD_MAX_DIMS] = {0}, cnt = 1;
      for (int d = 0; d < f[i].ndim; d++) cnt *= f[i].extent[d];
      for (int64_t e = 0; e < cnt; e++) {
        int64_t lin = 0;
        for (int d = 0; d < t->ndim; d++) lin = lin * t->shape[d] + f[i].start[d] + idx[d];
        seen[f[i].tensor_id][lin] = 1;
        for (int d = f[i].ndim - 1; d >= 0; d--) {
          if (++idx[d] < f[i].extent[d]) break;
          idx[d] = 0;
        }
      }
    }
    free(f);
  }
  for (int t = 0; t < nt; t++) {
    for (int64_t e = 0; e < numel[t]; e++) {
      if (!seen[t][e]) {
        print_error("%s: element %lld of '%s' is held by no rank\n", side, (long long)e, L->tensors[t].name);
        fail();
      }
    }
    free(seen[t]);
  }
  free(seen);
  free(numel);
}

/* ------------------------------------------- published parameter totals */

typedef struct published {
  const char *file;
  const char *arch;
  int64_t expected;
  int exact; /* else within 0.5% */
} published;

/* Logical parameters of the main model (no MTP layers, no FP8 scales; tied
 * embeddings counted once), against the published totals:
 *  - exact: the bf16 checkpoint's model.safetensors.index.json total_size
 *    / 2 (Llama-3.1-70B: 141,107,412,992 bytes; Mistral-7B-v0.1:
 *    14,483,464,192; Mixtral-8x7B-v0.1: 93,405,585,408) or, for the
 *    single-file checkpoints, the Hub's safetensors parameter count
 *    (Qwen2.5-0.5B: 494,032,768, the card's "0.49B"; Llama-3.2-1B:
 *    1,235,814,400, the card's "1.23B");
 *  - 0.5%: the model cards' rounded totals: Qwen3-8B "8.2B", Qwen3-30B-A3B
 *    "30.5B", Qwen3-235B-A22B "235B", DeepSeek-V3 "671B" (main model; the
 *    card's 685B adds the 14B multi-token-prediction module), Kimi-K2
 *    "1026.5B" (the Hub's safetensors count of moonshotai/Kimi-K2-Instruct;
 *    its card rounds to "1T" and the tech report says 1.04T). */
static const published totals[] = {
    {"Qwen2.5-0.5B.json", "qwen2", 494032768LL, 1},
    {"Llama-3.2-1B.json", "llama", 1235814400LL, 1},
    {"Llama-3.1-70B.json", "llama", 70553706496LL, 1},
    {"Mistral-7B-v0.1.json", "mistral", 7241732096LL, 1},
    {"Mixtral-8x7B-v0.1.json", "mixtral", 46702792704LL, 1},
    {"Qwen3-8B.json", "qwen3", 8200000000LL, 0},
    {"Qwen3-30B-A3B.json", "qwen3_moe", 30500000000LL, 0},
    {"Qwen3-235B-A22B.json", "qwen3_moe", 235000000000LL, 0},
    {"DeepSeek-V3.json", "deepseek_v3", 671000000000LL, 0},
    {"Kimi-K2-Instruct.json", "deepseek_v3", 1026500000000LL, 0},
};

static void published_parameter_totals(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof totals / sizeof totals[0]; i++) {
    rm_model *m = load(shipped(totals[i].file), 0);
    int64_t got = rm_model_num_params(m), want = totals[i].expected;
    double rel = (double)(got - want) / (double)want;
    printf("  %-24s %-12s %16lld params, published %16lld (%+.3f%%)\n", totals[i].file, rm_model_arch(m),
           (long long)got, (long long)want, 100.0 * rel);
    assert_string_equal(rm_model_arch(m), totals[i].arch);
    if (totals[i].exact) {
      assert_int_equal(got, want);
    } else if (rel > 0.005 || rel < -0.005) {
      print_error("%s: %lld parameters, more than 0.5%% off the published %lld\n", totals[i].file, (long long)got,
                  (long long)want);
      fail();
    }
    /* The tensors' shapes add up to the total. */
    int64_t sum = 0;
    for (int t = 0; t < rm_model_num_tensors(m); t++) {
      int64_t c = 1;
      for (int d = 0; d < rm_model_tensor(m, t)->ndim; d++) c *= rm_model_tensor(m, t)->shape[d];
      sum += c;
    }
    assert_int_equal(sum, got);
    rm_model_free(m);
  }
}

/* The cards' non-embedding figures pin the split between embeddings and
 * layers too: Qwen3-8B 6.95B, Qwen3-30B-A3B 29.9B, Qwen3-235B-A22B 234B. */
static void published_non_embedding_totals(void **state) {
  (void)state;
  const struct {
    const char *file;
    int64_t expected;
  } ne[] = {{"Qwen3-8B.json", 6950000000LL}, {"Qwen3-30B-A3B.json", 29900000000LL}, {"Qwen3-235B-A22B.json", 234000000000LL}};
  for (size_t i = 0; i < sizeof ne / sizeof ne[0]; i++) {
    rm_model *m = load(shipped(ne[i].file), 0);
    int64_t emb = 2 * 151936LL * find_tensor(m, "model.norm.weight")->shape[0];
    double rel = (double)(rm_model_num_params(m) - emb - ne[i].expected) / (double)ne[i].expected;
    assert_true(rel < 0.005 && rel > -0.005);
    rm_model_free(m);
  }
}

/* ---------------------------------------------------- tensor shapes */

static void shipped_tensor_shapes(void **state) {
  (void)state;
  rm_model *m = load(shipped("Qwen2.5-0.5B.json"), 0);
  /* 12 tensors per layer (q/k/v biases), embed, norm; tied: no lm_head. */
  assert_int_equal(rm_model_num_tensors(m), 1 + 24 * 12 + 1);
  assert_int_equal(rm_model_layers(m), 24);
  assert_int_equal(rm_model_num_experts(m), 0);
  assert_int_equal(rm_model_dtype(m), RESHARD_BF16);
  EXPECT_SHAPE(m, "model.embed_tokens.weight", 151936, 896);
  EXPECT_SHAPE(m, "model.layers.23.self_attn.k_proj.weight", 128, 896);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_proj.bias", 896);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.v_proj.bias", 128);
  EXPECT_SHAPE(m, "model.layers.5.mlp.down_proj.weight", 896, 4864);
  assert_null(find_tensor(m, "lm_head.weight"));
  assert_null(find_tensor(m, "model.layers.0.self_attn.o_proj.bias"));
  rm_model_free(m);

  m = load(shipped("Llama-3.2-1B.json"), 0);
  assert_int_equal(rm_model_num_tensors(m), 1 + 16 * 9 + 1);
  EXPECT_SHAPE(m, "model.layers.15.self_attn.q_proj.weight", 2048, 2048);
  EXPECT_SHAPE(m, "model.layers.15.self_attn.v_proj.weight", 512, 2048);
  EXPECT_SHAPE(m, "model.layers.15.mlp.gate_proj.weight", 8192, 2048);
  assert_null(find_tensor(m, "lm_head.weight"));
  rm_model_free(m);

  m = load(shipped("Qwen3-8B.json"), 0);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_norm.weight", 128);
  EXPECT_SHAPE(m, "model.layers.35.self_attn.k_norm.weight", 128);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.k_proj.weight", 1024, 4096);
  EXPECT_SHAPE(m, "lm_head.weight", 151936, 4096);
  assert_null(find_tensor(m, "model.layers.0.self_attn.q_proj.bias"));
  rm_model_free(m);

  m = load(shipped("Qwen3-30B-A3B.json"), 0);
  assert_int_equal(rm_model_num_experts(m), 128);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_proj.weight", 4096, 2048); /* head_dim 128 x 32 > hidden */
  EXPECT_SHAPE(m, "model.layers.0.self_attn.o_proj.weight", 2048, 4096);
  EXPECT_SHAPE(m, "model.layers.0.mlp.gate.weight", 128, 2048);
  EXPECT_SHAPE(m, "model.layers.47.mlp.experts.up_proj.weight", 128, 768, 2048);
  EXPECT_SHAPE(m, "model.layers.47.mlp.experts.down_proj.weight", 128, 2048, 768);
  assert_null(find_tensor(m, "model.layers.0.mlp.gate_proj.weight"));
  assert_null(find_tensor(m, "model.layers.0.mlp.gate.e_score_correction_bias"));
  rm_model_free(m);

  m = load(shipped("Mixtral-8x7B-v0.1.json"), 0);
  EXPECT_SHAPE(m, "model.layers.0.block_sparse_moe.gate.weight", 8, 4096);
  EXPECT_SHAPE(m, "model.layers.31.block_sparse_moe.experts.w1.weight", 8, 14336, 4096);
  EXPECT_SHAPE(m, "model.layers.31.block_sparse_moe.experts.w3.weight", 8, 14336, 4096);
  EXPECT_SHAPE(m, "model.layers.31.block_sparse_moe.experts.w2.weight", 8, 4096, 14336);
  rm_model_free(m);

  m = load(shipped("DeepSeek-V3.json"), 0);
  assert_int_equal(rm_model_layers(m), 61); /* MTP layer 61 not included */
  assert_null(find_tensor(m, "model.layers.61.input_layernorm.weight"));
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_a_proj.weight", 1536, 7168);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_a_layernorm.weight", 1536);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_b_proj.weight", 128 * 192, 1536);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 7168);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.kv_a_layernorm.weight", 512);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.kv_b_proj.weight", 128 * 256, 512);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.o_proj.weight", 7168, 128 * 128);
  EXPECT_SHAPE(m, "model.layers.2.mlp.gate_proj.weight", 18432, 7168); /* first_k_dense_replace 3 */
  assert_null(find_tensor(m, "model.layers.2.mlp.gate.weight"));
  EXPECT_SHAPE(m, "model.layers.3.mlp.gate.weight", 256, 7168);
  EXPECT_SHAPE(m, "model.layers.3.mlp.gate.e_score_correction_bias", 256);
  EXPECT_SHAPE(m, "model.layers.3.mlp.experts.gate_proj.weight", 256, 2048, 7168);
  EXPECT_SHAPE(m, "model.layers.60.mlp.experts.down_proj.weight", 256, 7168, 2048);
  EXPECT_SHAPE(m, "model.layers.3.mlp.shared_experts.gate_proj.weight", 2048, 7168);
  EXPECT_SHAPE(m, "model.layers.3.mlp.shared_experts.down_proj.weight", 7168, 2048);
  assert_null(find_tensor(m, "model.layers.3.mlp.gate_proj.weight"));
  rm_model_free(m);

  m = load(shipped("Kimi-K2-Instruct.json"), 0); /* model_type kimi_k2 */
  assert_string_equal(rm_model_arch(m), "deepseek_v3");
  assert_int_equal(rm_model_num_experts(m), 384);
  EXPECT_SHAPE(m, "model.layers.0.mlp.up_proj.weight", 18432, 7168);
  EXPECT_SHAPE(m, "model.layers.1.mlp.experts.gate_proj.weight", 384, 2048, 7168);
  EXPECT_SHAPE(m, "model.layers.1.self_attn.q_b_proj.weight", 64 * 192, 1536);
  EXPECT_SHAPE(m, "model.embed_tokens.weight", 163840, 7168);
  rm_model_free(m);
}

/* --layers style truncation keeps the real shapes of the first layers. */
static void layer_truncation(void **state) {
  (void)state;
  rm_model *full = load(shipped("DeepSeek-V3.json"), 0);
  rm_model *m = load(shipped("DeepSeek-V3.json"), 4);
  assert_int_equal(rm_model_layers(m), 4);
  assert_null(find_tensor(m, "model.layers.4.input_layernorm.weight"));
  EXPECT_SHAPE(m, "model.layers.3.mlp.experts.gate_proj.weight", 256, 2048, 7168);
  /* params: embeddings, norm, head + 3 dense layers + 1 MoE layer, the
   * same per-layer counts as the full model's layers 0 and 3. */
  int64_t layer0 = 0, layer3 = 0, rest = 0;
  for (int t = 0; t < rm_model_num_tensors(full); t++) {
    const rm_tensor *x = rm_model_tensor(full, t);
    int64_t c = 1;
    for (int d = 0; d < x->ndim; d++) c *= x->shape[d];
    if (!strncmp(x->name, "model.layers.0.", 15)) layer0 += c;
    else if (!strncmp(x->name, "model.layers.3.", 15)) layer3 += c;
    else if (strncmp(x->name, "model.layers.", 13)) rest += c;
  }
  assert_int_equal(rm_model_num_params(m), rest + 3 * layer0 + layer3);
  rm_model_free(m);
  rm_model_free(full);
}

/* ------------------------------------------------ synthetic configs */

static const char *LLAMA =
    "{'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 96, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
    " 'tie_word_embeddings': false, 'attention_bias': false}";
static const char *QWEN2 =
    "{'architectures': ['Qwen2ForCausalLM'], 'model_type': 'qwen2', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 96, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
    " 'tie_word_embeddings': true}";
static const char *QWEN3 =
    "{'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 96, 'num_hidden_layers': 3, 'num_attention_heads': 8, 'num_key_value_heads': 4,"
    " 'head_dim': 16, 'tie_word_embeddings': false}";
static const char *QWEN3_MOE =
    "{'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 96, 'num_hidden_layers': 3, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
    " 'head_dim': 8, 'num_experts': 8, 'moe_intermediate_size': 32, 'decoder_sparse_step': 1,"
    " 'mlp_only_layers': [0], 'tie_word_embeddings': false}";
static const char *MIXTRAL =
    "{'architectures': ['MixtralForCausalLM'], 'model_type': 'mixtral', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 48, 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
    " 'num_local_experts': 4, 'num_experts_per_tok': 2, 'sliding_window': null}";
static const char *DEEPSEEK =
    "{'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3', 'vocab_size': 1000,"
    " 'hidden_size': 64, 'intermediate_size': 96, 'moe_intermediate_size': 16, 'num_hidden_layers': 3,"
    " 'num_attention_heads': 4, 'num_key_value_heads': 4, 'q_lora_rank': 24, 'kv_lora_rank': 16,"
    " 'qk_nope_head_dim': 8, 'qk_rope_head_dim': 4, 'v_head_dim': 8, 'n_routed_experts': 8,"
    " 'n_shared_experts': 2, 'first_k_dense_replace': 1, 'moe_layer_freq': 1, 'topk_method': 'noaux_tc',"
    " 'num_nextn_predict_layers': 1, 'tie_word_embeddings': false}";
/* Tied embeddings where vLLM builds embed_tokens / lm_head on every
 * pipeline stage (qwen3_moe.py Qwen3MoeModel.__init__, mixtral.py
 * MixtralModel.__init__: the tied lm_head is embed_tokens' parameter) or
 * never ties (deepseek_v2.py DeepseekV2ForCausalLM.__init__: lm_head its
 * own parameter on the last stage, written from the embedding). */
static const char *QWEN3_MOE_TIED =
    "{'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'num_hidden_layers': 3, 'num_attention_heads': 8, 'num_key_value_heads': 2, 'head_dim': 8,"
    " 'num_experts': 8, 'moe_intermediate_size': 32, 'decoder_sparse_step': 1, 'mlp_only_layers': [],"
    " 'tie_word_embeddings': true}";
static const char *MIXTRAL_TIED =
    "{'architectures': ['MixtralForCausalLM'], 'model_type': 'mixtral', 'vocab_size': 1000, 'hidden_size': 64,"
    " 'intermediate_size': 48, 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
    " 'num_local_experts': 4, 'tie_word_embeddings': true}";
static const char *DEEPSEEK_TIED =
    "{'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3', 'vocab_size': 1000,"
    " 'hidden_size': 64, 'intermediate_size': 96, 'moe_intermediate_size': 16, 'num_hidden_layers': 2,"
    " 'num_attention_heads': 4, 'q_lora_rank': 24, 'kv_lora_rank': 16, 'qk_nope_head_dim': 8,"
    " 'qk_rope_head_dim': 4, 'v_head_dim': 8, 'n_routed_experts': 8, 'n_shared_experts': 2,"
    " 'first_k_dense_replace': 1, 'topk_method': 'noaux_tc', 'tie_word_embeddings': true}";
/* DeepSeek-V2-Lite style: no q LoRA (plain q_proj). */
static const char *DEEPSEEK_NOQ =
    "{'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3', 'vocab_size': 1000,"
    " 'hidden_size': 64, 'intermediate_size': 96, 'moe_intermediate_size': 16, 'num_hidden_layers': 2,"
    " 'num_attention_heads': 4, 'q_lora_rank': null, 'kv_lora_rank': 16, 'qk_nope_head_dim': 8,"
    " 'qk_rope_head_dim': 4, 'v_head_dim': 8, 'n_routed_experts': 8, 'n_shared_experts': 1,"
    " 'first_k_dense_replace': 1}";

static void synthetic_tensor_lists(void **state) {
  (void)state;
  rm_model *m = load(write_config("llama.json", LLAMA), 0);
  assert_int_equal(rm_model_num_params(m), 1000 * 64 * 2 + 64 + 4 * (64 * 64 * 2 + 16 * 64 * 2 + 3 * 96 * 64 + 128));
  assert_int_equal(rm_model_num_tensors(m), 3 + 4 * 9);
  rm_model_free(m);

  m = load(write_config("qwen3.json", QWEN3), 0);
  EXPECT_SHAPE(m, "model.layers.2.self_attn.q_proj.weight", 128, 64); /* head_dim 16 */
  EXPECT_SHAPE(m, "model.layers.2.self_attn.o_proj.weight", 64, 128);
  EXPECT_SHAPE(m, "model.layers.2.self_attn.k_norm.weight", 16);
  rm_model_free(m);

  m = load(write_config("qwen3_moe.json", QWEN3_MOE), 0);
  EXPECT_SHAPE(m, "model.layers.0.mlp.gate_proj.weight", 96, 64); /* mlp_only_layers [0] */
  assert_null(find_tensor(m, "model.layers.0.mlp.gate.weight"));
  EXPECT_SHAPE(m, "model.layers.1.mlp.experts.gate_proj.weight", 8, 32, 64);
  rm_model_free(m);

  m = load(write_config("deepseek_noq.json", DEEPSEEK_NOQ), 0);
  EXPECT_SHAPE(m, "model.layers.0.self_attn.q_proj.weight", 4 * 12, 64);
  assert_null(find_tensor(m, "model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_SHAPE(m, "model.layers.1.mlp.shared_experts.up_proj.weight", 16, 64);
  /* No topk_method: HF's DeepseekV3 router always has the bias. */
  EXPECT_SHAPE(m, "model.layers.1.mlp.gate.e_score_correction_bias", 8);
  rm_model_free(m);

  /* A router without the noaux_tc bias. */
  m = load(write_config("deepseek_greedy.json",
                        "{'architectures': ['DeepseekV3ForCausalLM'], 'vocab_size': 100, 'hidden_size': 16,"
                        " 'num_hidden_layers': 1, 'num_attention_heads': 2, 'q_lora_rank': 8, 'kv_lora_rank': 8,"
                        " 'qk_nope_head_dim': 4, 'qk_rope_head_dim': 4, 'v_head_dim': 4, 'n_routed_experts': 4,"
                        " 'moe_intermediate_size': 8, 'topk_method': 'greedy'}"),
           0);
  assert_null(find_tensor(m, "model.layers.0.mlp.gate.e_score_correction_bias"));
  assert_null(find_tensor(m, "model.layers.0.mlp.shared_experts.gate_proj.weight"));
  EXPECT_SHAPE(m, "model.layers.0.mlp.experts.down_proj.weight", 4, 16, 8);
  rm_model_free(m);
}

/* ------------------------------- fp8 checkpoints' unquantized modules */

/* base (a synthetic config) with an fp8 block quantization_config whose
 * extra keys are `extra` (", 'ignored_layers': [...]"), loaded with block
 * scales (per-expert or stacked); NULL with *r set when loading fails. */
static rm_model *load_fp8(const char *file, const char *base, const char *extra, int per_expert,
                          reshard_result_t *r) {
  static char text[4096];
  size_t n = strlen(base);
  assert_true(n > 1 && base[n - 1] == '}');
  snprintf(text, sizeof text,
           "%.*s, 'quantization_config': {'quant_method': 'fp8', 'activation_scheme': 'dynamic',"
           " 'weight_block_size': [8, 8]%s}}",
           (int)(n - 1), base, extra);
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.block_scales = 1;
  o.per_expert = per_expert;
  rm_model *m = NULL;
  *r = rm_model_load_ex(write_config(file, text), &o, &m);
  return m;
}

/* fp8 with its scale, or the model's dtype without one */
static void expect_fp8(const rm_model *m, const char *name, int fp8) {
  const rm_tensor *t = find_tensor(m, name);
  if (!t) print_error("%s: no tensor '%s'\n", rm_model_path(m), name);
  assert_non_null(t);
  if ((t->dtype == RESHARD_FP8_E4M3) != fp8 || (t->scale >= 0) != fp8)
    print_error("%s: dtype %d scale %d, expected %s\n", name, (int)t->dtype, t->scale, fp8 ? "fp8" : "bf16");
  assert_int_equal(t->dtype, fp8 ? RESHARD_FP8_E4M3 : RESHARD_BF16);
  assert_int_equal(t->scale >= 0, fp8);
  char sname[300];
  snprintf(sname, sizeof sname, "%.*s.weight_scale_inv", (int)(strlen(name) - 7), name);
  assert_int_equal(find_tensor(m, sname) != NULL, fp8);
}

/* Which weights an fp8 block checkpoint keeps in the model's dtype follows
 * vLLM: quantization/fp8.py Fp8Config.from_config reads ignored_layers, or
 * modules_to_not_convert when that is absent or empty, and
 * get_quant_method applies quantization/utils/quant_utils.py
 * is_layer_skipped (exact mode) to the layer vLLM builds: a fused layer
 * (qkv_proj, gate_up_proj, DeepSeek's fused_qkv_a_proj) by its own name or
 * by all of its shards' names where the class's packed_modules_mapping
 * lists it; routed experts by <block>.experts. Qwen3-MoE's router takes
 * the quant config (qwen3_moe.py Qwen3MoeSparseMoeBlock: GateLinear with
 * quant_config), DeepSeek's and Mixtral's do not. The real vLLM's
 * parameters are compared with these on CPU in
 * tests/python/real/test_vllm_real.py. */
static void fp8_unquantized_modules(void **state) {
  (void)state;
  reshard_result_t r;
  static const char *const spellings[3] = {
      ", 'ignored_layers': [%s]", ", 'modules_to_not_convert': [%s]",
      ", 'ignored_layers': [], 'modules_to_not_convert': [%s]"};
  for (int sp = 0; sp < 3; sp++) {
    char extra[1024];
    snprintf(extra, sizeof extra, spellings[sp],
             "'model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj',"
             " 'model.layers.0.self_attn.v_proj', 'model.layers.1.mlp.gate_up_proj',"
             " 'model.layers.2.mlp.down_proj', 'lm_head', 'model.layers.3.self_attn.o'");
    rm_model *m = load_fp8("llama_fp8.json", LLAMA, extra, 0, &r);
    if (r) print_error("%s\n", reshard_last_error());
    assert_int_equal(r, RESHARD_SUCCESS);
    for (int k = 0; k < 3; k++) {
      char n[128];
      snprintf(n, sizeof n, "model.layers.0.self_attn.%c_proj.weight", "qkv"[k]);
      expect_fp8(m, n, 0);
      snprintf(n, sizeof n, "model.layers.1.self_attn.%c_proj.weight", "qkv"[k]);
      expect_fp8(m, n, 1);
    }
    expect_fp8(m, "model.layers.0.self_attn.o_proj.weight", 1);
    expect_fp8(m, "model.layers.1.mlp.gate_proj.weight", 0);
    expect_fp8(m, "model.layers.1.mlp.up_proj.weight", 0);
    expect_fp8(m, "model.layers.1.mlp.down_proj.weight", 1);
    expect_fp8(m, "model.layers.2.mlp.down_proj.weight", 0);
    expect_fp8(m, "model.layers.2.mlp.gate_proj.weight", 1);
    expect_fp8(m, "model.layers.3.self_attn.o_proj.weight", 1); /* exact names, not prefixes */
    rm_model_free(m);
  }
  /* without block scales the list is not read */
  rm_model *plain = load(write_config("llama_fp8_plain.json",
                                      "{'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size':"
                                      " 100, 'hidden_size': 16, 'intermediate_size': 16, 'num_hidden_layers': 1,"
                                      " 'num_attention_heads': 2, 'quantization_config': {'ignored_layers': 3}}"),
                         0);
  rm_model_free(plain);

  /* Qwen3-MoE: routers fp8 unless listed; experts by <block>.experts;
   * gate_up_proj mapped only with mlp_only_layers (layer 0 here) */
  for (int pe = 0; pe < 2; pe++) {
    rm_model *m = load_fp8("qwen3_moe_fp8.json", QWEN3_MOE,
                           ", 'ignored_layers': ['model.layers.1.mlp.gate', 'model.layers.2.mlp.experts',"
                           " 'model.layers.0.mlp.gate_proj', 'model.layers.0.mlp.up_proj',"
                           " 'model.layers.1.mlp.experts.3.up_proj']",
                           pe, &r);
    if (r) print_error("%s\n", reshard_last_error());
    assert_int_equal(r, RESHARD_SUCCESS);
    expect_fp8(m, "model.layers.1.mlp.gate.weight", 0);
    expect_fp8(m, "model.layers.2.mlp.gate.weight", 1);
    expect_fp8(m, "model.layers.0.mlp.gate_proj.weight", 0);
    expect_fp8(m, "model.layers.0.mlp.up_proj.weight", 0);
    expect_fp8(m, "model.layers.0.mlp.down_proj.weight", 1);
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int k = 0; k < 3; k++)
      for (int l = 1; l < 3; l++) {
        char n[128];
        if (pe)
          for (int e = 0; e < 8; e++) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[k]);
            expect_fp8(m, n, l == 1); /* experts.3.up_proj is no vLLM layer */
          }
        else {
          snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%s.weight", l, proj[k]);
          expect_fp8(m, n, l == 1);
        }
      }
    rm_model_free(m);
  }
  /* dense layers from decoder_sparse_step alone: vLLM maps no gate_up_proj,
   * so only the fused name skips them */
  char sparse[1024];
  snprintf(sparse, sizeof sparse, "%s", QWEN3_MOE);
  char *at = strstr(sparse, "'decoder_sparse_step': 1, 'mlp_only_layers': [0]");
  assert_non_null(at);
  memcpy(at, "'decoder_sparse_step': 2, 'mlp_only_layers': [ ]", strlen("'decoder_sparse_step': 2, 'mlp_only_layers': [ ]"));
  rm_model *m = load_fp8("qwen3_moe_sparse_fp8.json", sparse,
                         ", 'ignored_layers': ['model.layers.0.mlp.gate_proj', 'model.layers.0.mlp.up_proj',"
                         " 'model.layers.2.mlp.gate_up_proj']",
                         0, &r);
  if (r) print_error("%s\n", reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  expect_fp8(m, "model.layers.0.mlp.gate_proj.weight", 1);
  expect_fp8(m, "model.layers.0.mlp.up_proj.weight", 1);
  expect_fp8(m, "model.layers.2.mlp.gate_proj.weight", 0);
  expect_fp8(m, "model.layers.2.mlp.up_proj.weight", 0);
  expect_fp8(m, "model.layers.1.mlp.gate.weight", 1);
  rm_model_free(m);

  /* DeepSeek-V3: fused_qkv_a_proj (q_lora_rank set), shared experts'
   * gate_up_proj; the router stays bf16 */
  m = load_fp8("deepseek_fp8.json", DEEPSEEK,
               ", 'ignored_layers': ['model.layers.0.self_attn.fused_qkv_a_proj',"
               " 'model.layers.1.self_attn.q_a_proj', 'model.layers.1.self_attn.kv_a_proj_with_mqa',"
               " 'model.layers.2.mlp.shared_experts.gate_proj', 'model.layers.2.mlp.shared_experts.up_proj',"
               " 'model.layers.1.self_attn.kv_b_proj']",
               0, &r);
  if (r) print_error("%s\n", reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  for (int l = 0; l < 3; l++) {
    char n[128];
    snprintf(n, sizeof n, "model.layers.%d.self_attn.q_a_proj.weight", l);
    expect_fp8(m, n, l == 2);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", l);
    expect_fp8(m, n, l == 2);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    expect_fp8(m, n, l != 1);
    snprintf(n, sizeof n, "model.layers.%d.self_attn.q_b_proj.weight", l);
    expect_fp8(m, n, 1);
  }
  expect_fp8(m, "model.layers.2.mlp.shared_experts.gate_proj.weight", 0);
  expect_fp8(m, "model.layers.2.mlp.shared_experts.up_proj.weight", 0);
  expect_fp8(m, "model.layers.2.mlp.shared_experts.down_proj.weight", 1);
  expect_fp8(m, "model.layers.1.mlp.shared_experts.gate_proj.weight", 1);
  expect_fp8(m, "model.layers.1.mlp.gate.weight", 0);
  rm_model_free(m);

  /* part of a fused layer: vLLM raises, so does the load, naming both
   * shards and the layer */
  static const struct {
    const char *base, *extra, *listed, *missing, *fused;
  } bad[] = {
      {NULL, ", 'ignored_layers': ['model.layers.0.self_attn.k_proj']", "layers.0.self_attn.k_proj'",
       "layers.0.self_attn.q_proj'", "self_attn.qkv_proj"},
      {NULL, ", 'modules_to_not_convert': ['model.layers.3.mlp.up_proj']", "layers.3.mlp.up_proj'",
       "layers.3.mlp.gate_proj'", "mlp.gate_up_proj"},
      {"deepseek", ", 'ignored_layers': ['model.layers.0.self_attn.q_a_proj']", "q_a_proj'", "kv_a_proj_with_mqa'",
       "fused_qkv_a_proj"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    m = load_fp8("fp8_bad.json", bad[i].base ? DEEPSEEK : LLAMA, bad[i].extra, 0, &r);
    const char *msg = reshard_last_error();
    assert_int_equal(r, RESHARD_ERROR_INVALID_ARGUMENT);
    assert_null(m);
    if (!strstr(msg, bad[i].listed) || !strstr(msg, bad[i].missing) || !strstr(msg, bad[i].fused) ||
        !strstr(msg, "fp8_bad.json"))
      print_error("%s\n", msg);
    assert_non_null(strstr(msg, bad[i].listed));
    assert_non_null(strstr(msg, bad[i].missing));
    assert_non_null(strstr(msg, bad[i].fused));
    assert_non_null(strstr(msg, "fp8_bad.json"));
  }
  /* malformed lists */
  static const struct {
    const char *extra, *needle;
  } malformed[] = {{", 'ignored_layers': 'model.layers.0.mlp'", "quantization_config.ignored_layers' must be an array"},
                   {", 'modules_to_not_convert': ['lm_head', 3]", "modules_to_not_convert' entry 1 must be a string"}};
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
    m = load_fp8("fp8_malformed.json", LLAMA, malformed[i].extra, 0, &r);
    assert_int_equal(r, RESHARD_ERROR_INVALID_ARGUMENT);
    assert_null(m);
    if (!strstr(reshard_last_error(), malformed[i].needle)) print_error("%s\n", reshard_last_error());
    assert_non_null(strstr(reshard_last_error(), malformed[i].needle));
  }
}

/* ------------------------------------------------------------ FSDP2 */

/* rank's rows [lo, hi) of tensor `name` (dim 0), or -1 / -1 when it holds
 * none; the other dims whole. */
static void rows_of(const reshard_layout_t *L, const rm_model *m, int rank, const char *name, int64_t *lo,
                    int64_t *hi) {
  int id;
  assert_int_equal(reshard_layout_find_tensor(L, name, &id), RESHARD_SUCCESS);
  const rm_tensor *t = find_tensor(m, name);
  size_t n = 0;
  assert_int_equal(reshard_layout_fragments(L, rank, NULL, 0, &n), RESHARD_SUCCESS);
  reshard_fragment_info_t *f = calloc(n + 1, sizeof *f);
  assert_int_equal(reshard_layout_fragments(L, rank, f, n, &n), RESHARD_SUCCESS);
  *lo = *hi = -1;
  for (size_t i = 0; i < n; i++) {
    if (f[i].tensor_id != id) continue;
    assert_int_equal(*lo, -1); /* one box */
    *lo = f[i].start[0], *hi = f[i].start[0] + f[i].extent[0];
    for (int d = 1; d < t->ndim; d++) assert_int_equal(f[i].extent[d], t->shape[d]);
  }
  free(f);
}

/* FSDP2's layout from a config: every parameter Shard(0) with
 * torch.chunk's pieces over dp_shard (torch/distributed/fsdp/_fully_shard/
 * _fsdp_param.py FSDPParam._init_sharded_param: _chunk_with_empty of dim
 * 0), replicated over dp_replicate (HSDP), ranks in init_device_mesh's
 * row-major order; the real FSDP2 gives the same boxes
 * (tests/python/real/fsdp_world.py). */
static void fsdp_layouts(void **state) {
  (void)state;
  rm_model *m = load(write_config("llama_fsdp.json", LLAMA), 0);
  for (int rep = 1; rep <= 2; rep++) {
    char spec[64];
    snprintf(spec, sizeof spec, rep > 1 ? "dp_shard=3,dp_replicate=%d" : "dp_shard=3", rep);
    rm_parallel p = par(spec);
    reshard_layout_t *L = NULL;
    reshard_result_t r = rm_fsdp_layout(m, &p, 5, &L);
    if (r) print_error("%s: %s\n", spec, reshard_last_error());
    assert_int_equal(r, RESHARD_SUCCESS);
    assert_int_equal(reshard_layout_num_buffers(L), rm_model_num_tensors(m));
    expect_full_coverage(L, 5 + 3 * rep, "fsdp");
    /* torch.chunk(1000, 3): 334, 334, 332; (64 rows of q_proj: 22, 22, 20;
     * the 64-element norm the same) */
    static const int64_t embed[4] = {0, 334, 668, 1000}, q[4] = {0, 22, 44, 64};
    for (int rr = 0; rr < rep; rr++)
      for (int sh = 0; sh < 3; sh++) {
        int64_t lo, hi;
        rows_of(L, m, 5 + rr * 3 + sh, "model.embed_tokens.weight", &lo, &hi);
        assert_int_equal(lo, embed[sh]);
        assert_int_equal(hi, embed[sh + 1]);
        rows_of(L, m, 5 + rr * 3 + sh, "model.layers.3.self_attn.q_proj.weight", &lo, &hi);
        assert_int_equal(lo, q[sh]);
        assert_int_equal(hi, q[sh + 1]);
        rows_of(L, m, 5 + rr * 3 + sh, "model.norm.weight", &lo, &hi);
        assert_int_equal(lo, q[sh]);
        int b;
        assert_int_equal(reshard_layout_find_buffer(L, "lm_head.weight", 5 + rr * 3 + sh, &b), RESHARD_SUCCESS);
      }
    int64_t lo, hi;
    rows_of(L, m, 4, "model.embed_tokens.weight", &lo, &hi);
    assert_int_equal(lo, -1);
    reshard_layout_destroy(L);
  }
  /* what FSDP2's layout from a config cannot say, each named */
  static const struct {
    const char *spec, *says;
  } bad[] = {{"dp_shard=2,tp=2", "'tp'"}, {"dp_shard=2,pp=2", "'pp'"}, {"dp=2", "'dp'"},
             {"dp_shard=2,w31=1", "'w31'"}, {"dp_shard=2,vocab=1024", "'vocab'"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    rm_parallel p = par(bad[i].spec);
    reshard_layout_t *L = (reshard_layout_t *)(uintptr_t)1;
    assert_int_equal(rm_fsdp_layout(m, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
    assert_null(L);
    if (!strstr(reshard_last_error(), bad[i].says)) print_error("%s: %s\n", bad[i].spec, reshard_last_error());
    assert_non_null(strstr(reshard_last_error(), bad[i].says));
  }
  /* the FSDP2 keys on the other builders */
  rm_parallel p = par("tp=2,dp_shard=2");
  reshard_layout_t *L = NULL;
  assert_int_equal(rm_megatron_layout(m, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "'dp_shard' is FSDP2's"));
  p = par("tp=2,dp_replicate=2");
  assert_int_equal(rm_vllm_layout(m, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "'dp_replicate' is FSDP2's"));
  rm_model_free(m);
  /* MoE: transformers 5's fused experts are not the checkpoint's tensors */
  m = load(write_config("qwen3_moe_fsdp.json", QWEN3_MOE), 0);
  p = par("dp_shard=2");
  assert_int_equal(rm_fsdp_layout(m, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "MoE"));
  rm_model_free(m);
}

/* ----------------------------------------------------- parse errors */

/* Loading fails with `code`, *out stays NULL, and the message names the
 * file and every string in `needles` (NULL-terminated). */
static void expect_load_error(const char *path, int layers, reshard_result_t code, ...) {
  rm_model *m = (rm_model *)(uintptr_t)1;
  reshard_result_t r = rm_model_load(path, layers, RESHARD_BF16, &m);
  const char *msg = reshard_last_error();
  if (r != code) print_error("%s: result %d (%s), expected %d\n", path, r, msg, code);
  assert_int_equal(r, code);
  assert_null(m);
  if (!strstr(msg, path)) print_error("message does not name the file: %s\n", msg);
  assert_non_null(strstr(msg, path));
  va_list ap;
  va_start(ap, code);
  for (const char *s; (s = va_arg(ap, const char *));) {
    if (!strstr(msg, s)) print_error("message does not say '%s': %s\n", s, msg);
    assert_non_null(strstr(msg, s));
  }
  va_end(ap);
}

static void config_errors(void **state) {
  (void)state;
  expect_load_error(write_config("malformed.json", "{'hidden_size': 64,\n 'vocab_size': }"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "malformed JSON", "line 2", NULL);
  expect_load_error(write_config("trailing.json", "{'hidden_size': 64} x"), 0, RESHARD_ERROR_INVALID_ARGUMENT,
                    "malformed JSON", NULL);
  expect_load_error(write_config("dup.json", "{'hidden_size': 64, 'hidden_size': 32}"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "hidden_size", NULL);
  expect_load_error(write_config("array.json", "[1, 2]"), 0, RESHARD_ERROR_INVALID_ARGUMENT, "object", NULL);
  char missing[160];
  snprintf(missing, sizeof missing, "%s/does_not_exist.json", tmpdir);
  expect_load_error(missing, 0, RESHARD_ERROR_INVALID_ARGUMENT, "cannot read", NULL);
  expect_load_error(write_config("gpt2.json", "{'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2'}"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "unknown architecture", "GPT2LMHeadModel", "gpt2", "qwen3_moe",
                    NULL);
  expect_load_error(write_config("noarch.json", "{'hidden_size': 64}"), 0, RESHARD_ERROR_INVALID_ARGUMENT,
                    "architectures", NULL);
  /* issue 42, item 8: this said "must be an array of class names, found an array" */
  expect_load_error(write_config("emptyarch.json", "{'architectures': [], 'model_type': 'llama'}"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "'architectures' must be a non-empty array of class names",
                    "found an empty array", NULL);
  expect_load_error(write_config("numarch.json", "{'architectures': [3], 'model_type': 'llama'}"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "found an array whose first entry is an integer", NULL);
  expect_load_error(write_config("strarch.json", "{'architectures': 'LlamaForCausalLM'}"), 0,
                    RESHARD_ERROR_INVALID_ARGUMENT, "found a string", NULL);
  expect_load_error(write_config("nohidden.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'num_hidden_layers': 1,"
                                 " 'num_attention_heads': 2, 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'hidden_size'", NULL);
  expect_load_error(write_config("nullvocab.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': null, 'hidden_size': 8,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 2, 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'vocab_size'", NULL);
  expect_load_error(write_config("strhidden.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'hidden_size': '64',"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 2, 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "'hidden_size' must be an integer", "string", NULL);
  expect_load_error(write_config("zeroheads.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 0, 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "num_attention_heads", NULL);
  expect_load_error(write_config("gqa.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 8, 'num_key_value_heads': 3,"
                                 " 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "num_key_value_heads", NULL);
  expect_load_error(write_config("tiedstr.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 8, 'intermediate_size': 8,"
                                 " 'tie_word_embeddings': 1}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "tie_word_embeddings", NULL);
  expect_load_error(write_config("mlpbias.json",
                                 "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 8, 'intermediate_size': 8,"
                                 " 'mlp_bias': true}"),
                    0, RESHARD_ERROR_UNSUPPORTED, "mlp_bias", NULL);
  /* Missing MoE / MLA keys are named. */
  expect_load_error(write_config("mixtral_noexperts.json",
                                 "{'architectures': ['MixtralForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 8, 'intermediate_size': 8}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'num_local_experts'", NULL);
  expect_load_error(write_config("qmoe_noi.json",
                                 "{'architectures': ['Qwen3MoeForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_experts': 4}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'moe_intermediate_size'", NULL);
  expect_load_error(write_config("qmoe_only.json",
                                 "{'architectures': ['Qwen3MoeForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_experts': 4,"
                                 " 'moe_intermediate_size': 8, 'intermediate_size': 8, 'mlp_only_layers': [2]}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "mlp_only_layers", NULL);
  expect_load_error(write_config("qmoe_dense_noi.json",
                                 "{'architectures': ['Qwen3MoeForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_experts': 4,"
                                 " 'moe_intermediate_size': 8, 'mlp_only_layers': [1]}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'intermediate_size'", NULL);
  expect_load_error(write_config("ds_nokv.json",
                                 "{'architectures': ['DeepseekV3ForCausalLM'], 'vocab_size': 10, 'hidden_size': 64,"
                                 " 'num_hidden_layers': 1, 'num_attention_heads': 8, 'q_lora_rank': 8,"
                                 " 'qk_nope_head_dim': 4, 'qk_rope_head_dim': 4, 'v_head_dim': 4}"),
                    0, RESHARD_ERROR_INVALID_ARGUMENT, "missing key 'kv_lora_rank'", NULL);
  /* Arguments. */
  const char *llama = write_config("llama.json", LLAMA);
  expect_load_error(llama, 5, RESHARD_ERROR_INVALID_ARGUMENT, "layers 5", "num_hidden_layers 4", NULL);
  expect_load_error(llama, -1, RESHARD_ERROR_INVALID_ARGUMENT, "layers -1", NULL);
  rm_model *m = NULL;
  assert_int_equal(rm_model_load(llama, 0, RESHARD_NUM_DTYPES, &m), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(m);
  assert_int_equal(rm_model_load(NULL, 0, RESHARD_BF16, &m), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(rm_model_load(llama, 0, RESHARD_BF16, NULL), RESHARD_ERROR_INVALID_ARGUMENT);
  rm_model_free(NULL);
}

/* ------------------------------------------------- parallel settings */

static void parallel_spec_parsing(void **state) {
  (void)state;
  rm_parallel p = par("tp=4,pp=2,dp=2,ep=8");
  assert_int_equal(p.tp, 4);
  assert_int_equal(p.pp, 2);
  assert_int_equal(p.dp, 2);
  assert_int_equal(p.ep, 8);
  assert_int_equal(p.etp, 0); /* the framework's default */
  assert_int_equal(rm_parallel_ranks(&p), 16);
  p = par("etp=2, dp = 3 ,tp=1");
  assert_int_equal(p.etp, 2);
  assert_int_equal(p.dp, 3);
  assert_int_equal(p.tp, 1);
  assert_int_equal(p.pp, 1);
  assert_int_equal(p.ep, 1);
  assert_int_equal(rm_parallel_ranks(&p), 3);
  p = par("");
  const rm_parallel init = RM_PARALLEL_INIT;
  assert_true(p.tp == init.tp && p.pp == init.pp && p.dp == init.dp && p.ep == init.ep && p.etp == init.etp &&
              p.vocab == init.vocab && p.first == init.first && p.last == init.last);
  assert_int_equal(rm_parallel_ranks(&p), 1);
  assert_int_equal(p.grouped_gemm, 1);
  assert_int_equal(p.sp_moe, -1);
  assert_int_equal(p.w31, 0);
  assert_int_equal(p.cp, 0); /* unset: 1 */
  p = par("tp=2,cp=2,pp=2,dp=3"); /* Megatron's context parallelism counts in the ranks */
  assert_int_equal(p.cp, 2);
  assert_int_equal(rm_parallel_ranks(&p), 24);
  p = par("w31=1");
  assert_int_equal(p.w31, 1);
  p = par("vocab=152064,first=3,last=2,grouped_gemm=0,sp_moe=1");
  assert_int_equal(p.vocab, 152064);
  assert_int_equal(p.first, 3);
  assert_int_equal(p.last, 2);
  assert_int_equal(p.grouped_gemm, 0);
  assert_int_equal(p.sp_moe, 1);
  assert_int_equal(par("vocab=2147483647").vocab, 2147483647LL);

  const struct {
    const char *spec, *says;
  } bad[] = {
      {"tp=0", "'tp'"},         {"tp=-2", "'tp'"},         {"tp=abc", "'tp'"},     {"tp=2x", "'tp'"},
      {"tq=2", "'tq'"},         {"tp", "'tp'"},            {"tp=2,,pp=2", "''"},   {"tp=2,", "''"},
      {"tp=2,tp=4", "twice"},   {"pp=99999999999", "'pp'"}, {"dp=", "'dp'"},       {"ep=4=4", "'ep'"},
      {"tp=2;pp=2", "'tp'"},    {"TP=2", "'TP'"},          {"vocab=0", "'vocab'"}, {"sp_moe=2", "'sp_moe'"},
      {"grouped_gemm=-1", "'grouped_gemm'"}, {"first=0", "'first'"}, {"vocab=2147483648", "'vocab'"},
      {"w31=2", "'w31'"},       {"dp_shard=0", "'dp_shard'"}, {"dp_replicate=x", "'dp_replicate'"},
      {"cp=0", "'cp'"},         {"attn_dp=0", "'attn_dp'"}, {"dp_lm_head=2", "'dp_lm_head'"},
      {"moe_dense_tp=0", "'moe_dense_tp'"}, {"shared_fusion=1", "'shared_fusion'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rm_parallel q = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
    reshard_result_t r = rm_parse_parallel(bad[i].spec, &q);
    if (r != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(reshard_last_error(), bad[i].says))
      print_error("'%s': result %d, message '%s' (expected to name %s)\n", bad[i].spec, r, reshard_last_error(),
                  bad[i].says);
    assert_int_equal(r, RESHARD_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(reshard_last_error(), bad[i].says));
    assert_int_equal(q.tp, 7); /* untouched on failure */
  }
  assert_int_equal(rm_parse_parallel(NULL, &p), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(rm_parse_parallel("tp=2", NULL), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(rm_parallel_ranks(NULL), 0);
}

/* Both builders reject what the frameworks reject, naming the setting (the
 * rules of issue-level importance, with their upstream sources, are in
 * test_model_layouts.c). */
static void expect_layout_error(const rm_model *m, int vllm_side, const char *spec, int first, const char *says) {
  rm_parallel p = par(spec);
  reshard_layout_t *L = (reshard_layout_t *)(uintptr_t)1;
  reshard_result_t r = vllm_side ? rm_vllm_layout(m, &p, first, &L) : rm_megatron_layout(m, &p, first, &L);
  if (r != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(reshard_last_error(), says))
    print_error("%s %s: result %d, message '%s' (expected to say '%s')\n", vllm_side ? "vllm" : "megatron", spec, r,
                reshard_last_error(), says);
  assert_int_equal(r, RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
  assert_non_null(strstr(reshard_last_error(), says));
}

static void invalid_parallel_combinations(void **state) {
  (void)state;
  rm_model *m = load(write_config("llama.json", LLAMA), 0); /* 8 heads, 2 KV heads, 4 layers */
  expect_layout_error(m, 0, "tp=4", 0, "query groups");  /* not modelled: groups split across ranks */
  expect_layout_error(m, 1, "tp=3", 0, "tp 3");          /* neither divides the other */
  expect_layout_error(m, 0, "tp=16", 0, "attention heads");
  expect_layout_error(m, 1, "tp=16", 0, "attention heads");
  expect_layout_error(m, 0, "pp=5", 0, "pp 5");
  expect_layout_error(m, 1, "pp=5", 0, "pp 5");
  expect_layout_error(m, 0, "tp=2,ep=2", 0, "dense");
  expect_layout_error(m, 1, "etp=2", 0, "dense");
  expect_layout_error(m, 0, "tp=2", -1, "first rank");
  expect_layout_error(m, 1, "tp=1024,pp=4,dp=1024", 0, "attention heads");
  expect_layout_error(m, 0, "tp=2048,pp=2,dp=1048576", 0, "overflow");
  expect_layout_error(m, 1, "dp=2,ep=2", 0, "dense");
  {
    reshard_layout_t *L = NULL;
    rm_parallel p = par("");
    assert_int_equal(rm_megatron_layout(NULL, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
    assert_int_equal(rm_vllm_layout(m, NULL, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
    assert_int_equal(rm_vllm_layout(m, &p, 0, NULL), RESHARD_ERROR_INVALID_ARGUMENT);
  }
  rm_model_free(m);

  m = load(write_config("qwen3_moe.json", QWEN3_MOE), 0); /* 8 experts, expert I 32 */
  expect_layout_error(m, 0, "tp=2,dp=2,ep=8,etp=1", 0, "ep 8 x etp 1 does not divide tp x dp = 4");
  expect_layout_error(m, 0, "tp=2,dp=2,ep=4", 0, "ep 4 x etp 2 does not divide tp x dp = 4"); /* etp = tp */
  expect_layout_error(m, 1, "tp=2,dp=2,ep=8", 0, "tp x dp = 4");
  expect_layout_error(m, 0, "tp=2,dp=2,ep=2,etp=4", 0, "etp 4");
  expect_layout_error(m, 0, "tp=2,dp=3,ep=3,etp=1", 0, "ep 3 does not divide the 8 experts");
  expect_layout_error(m, 1, "tp=2,dp=2,ep=4,etp=4", 0, "etp 4"); /* vLLM: tp x dp / ep */
  expect_layout_error(m, 1, "tp=4,dp=2,etp=2", 0, "say etp=8");
  expect_layout_error(m, 1, "tp=2048,pp=2,dp=1048576", 0, "overflow"); /* tp x dp beyond int */
  rm_model_free(m);

  /* etp must divide the expert intermediate size (20 / 8 no). */
  m = load(write_config("mixtral_odd.json",
                        "{'architectures': ['MixtralForCausalLM'], 'vocab_size': 100, 'hidden_size': 32,"
                        " 'intermediate_size': 20, 'num_hidden_layers': 1, 'num_attention_heads': 4,"
                        " 'num_key_value_heads': 4, 'num_local_experts': 4}"),
           0);
  expect_layout_error(m, 0, "dp=8,ep=1,etp=8", 0, "etp 8 does not divide the expert intermediate size 20");
  expect_layout_error(m, 1, "tp=4,dp=2", 0, "tp x dp / ep = 8 does not divide the expert intermediate size 20");
  rm_model_free(m);

  /* vLLM: the padded vocabulary (1000 -> 1024) must split over tp;
   * Megatron: the rows given (default vocab_size) must. */
  m = load(write_config("heads6.json",
                        "{'architectures': ['LlamaForCausalLM'], 'vocab_size': 1000, 'hidden_size': 48,"
                        " 'intermediate_size': 96, 'num_hidden_layers': 1, 'num_attention_heads': 6,"
                        " 'num_key_value_heads': 3}"),
           0);
  expect_layout_error(m, 1, "tp=3", 0, "padded vocabulary 1024");
  expect_layout_error(m, 0, "tp=3", 0, "say vocab=<rows>");
  reshard_layout_t *L = megatron(m, "tp=3,vocab=1152", 0); /* Megatron-LM: 128 x 3 */
  int b;
  size_t bytes;
  assert_int_equal(reshard_layout_find_buffer(L, "embedding.word_embeddings.weight", 2, &b), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_buffer_bytes(L, b, 2, &bytes), RESHARD_SUCCESS);
  assert_int_equal(bytes, 384LL * 48 * 2);
  reshard_layout_destroy(L);
  rm_model_free(m);

  /* vLLM replicates the shared experts under sequence-parallel MoE
   * (DeepseekV2MLP disable_tp): tp need not divide their intermediate size
   * (16 here) then, and must otherwise. */
  m = load(write_config("deepseek6.json",
                        "{'architectures': ['DeepseekV3ForCausalLM'], 'vocab_size': 960, 'hidden_size': 48,"
                        " 'moe_intermediate_size': 16, 'num_hidden_layers': 1, 'num_attention_heads': 6,"
                        " 'q_lora_rank': 24, 'kv_lora_rank': 16, 'qk_nope_head_dim': 8, 'qk_rope_head_dim': 4,"
                        " 'v_head_dim': 8, 'n_routed_experts': 6, 'n_shared_experts': 1,"
                        " 'first_k_dense_replace': 0, 'topk_method': 'noaux_tc'}"),
           0);
  L = vllm(m, "tp=3,dp=2,ep=6", 0);
  reshard_layout_destroy(L);
  expect_layout_error(m, 1, "tp=3,dp=2,ep=6,sp_moe=0", 0, "shared experts' intermediate size 16");
  rm_model_free(m);

  m = load(write_config("deepseek.json", DEEPSEEK), 0); /* shared intermediate 32, dense I 96 */
  expect_layout_error(m, 0, "tp=4,ep=8", 0, "ep 8 x etp 4 does not divide tp x dp = 4");
  reshard_layout_t *ok = megatron(m, "tp=4,ep=4,etp=1", 0); /* MLA: no KV-group constraint */
  reshard_layout_destroy(ok);
  rm_model_free(m);
}

/* ------------------------------------------- end-to-end reshards */

/* Megatron `src` on ranks 0.. and vLLM `dst` after them (or from 0 when
 * colocated): every destination byte checked over `steps` updates. */
static void reshard(const char *cfg, const char *json, const char *src, const char *dst, int colocate,
                    size_t staging) {
  rm_model *m = load(write_config(cfg, json), 0);
  rm_parallel s = par(src), d = par(dst);
  int S = rm_parallel_ranks(&s), D = rm_parallel_ranks(&d);
  reshard_layout_t *sl = megatron(m, src, 0), *dl = vllm(m, dst, colocate ? 0 : S);
  int nranks = colocate ? (S > D ? S : D) : S + D;
  expect_full_coverage(sl, nranks, "megatron");
  expect_full_coverage(dl, nranks, "vllm");
  th_sync_args a = {.src = sl, .dst = dl, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  if (staging) a.opts.staging_bytes = staging;
  int64_t bad = th_sync(nranks, &a);
  if (bad) print_error("%s: megatron %s -> vllm %s%s: %lld wrong\n", cfg, src, dst, colocate ? " (colocated)" : "",
                       (long long)bad);
  assert_int_equal(bad, 0);
  /* Guard against a vacuous pass: every destination replica of the model
   * was received or copied. */
  size_t moved = 0;
  for (int i = 0; i < nranks; i++) moved += a.recv_bytes[i] + a.local_bytes[i];
  assert_true(moved >= (size_t)rm_model_num_params(m) * reshard_dtype_size(rm_model_dtype(m)));
  reshard_layout_destroy(sl);
  reshard_layout_destroy(dl);
  rm_model_free(m);
}

static void e2e_llama(void **state) {
  (void)state;
  reshard("llama.json", LLAMA, "tp=2,pp=2", "tp=2,dp=2", 0, 0);
  reshard("llama.json", LLAMA, "tp=2,dp=2", "tp=4", 0, 0);        /* kv replication */
  reshard("llama.json", LLAMA, "tp=2,pp=2", "tp=8", 0, 0);        /* 4 ranks per KV head */
  reshard("llama.json", LLAMA, "tp=2,pp=2", "tp=4", 1, 0);        /* colocated */
  reshard("llama.json", LLAMA, "tp=1,dp=2", "tp=2,pp=2", 0, 4096); /* vLLM pp, small staging */
}

static void e2e_qwen2_bias_tied(void **state) {
  (void)state;
  reshard("qwen2.json", QWEN2, "tp=2,pp=2,dp=2", "tp=4", 0, 0);
  reshard("qwen2.json", QWEN2, "pp=2", "tp=2,pp=2", 0, 0); /* tied copies on both last stages */
  reshard("qwen2.json", QWEN2, "tp=2,pp=2", "tp=4,dp=2", 1, 0);
}

static void e2e_qwen3_qk_norm(void **state) {
  (void)state;
  reshard("qwen3.json", QWEN3, "tp=4", "tp=8", 0, 0);
  reshard("qwen3.json", QWEN3, "tp=2,pp=3", "tp=2,pp=2", 0, 0);
  reshard("qwen3.json", QWEN3, "tp=4,pp=3", "tp=4,dp=2", 1, 0);
}

static void e2e_qwen3_moe(void **state) {
  (void)state;
  reshard("qwen3_moe.json", QWEN3_MOE, "tp=2,dp=2,ep=4,etp=1", "tp=2,dp=2,ep=4", 0, 0);
  reshard("qwen3_moe.json", QWEN3_MOE, "tp=2,pp=2,dp=2,ep=2,etp=2,first=1", "tp=4", 0, 0);
  reshard("qwen3_moe.json", QWEN3_MOE, "tp=2,dp=2,ep=2", "tp=4,ep=4", 1, 8192);
  reshard("qwen3_moe.json", QWEN3_MOE, "tp=2,dp=2,ep=4,etp=1", "tp=2,pp=3,dp=2,ep=4", 0, 0);
  /* every vLLM stage holds embed_tokens (= the tied lm_head) and norm */
  reshard("qwen3_moe_tied.json", QWEN3_MOE_TIED, "tp=2,pp=3,ep=2,etp=1", "tp=2,pp=3,ep=2", 0, 0);
  reshard("qwen3_moe_tied.json", QWEN3_MOE_TIED, "tp=2,ep=2,etp=1", "tp=2,pp=2,dp=2,ep=4", 1, 4096);
}

static void e2e_mixtral(void **state) {
  (void)state;
  reshard("mixtral.json", MIXTRAL, "tp=2,pp=2,ep=2,etp=1", "tp=2,dp=2,ep=4", 0, 0);
  reshard("mixtral.json", MIXTRAL, "tp=2,etp=2", "tp=2,ep=2", 0, 0);
  reshard("mixtral.json", MIXTRAL, "tp=2,dp=2,ep=2,grouped_gemm=0", "tp=2,pp=2,dp=2,ep=4", 0, 0);
  reshard("mixtral.json", MIXTRAL, "tp=2,dp=2,ep=4,etp=1", "tp=4,etp=4", 1, 0);
  reshard("mixtral_tied.json", MIXTRAL_TIED, "tp=2,pp=2,ep=2,etp=1", "tp=2,pp=2,ep=2", 0, 0);
}

static void e2e_deepseek_v3(void **state) {
  (void)state;
  reshard("deepseek.json", DEEPSEEK, "tp=2,pp=3,dp=2,ep=4,etp=1", "tp=4,ep=4", 0, 0);
  reshard("deepseek.json", DEEPSEEK, "tp=2,dp=2,ep=2,etp=2", "tp=2,dp=2,ep=4", 0, 0);
  reshard("deepseek.json", DEEPSEEK, "tp=2,pp=3,ep=2,etp=1,vocab=1024", "tp=4,ep=4", 1, 8192);
  reshard("deepseek.json", DEEPSEEK, "tp=2,dp=2,ep=4,etp=1", "tp=2,pp=2,dp=2,ep=4", 0, 0);
  reshard("deepseek_noq.json", DEEPSEEK_NOQ, "tp=2,pp=2", "tp=2,dp=2,ep=4", 0, 0);
  reshard("deepseek_noq.json", DEEPSEEK_NOQ, "dp=2,ep=2", "tp=2,dp=2,ep=4,sp_moe=0", 0, 0);
  /* tied: vLLM's lm_head (last stage; the one stage at pp 1) is filled
   * from the embedding */
  reshard("deepseek_tied.json", DEEPSEEK_TIED, "tp=2,pp=2,ep=2,etp=1", "tp=2,pp=2,ep=2", 0, 0);
  reshard("deepseek_tied.json", DEEPSEEK_TIED, "tp=2,ep=2,etp=1", "tp=4,ep=4", 1, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(published_parameter_totals),
      cmocka_unit_test(published_non_embedding_totals),
      cmocka_unit_test(shipped_tensor_shapes),
      cmocka_unit_test(layer_truncation),
      cmocka_unit_test(synthetic_tensor_lists),
      cmocka_unit_test(config_errors),
      cmocka_unit_test(fp8_unquantized_modules),
      cmocka_unit_test(fsdp_layouts),
      cmocka_unit_test(parallel_spec_parsing),
      cmocka_unit_test(invalid_parallel_combinations),
      cmocka_unit_test(e2e_llama),
      cmocka_unit_test(e2e_qwen2_bias_tied),
      cmocka_unit_test(e2e_qwen3_qk_norm),
      cmocka_unit_test(e2e_qwen3_moe),
      cmocka_unit_test(e2e_mixtral),
      cmocka_unit_test(e2e_deepseek_v3),
  };
  return cmocka_run_group_tests(tests, setup_tmpdir, remove_tmpdir);
}
