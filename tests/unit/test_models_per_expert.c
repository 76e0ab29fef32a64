/* The model front-end's per-expert mode (one logical tensor per routed
 * expert and projection, the checkpoint's HF naming) and fp8 block scales
 * (weight_scale_inv tensors): tensor lists and parameter totals against
 * the stacked mode, the frameworks' buffers byte for byte against the
 * stacked mode's, block-scale shapes and the checks of their splits, and
 * byte-exact per-expert -> per-expert reshards over the in-process
 * transport. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout.h"
#include "reshard_models.h"
#include "reshard.h"
#include "support/harness.h"

#if !defined(RESHARD_CONFIG_DIR) || !defined(RESHARD_TEST_DATA)
#error "RESHARD_CONFIG_DIR and RESHARD_TEST_DATA must name configs/ and tests/data/"
#endif

/* ---------------------------------------------------------------- helpers */

static const char *path_of(const char *dir, const char *file) {
  static char path[8][512];
  static int next;
  char *p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", dir, file);
  return p;
}
#define SHIPPED(f) path_of(RESHARD_CONFIG_DIR, f)
#define DATA(f) path_of(RESHARD_TEST_DATA, f)

static rm_model *load(const char *path, int layers, int per_expert, int block_scales) {
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.layers = layers;
  o.per_expert = per_expert;
  o.block_scales = block_scales;
  rm_model *m = NULL;
  reshard_result_t r = rm_model_load_ex(path, &o, &m);
  if (r) print_error("rm_model_load_ex(%s): %s\n", path, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return m;
}

static const rm_tensor *find(const rm_model *m, const char *name) {
  for (int i = 0; i < rm_model_num_tensors(m); i++)
    if (!strcmp(rm_model_tensor(m, i)->name, name)) return rm_model_tensor(m, i);
  return NULL;
}

static void expect_tensor(const rm_model *m, const char *name, reshard_dtype_t dtype, int ndim, int64_t d0, int64_t d1,
                          int64_t d2) {
  const rm_tensor *t = find(m, name);
  if (!t) print_error("%s: no tensor '%s'\n", rm_model_path(m), name);
  assert_non_null(t);
  const int64_t want[3] = {d0, d1, d2};
  assert_int_equal(t->ndim, ndim);
  for (int d = 0; d < ndim; d++) {
    if (t->shape[d] != want[d])
      print_error("%s: shape[%d] = %lld, expected %lld\n", name, d, (long long)t->shape[d], (long long)want[d]);
    assert_int_equal(t->shape[d], want[d]);
  }
  if (t->dtype != dtype) print_error("%s: dtype %s, expected %s\n", name, reshard_dtype_name(t->dtype), reshard_dtype_name(dtype));
  assert_int_equal(t->dtype, dtype);
}

/* Stacked routed-expert tensors of a model (3 per MoE layer). */
static int count_suffix(const rm_model *m, const char *const *suffixes, int n) {
  int c = 0;
  for (int i = 0; i < rm_model_num_tensors(m); i++) {
    const char *name = rm_model_tensor(m, i)->name;
    for (int k = 0; k < n; k++) {
      size_t a = strlen(name), b = strlen(suffixes[k]);
      c += a >= b && !strcmp(name + a - b, suffixes[k]);
    }
  }
  return c;
}

static const char *const stacked_suffixes[] = {
    ".mlp.experts.gate_proj.weight",          ".mlp.experts.up_proj.weight",
    ".mlp.experts.down_proj.weight",          ".block_sparse_moe.experts.w1.weight",
    ".block_sparse_moe.experts.w3.weight",    ".block_sparse_moe.experts.w2.weight"};

static rm_parallel par(const char *spec) {
  rm_parallel p;
  reshard_result_t r = rm_parse_parallel(spec, &p);
  if (r) print_error("rm_parse_parallel(%s): %s\n", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return p;
}

static reshard_layout_t *layout(const rm_model *m, int vllm_side, const char *spec, int first) {
  rm_parallel p = par(spec);
  reshard_layout_t *L = NULL;
  reshard_result_t r = vllm_side ? rm_vllm_layout(m, &p, first, &L) : rm_megatron_layout(m, &p, first, &L);
  if (r) print_error("%s %s: %s\n", vllm_side ? "vllm" : "megatron", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return L;
}

/* ------------------------------------------------ tensor lists and totals */

/* Per-expert lists replace each MoE layer's 3 stacked tensors by 3 per
 * expert, and keep every parameter. */
static void counts_and_totals(void **state) {
  (void)state;
  const char *configs[] = {SHIPPED("Kimi-K2-Instruct.json"), SHIPPED("DeepSeek-V3.json"),
                           SHIPPED("Qwen3-30B-A3B.json"),    SHIPPED("Mixtral-8x7B-v0.1.json"),
                           DATA("tiny-qwen3-moe.json"),      DATA("tiny-deepseek-v3.json")};
  for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
    rm_model *s = load(configs[i], 0, 0, 0), *p = load(configs[i], 0, 1, 0);
    int E = rm_model_num_experts(s);
    int moe_layers = count_suffix(s, stacked_suffixes, 6) / 3;
    assert_true(E > 0 && moe_layers > 0);
    assert_int_equal(count_suffix(p, stacked_suffixes, 6), 0);
    assert_int_equal(rm_model_num_tensors(p), rm_model_num_tensors(s) - 3 * moe_layers + 3 * E * moe_layers);
    assert_int_equal(rm_model_num_params(p), rm_model_num_params(s));
    assert_true(rm_model_per_expert(p) && !rm_model_per_expert(s));
    rm_model_free(s);
    rm_model_free(p);
  }
  /* Kimi-K2: 60 MoE layers (first_k_dense_replace 1) of 384 experts */
  rm_model *k = load(SHIPPED("Kimi-K2-Instruct.json"), 0, 1, 0);
  expect_tensor(k, "model.layers.1.mlp.experts.0.gate_proj.weight", RESHARD_BF16, 2, 2048, 7168, 0);
  expect_tensor(k, "model.layers.60.mlp.experts.383.up_proj.weight", RESHARD_BF16, 2, 2048, 7168, 0);
  expect_tensor(k, "model.layers.60.mlp.experts.383.down_proj.weight", RESHARD_BF16, 2, 7168, 2048, 0);
  assert_null(find(k, "model.layers.0.mlp.experts.0.gate_proj.weight")); /* dense layer */
  assert_null(find(k, "model.layers.1.mlp.experts.384.gate_proj.weight"));
  assert_true(rm_model_num_tensors(k) > 60 * 384 * 3);
  rm_model_free(k);
  rm_model *x = load(SHIPPED("Mixtral-8x7B-v0.1.json"), 2, 1, 0);
  expect_tensor(x, "model.layers.1.block_sparse_moe.experts.7.w2.weight", RESHARD_BF16, 2, 4096, 14336, 0);
  rm_model_free(x);
}

/* Block scales: every linear weight but the router is fp8 and followed by
 * its fp32 weight_scale_inv of ceil-divided shape; other tensors keep the
 * model's dtype; parameters exclude the scales. */
static void block_scale_tensors(void **state) {
  (void)state;
  for (int pe = 0; pe < 2; pe++) {
    rm_model *plain = load(SHIPPED("Kimi-K2-Instruct.json"), 3, pe, 0), *q = load(SHIPPED("Kimi-K2-Instruct.json"), 3, pe, 1);
    assert_true(rm_model_block_scales(q));
    assert_int_equal(rm_model_num_params(q), rm_model_num_params(plain));
    int fp8 = 0, scales = 0;
    for (int i = 0; i < rm_model_num_tensors(q); i++) {
      const rm_tensor *t = rm_model_tensor(q, i);
      const char *sfx = strstr(t->name, ".weight_scale_inv");
      if (t->dtype == RESHARD_FP8_E4M3) {
        fp8++;
        assert_true(t->scale > i);
        const rm_tensor *s = rm_model_tensor(q, t->scale);
        assert_int_equal(s->dtype, RESHARD_FP32);
        assert_int_equal(s->ndim, t->ndim);
        for (int d = 0; d < t->ndim; d++) {
          int64_t blk = d == t->ndim - 2 || d == t->ndim - 1 ? 128 : 1;
          assert_int_equal(s->shape[d], (t->shape[d] + blk - 1) / blk);
        }
        char want[300];
        snprintf(want, sizeof want, "%.*s.weight_scale_inv", (int)(strlen(t->name) - 7), t->name);
        assert_string_equal(s->name, want);
      } else if (sfx) {
        scales++;
        assert_int_equal(t->dtype, RESHARD_FP32);
      } else {
        /* e_score_correction_bias is fp32 in the checkpoint, vLLM and Megatron */
        assert_int_equal(t->dtype, strstr(t->name, "e_score_correction_bias") ? RESHARD_FP32 : RESHARD_BF16);
        assert_int_equal(t->scale, -1);
        assert_null(strstr(t->name, "_proj.weight")); /* every projection is quantized */
      }
    }
    assert_true(fp8 > 0);
    assert_int_equal(fp8, scales);
    assert_int_equal(rm_model_num_tensors(q), rm_model_num_tensors(plain) + fp8);
    rm_model_free(plain);
    rm_model_free(q);
  }
  rm_model *q = load(SHIPPED("Kimi-K2-Instruct.json"), 2, 1, 1);
  expect_tensor(q, "model.layers.1.mlp.experts.5.gate_proj.weight", RESHARD_FP8_E4M3, 2, 2048, 7168, 0);
  expect_tensor(q, "model.layers.1.mlp.experts.5.gate_proj.weight_scale_inv", RESHARD_FP32, 2, 16, 56, 0);
  expect_tensor(q, "model.layers.1.mlp.experts.5.down_proj.weight_scale_inv", RESHARD_FP32, 2, 56, 16, 0);
  /* kv_a_proj_with_mqa: 512 + 64 = 576 rows, 4.5 blocks: ceil */
  expect_tensor(q, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", RESHARD_FP32, 2, 5, 56, 0);
  expect_tensor(q, "model.layers.0.mlp.gate_proj.weight_scale_inv", RESHARD_FP32, 2, 144, 56, 0);
  expect_tensor(q, "model.layers.1.mlp.gate.weight", RESHARD_BF16, 2, 384, 7168, 0);
  assert_null(find(q, "model.layers.1.mlp.gate.weight_scale_inv"));
  assert_null(find(q, "model.embed_tokens.weight_scale_inv"));
  rm_model_free(q);
  /* stacked experts keep their leading expert dim */
  rm_model *st = load(SHIPPED("Kimi-K2-Instruct.json"), 2, 0, 1);
  expect_tensor(st, "model.layers.1.mlp.experts.up_proj.weight_scale_inv", RESHARD_FP32, 3, 384, 16, 56);
  rm_model_free(st);
}

static void block_scale_errors(void **state) {
  (void)state;
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.block_scales = 1;
  rm_model *m = NULL;
  assert_int_equal(rm_model_load_ex(DATA("tiny-deepseek-v3.json"), &o, &m), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(m);
  assert_non_null(strstr(reshard_last_error(), "quantization_config.weight_block_size"));
  assert_int_equal(rm_model_load_ex(DATA("tiny-deepseek-v3.json"), NULL, &m), RESHARD_ERROR_INVALID_ARGUMENT);
  /* tiny fp8 blocks are [4, 8]: the expert down_proj's in dim (16) over
   * etp 4 gives pieces of 4, not whole blocks of 8 */
  rm_model *q = load(DATA("tiny-deepseek-v3-fp8.json"), 0, 1, 1);
  rm_parallel p = par("tp=4,ep=1,etp=4");
  reshard_layout_t *L = NULL;
  assert_int_equal(rm_megatron_layout(q, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
  assert_non_null(strstr(reshard_last_error(), "down_proj.weight"));
  assert_non_null(strstr(reshard_last_error(), "whole blocks of 8"));
  p = par("tp=4");
  assert_int_equal(rm_vllm_layout(q, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
  assert_non_null(strstr(reshard_last_error(), "down_proj.weight"));
  rm_model_free(q);
}

/* ------------------------------------ buffers: the stacked mode's bytes */

/* The fragment of `tensor` in buffer `buffer` on rank in layout L, or
 * fails. */
static reshard_fragment_info_t frag_of(const reshard_layout_t *L, int rank, const char *tensor, int buffer) {
  int id;
  assert_int_equal(reshard_layout_find_tensor(L, tensor, &id), RESHARD_SUCCESS);
  size_t n = 0;
  assert_int_equal(reshard_layout_fragments(L, rank, NULL, 0, &n), RESHARD_SUCCESS);
  reshard_fragment_info_t *f = calloc(n + 1, sizeof *f), out;
  assert_int_equal(reshard_layout_fragments(L, rank, f, n, &n), RESHARD_SUCCESS);
  int found = 0;
  for (size_t i = 0; i < n; i++)
    if (f[i].tensor_id == id && f[i].buffer_id == buffer) out = f[i], found++;
  if (found != 1) print_error("rank %d: %d fragments of '%s' in buffer %d\n", rank, found, tensor, buffer);
  assert_int_equal(found, 1);
  free(f);
  return out;
}

static int buffer_named(const reshard_layout_t *L, const char *name, int rank) {
  int b = -1;
  if (reshard_layout_find_buffer(L, name, rank, &b)) {
    print_error("%s\n", reshard_last_error());
    fail();
  }
  return b;
}

/* Per-expert fragment of projection k of expert e on rank against the
 * stacked fragment in the same buffer on the same rank: the same element
 * strides, and the byte offset of element (e, i, h) of the stacked
 * fragment. */
static void expect_same_bytes(const reshard_layout_t *P, const reshard_layout_t *S, const char *layer_prefix, int e,
                              const char *proj, int rank, int buf, size_t es) {
  char pn[256], sn[256];
  snprintf(pn, sizeof pn, "%s.experts.%d.%s.weight", layer_prefix, e, proj);
  snprintf(sn, sizeof sn, "%s.experts.%s.weight", layer_prefix, proj);
  reshard_fragment_info_t pf = frag_of(P, rank, pn, buf), sf = frag_of(S, rank, sn, buf);
  assert_true(sf.start[0] <= e && e < sf.start[0] + sf.extent[0]);
  assert_int_equal(pf.ndim, 2);
  for (int d = 0; d < 2; d++) {
    assert_int_equal(pf.start[d], sf.start[d + 1]);
    assert_int_equal(pf.extent[d], sf.extent[d + 1]);
    assert_int_equal(pf.strides[d], sf.strides[d + 1]);
  }
  size_t at = sf.byte_offset + (size_t)(e - sf.start[0]) * (size_t)sf.strides[0] * es;
  assert_int_equal(pf.byte_offset, at);
}

/* Both expert modes give the same buffers: the same names and sizes on
 * every rank, every expert's bytes at the same place. */
static void expect_same_buffers(const reshard_layout_t *P, const reshard_layout_t *S, int nranks) {
  assert_int_equal(reshard_layout_num_buffers(P), reshard_layout_num_buffers(S));
  for (int b = 0; b < S->nbuffers; b++) {
    assert_string_equal(P->buffers[b].name, S->buffers[b].name);
    for (int r = 0; r < nranks; r++) {
      size_t x, y;
      assert_int_equal(reshard_layout_buffer_bytes(S, b, r, &x), 0);
      assert_int_equal(reshard_layout_buffer_bytes(P, b, r, &y), 0);
      assert_int_equal(x, y);
    }
  }
}

static void buffers_match_stacked(void **state) {
  (void)state;
  rm_model *s = load(DATA("tiny-qwen3-moe.json"), 0, 0, 0), *p = load(DATA("tiny-qwen3-moe.json"), 0, 1, 0);
  const int E = 8;
  const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
  /* vLLM: w13 / w2 hold EP rank r's experts (linear placement), the EP
   * ranks of stage 0 being the ranks f % tp + tp * pp * (f / tp) */
  const char *vspecs[] = {"tp=4,ep=4", "tp=2,dp=2,ep=4", "tp=4", "tp=2,pp=2,dp=2,ep=4", "tp=2,dp=3,ep=6"};
  for (size_t v = 0; v < sizeof vspecs / sizeof *vspecs; v++) {
    reshard_layout_t *VS = layout(s, 1, vspecs[v], 0), *VP = layout(p, 1, vspecs[v], 0);
    rm_parallel pp = par(vspecs[v]);
    const int flat = pp.tp * pp.dp, per_ep = flat / pp.ep, base = E / pp.ep, rem = E % pp.ep;
    expect_same_buffers(VP, VS, rm_parallel_ranks(&pp));
    for (int e = 0; e < E; e++) {
      /* EP rank of e: the first `rem` ranks hold base + 1 */
      int er = e < rem * (base + 1) ? e / (base + 1) : rem + (e - rem * (base + 1)) / base;
      for (int j = 0; j < per_ep; j++) {
        int f = er * per_ep + j, rank = f % pp.tp + pp.tp * pp.pp * (f / pp.tp);
        /* layer 1 lies on the first stage in every spec here */
        int w13 = buffer_named(VS, "model.layers.1.mlp.experts.routed_experts.w13_weight", rank);
        int w2 = buffer_named(VS, "model.layers.1.mlp.experts.routed_experts.w2_weight", rank);
        for (int k = 0; k < 3; k++) expect_same_bytes(VP, VS, "model.layers.1.mlp", e, proj[k], rank, k < 2 ? w13 : w2, 2);
      }
    }
    reshard_layout_destroy(VS);
    reshard_layout_destroy(VP);
  }
  /* Megatron (TEGroupedMLP): linear_fc{1,2}.weight<i> holds expert
   * r * E/ep + i on EP rank r, in both modes */
  const char *mspecs[] = {"tp=2,dp=2,ep=4,etp=1", "tp=2,pp=2,dp=2,ep=2,etp=2", "tp=2,dp=2,ep=2"};
  for (size_t v = 0; v < sizeof mspecs / sizeof *mspecs; v++) {
    reshard_layout_t *MS = layout(s, 0, mspecs[v], 0), *MP = layout(p, 0, mspecs[v], 0);
    rm_parallel pp = par(mspecs[v]);
    const int etp = pp.etp ? pp.etp : pp.tp, elocal = E / pp.ep, stage = pp.tp * pp.dp;
    expect_same_buffers(MP, MS, rm_parallel_ranks(&pp));
    for (int rank = 0; rank < stage; rank++) {
      int er = (rank / etp) % pp.ep; /* grid [edp, ep, etp], etp fastest */
      for (int i = 0; i < elocal; i++) {
        char n1[128], n2[128];
        snprintf(n1, sizeof n1, "decoder.layers.1.mlp.experts.linear_fc1.weight%d", i);
        snprintf(n2, sizeof n2, "decoder.layers.1.mlp.experts.linear_fc2.weight%d", i);
        int p1 = buffer_named(MS, n1, rank), p2 = buffer_named(MS, n2, rank), e = er * elocal + i;
        for (int k = 0; k < 2; k++) expect_same_bytes(MP, MS, "model.layers.1.mlp", e, proj[k], rank, p1, 2);
        expect_same_bytes(MP, MS, "model.layers.1.mlp", e, proj[2], rank, p2, 2);
      }
    }
    reshard_layout_destroy(MS);
    reshard_layout_destroy(MP);
  }
  rm_model_free(s);
  rm_model_free(p);
}

/* ----------------------------------------------- end-to-end reshards */

static size_t model_bytes(const rm_model *m) {
  size_t total = 0;
  for (int i = 0; i < rm_model_num_tensors(m); i++) {
    const rm_tensor *t = rm_model_tensor(m, i);
    size_t n = reshard_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    total += n;
  }
  return total;
}

/* Per-expert Megatron `src` -> per-expert vLLM `dst`, every destination
 * byte (and every byte around the fragments) checked over two steps. */
static void reshard(const char *config, int block_scales, const char *src, const char *dst, int colocate,
                    size_t staging) {
  rm_model *m = load(DATA(config), 0, 1, block_scales);
  rm_parallel s = par(src), d = par(dst);
  int S = rm_parallel_ranks(&s), D = rm_parallel_ranks(&d);
  reshard_layout_t *sl = layout(m, 0, src, 0), *dl = layout(m, 1, dst, colocate ? 0 : S);
  int nranks = colocate ? (S > D ? S : D) : S + D;
  th_sync_args a = {.src = sl, .dst = dl, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  if (staging) a.opts.staging_bytes = staging;
  int64_t bad = th_sync(nranks, &a);
  if (bad) print_error("%s%s: megatron %s -> vllm %s%s: %lld wrong\n", config, block_scales ? " (block scales)" : "",
                       src, dst, colocate ? " (colocated)" : "", (long long)bad);
  assert_int_equal(bad, 0);
  /* not vacuous: at least one copy of every tensor arrived */
  size_t moved = 0;
  for (int i = 0; i < nranks; i++) moved += a.recv_bytes[i] + a.local_bytes[i];
  assert_true(moved >= model_bytes(m));
  reshard_layout_destroy(sl);
  reshard_layout_destroy(dl);
  rm_model_free(m);
}

static void e2e_qwen3_moe_per_expert(void **state) {
  (void)state;
  reshard("tiny-qwen3-moe.json", 0, "tp=2,dp=2,ep=4,etp=1", "tp=2,dp=2,ep=4", 0, 0);
  reshard("tiny-qwen3-moe.json", 0, "tp=2,pp=2,dp=2,ep=2,etp=2", "tp=4", 0, 0);
  reshard("tiny-qwen3-moe.json", 0, "tp=2,dp=2,ep=2", "tp=4,ep=4", 1, 8192);
  reshard("tiny-qwen3-moe.json", 0, "tp=2,dp=2,ep=4,etp=1", "tp=2,pp=2,dp=2,ep=4", 0, 0);
  reshard("tiny-qwen3-moe.json", 0, "tp=2,ep=2,etp=1,grouped_gemm=0", "tp=2,dp=3,ep=6", 0, 0);
}

static void e2e_deepseek_v3_per_expert(void **state) {
  (void)state;
  reshard("tiny-deepseek-v3.json", 0, "tp=2,pp=2,dp=2,ep=4,etp=1", "tp=4,ep=4", 0, 0);
  reshard("tiny-deepseek-v3.json", 0, "tp=2,dp=2,ep=2,etp=2", "tp=2,dp=2,ep=4", 0, 0);
  reshard("tiny-deepseek-v3.json", 0, "tp=2,pp=2,ep=2,etp=1", "tp=4,ep=4", 1, 8192);
}

static void e2e_deepseek_v3_fp8_block_scales(void **state) {
  (void)state;
  reshard("tiny-deepseek-v3-fp8.json", 1, "tp=2,pp=2,dp=2,ep=4,etp=1", "tp=4,ep=4", 0, 0);
  reshard("tiny-deepseek-v3-fp8.json", 1, "tp=2,dp=2,ep=2,etp=2", "tp=2,dp=2,ep=4", 0, 0);
  reshard("tiny-deepseek-v3-fp8.json", 1, "tp=2,pp=2,ep=2,etp=1", "tp=4,ep=4", 1, 8192);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(counts_and_totals),
      cmocka_unit_test(block_scale_tensors),
      cmocka_unit_test(block_scale_errors),
      cmocka_unit_test(buffers_match_stacked),
      cmocka_unit_test(e2e_qwen3_moe_per_expert),
      cmocka_unit_test(e2e_deepseek_v3_per_expert),
      cmocka_unit_test(e2e_deepseek_v3_fp8_block_scales),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
