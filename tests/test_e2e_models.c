/* End to end on small transformer layouts (bench/model_layouts.c):
 * Megatron training layouts to vLLM inference layouts, byte-exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "layout/layout.h"
#include "model_layouts.h"
#include "reshard.h"
#include "support/harness.h"

static ml_model small_dense(void) {
  ml_model m = {.layers = 4, .hidden = 64, .heads = 8, .kv_heads = 2, .head_dim = 8, .intermediate = 96,
                .vocab = 1000, .dtype = RESHARD_BF16};
  return m;
}

static ml_model small_moe(void) {
  ml_model m = small_dense();
  m.experts = 8;
  m.moe_intermediate = 32;
  return m;
}

/* Builds both sides, runs `steps` reshards over the in-process transport
 * and checks every destination byte (and every byte around fragments). */
static void run_pair(const ml_model *m, const ml_megatron *s, const ml_vllm *d, int colocate, size_t staging,
                     int expect_nranks) {
  reshard_layout_t *src, *dst;
  int nranks;
  reshard_result_t r = ml_build_pair(m, s, d, colocate, &src, &dst, &nranks);
  if (r != RESHARD_SUCCESS) print_error("ml_build_pair: %s\n", reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  assert_int_equal(nranks, expect_nranks);
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 3};
  if (staging) a.opts.staging_bytes = staging;
  assert_int_equal(th_sync(nranks, &a), 0);
  /* A cheap guard against a vacuous pass (e.g. no destination buffers):
   * every destination replica of the model was received or copied. */
  size_t moved = 0;
  for (int i = 0; i < nranks; i++) moved += a.recv_bytes[i] + a.local_bytes[i];
  assert_true(moved >= (size_t)ml_num_params(m) * reshard_dtype_size(m->dtype));
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void llama_tp2pp2_to_tp2dp2(void **state) {
  (void)state;
  ml_model m = small_dense();
  ml_megatron s = {.tp = 2, .pp = 2, .dp = 1, .ep = 1};
  ml_vllm d = {.tp = 2, .dp = 2, .ep = 1};
  run_pair(&m, &s, &d, 0, 0, 8);
}

/* tp 4 > 2 KV heads: vLLM replicates each KV head on two TP ranks. Tied
 * embeddings: Megatron's last stage holds a second copy (output layer). */
static void tp2pp2dp2_to_tp4_kv_replication(void **state) {
  (void)state;
  ml_model m = small_dense();
  m.tied_embeddings = 1;
  ml_megatron s = {.tp = 2, .pp = 2, .dp = 2, .ep = 1};
  ml_vllm d = {.tp = 4, .dp = 1, .ep = 1};
  run_pair(&m, &s, &d, 0, 0, 12);
}

/* Megatron EP4 (over tp2 x dp2 of each stage) -> vLLM EP2 x expert-TP2,
 * with a staging budget small enough for many rounds. */
static void moe_ep4_to_ep2_tp2_small_staging(void **state) {
  (void)state;
  ml_model m = small_moe();
  ml_megatron s = {.tp = 2, .pp = 2, .dp = 2, .ep = 4};
  ml_vllm d = {.tp = 2, .dp = 2, .ep = 2};
  run_pair(&m, &s, &d, 0, 8192, 12);
}

/* Both sides on the same four ranks: local copies and messages mixed. */
static void colocated_tp2pp2_to_tp2dp2(void **state) {
  (void)state;
  ml_model m = small_dense();
  ml_megatron s = {.tp = 2, .pp = 2, .dp = 1, .ep = 1};
  ml_vllm d = {.tp = 2, .dp = 2, .ep = 1};
  run_pair(&m, &s, &d, 1, 0, 4);
  ml_model e = small_moe();
  ml_megatron se = {.tp = 2, .pp = 1, .dp = 2, .ep = 2};
  ml_vllm de = {.tp = 4, .dp = 1, .ep = 4};
  run_pair(&e, &se, &de, 1, 16384, 4);
}

/* The builders declare exactly the tensors ml_num_params counts, and the
 * buffers have the sizes the frameworks allocate. */
static void layout_shapes(void **state) {
  (void)state;
  ml_model models[2] = {small_dense(), small_moe()};
  for (int k = 0; k < 2; k++) {
    reshard_layout_t *src, *dst;
    int n;
    ml_megatron s = {.tp = 2, .pp = 2, .dp = 2, .ep = k ? 4 : 1};
    ml_vllm d = {.tp = 4, .dp = 1, .ep = k ? 2 : 1};
    assert_int_equal(ml_build_pair(&models[k], &s, &d, 0, &src, &dst, &n), 0);
    const reshard_layout_t *sides[2] = {src, dst};
    for (int i = 0; i < 2; i++) {
      int64_t params = 0;
      for (int t = 0; t < sides[i]->ntensors; t++) {
        int64_t c = 1;
        for (int dd = 0; dd < sides[i]->tensors[t].ndim; dd++) c *= sides[i]->tensors[t].shape[dd];
        params += c;
      }
      assert_int_equal(params, ml_num_params(&models[k]));
      assert_int_equal(sides[i]->ntensors, ml_num_tensors(&models[k]));
    }
    size_t bytes;
    /* Megatron embedding (buffer 0): vocab 1000 padded to 1024 (128 * tp),
     * half per TP rank, on stage 0 only. */
    assert_int_equal(reshard_layout_buffer_bytes(src, 0, 0, &bytes), 0);
    assert_int_equal(bytes, 512 * 64 * 2);
    assert_int_equal(reshard_layout_buffer_bytes(src, 0, 4, &bytes), 0);
    assert_int_equal(bytes, 0);
    /* vLLM qkv_proj of layer 0 on a TP rank: 64/4 q rows, then one KV
     * head (8 rows) of k and of v each: 32 rows of 64. Buffers: embed,
     * input_layernorm, qkv_proj. */
    assert_int_equal(reshard_layout_buffer_bytes(dst, 2, 8 + 3, &bytes), 0);
    assert_int_equal(bytes, 32 * 64 * 2);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
  }
}

/* Checks the k-th fragment of `buffer` on `rank`: its tensor, box and byte
 * offset, i.e. where the framework keeps that slice in memory. */
static void expect_frag(const reshard_layout_t *L, int rank, int buffer, int k, const char *tensor, int ndim,
                        const int64_t *start, const int64_t *extent, size_t byte_offset) {
  reshard_fragment_info_t f[64];
  size_t n;
  assert_int_equal(reshard_layout_fragments(L, rank, f, 64, &n), 0);
  assert_true(n <= 64);
  int seen = 0, t;
  assert_int_equal(reshard_layout_find_tensor(L, tensor, &t), 0);
  for (size_t i = 0; i < n; i++) {
    if (f[i].buffer_id != buffer || seen++ != k) continue;
    if (f[i].tensor_id != t) print_error("rank %d buffer %d fragment %d: tensor %d, expected %s\n", rank, buffer, k, f[i].tensor_id, tensor);
    assert_int_equal(f[i].tensor_id, t);
    assert_int_equal(f[i].ndim, ndim);
    for (int d = 0; d < ndim; d++) {
      assert_int_equal(f[i].start[d], start[d]);
      assert_int_equal(f[i].extent[d], extent[d]);
    }
    assert_int_equal(f[i].byte_offset, byte_offset);
    return;
  }
  print_error("rank %d buffer %d: no fragment %d (%d in the buffer)\n", rank, buffer, k, seen);
  fail();
}

#define BOX(...) ((const int64_t[]){__VA_ARGS__})

/* The in-memory arrangements the frameworks use, checked fragment by
 * fragment (the byte-exact tests cannot see a wrong arrangement: both
 * sides would agree with their own descriptions). */
static void framework_arrangements(void **state) {
  (void)state;
  ml_model m = small_dense();
  reshard_layout_t *src, *dst;
  int n;
  ml_megatron s = {.tp = 2, .pp = 2, .dp = 1, .ep = 1};
  ml_vllm d = {.tp = 4, .dp = 1, .ep = 1};
  assert_int_equal(ml_build_pair(&m, &s, &d, 0, &src, &dst, &n), 0);
  /* Megatron linear_qkv (buffer 2) on TP rank 1: KV group 1 = 4 q heads
   * (rows 32..64), then k and v head 1 (rows 8..16). */
  expect_frag(src, 1, 2, 0, "model.layers.0.self_attn.q_proj.weight", 2, BOX(32, 0), BOX(32, 64), 0);
  expect_frag(src, 1, 2, 1, "model.layers.0.self_attn.k_proj.weight", 2, BOX(8, 0), BOX(8, 64), 32 * 64 * 2);
  expect_frag(src, 1, 2, 2, "model.layers.0.self_attn.v_proj.weight", 2, BOX(8, 0), BOX(8, 64), 40 * 64 * 2);
  /* linear_fc1 (buffer 5): [gate shard; up shard]; linear_fc2 Shard(1). */
  expect_frag(src, 1, 5, 0, "model.layers.0.mlp.gate_proj.weight", 2, BOX(48, 0), BOX(48, 64), 0);
  expect_frag(src, 1, 5, 1, "model.layers.0.mlp.up_proj.weight", 2, BOX(48, 0), BOX(48, 64), 48 * 64 * 2);
  expect_frag(src, 1, 6, 0, "model.layers.0.mlp.down_proj.weight", 2, BOX(0, 48), BOX(64, 48), 0);
  /* Stage 1 (ranks 2, 3) starts at layer 2 (buffer 13); its last buffers, the
   * final norm and the padded output layer, follow layer 3 (buffers 25, 26):
   * rows 512..1000 of 1024. */
  expect_frag(src, 3, 25, 0, "model.norm.weight", 1, BOX(0), BOX(64), 0);
  expect_frag(src, 3, 26, 0, "lm_head.weight", 2, BOX(512, 0), BOX(488, 64), 0);
  /* vLLM qkv_proj (buffer 2) on TP rank 3 of 4 (global rank 7): q rows
   * 48..64, then KV head 1 (shared with TP rank 2) of k and of v. */
  expect_frag(dst, 7, 2, 0, "model.layers.0.self_attn.q_proj.weight", 2, BOX(48, 0), BOX(16, 64), 0);
  expect_frag(dst, 7, 2, 1, "model.layers.0.self_attn.k_proj.weight", 2, BOX(8, 0), BOX(8, 64), 16 * 64 * 2);
  expect_frag(dst, 7, 2, 2, "model.layers.0.self_attn.v_proj.weight", 2, BOX(8, 0), BOX(8, 64), 24 * 64 * 2);
  expect_frag(dst, 6, 2, 1, "model.layers.0.self_attn.k_proj.weight", 2, BOX(8, 0), BOX(8, 64), 16 * 64 * 2);
  /* gate_up_proj (buffer 5) on TP rank 1: rows 24..48 of gate, then up. */
  expect_frag(dst, 5, 5, 1, "model.layers.0.mlp.up_proj.weight", 2, BOX(24, 0), BOX(24, 64), 24 * 64 * 2);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);

  ml_model e = small_moe();
  ml_megatron se = {.tp = 2, .pp = 2, .dp = 2, .ep = 4};
  ml_vllm de = {.tp = 2, .dp = 2, .ep = 2};
  assert_int_equal(ml_build_pair(&e, &se, &de, 0, &src, &dst, &n), 0);
  /* Megatron experts.linear_fc1 (buffer 6) on stage rank 2: experts 4..6,
   * each [gate_e; up_e]: local [2, 64, 64]. Rank 6 is the same position
   * on stage 1, whose layer 2 fc2 is buffer 1 + 2 * 7 + 6. */
  expect_frag(src, 2, 6, 0, "model.layers.0.mlp.experts.gate_proj.weight", 3, BOX(4, 0, 0), BOX(2, 32, 64), 0);
  expect_frag(src, 2, 6, 1, "model.layers.0.mlp.experts.up_proj.weight", 3, BOX(4, 0, 0), BOX(2, 32, 64), 32 * 64 * 2);
  expect_frag(src, 6, 21, 0, "model.layers.2.mlp.experts.down_proj.weight", 3, BOX(4, 0, 0), BOX(2, 64, 32), 0);
  /* vLLM w13 (buffer 6) on rank 8+3: ep coordinate 1 (experts 4..8),
   * expert-TP coordinate 1 (intermediate 16..32); w2 splits dim 2. */
  expect_frag(dst, 11, 6, 0, "model.layers.0.mlp.experts.gate_proj.weight", 3, BOX(4, 16, 0), BOX(4, 16, 64), 0);
  expect_frag(dst, 11, 6, 1, "model.layers.0.mlp.experts.up_proj.weight", 3, BOX(4, 16, 0), BOX(4, 16, 64), 16 * 64 * 2);
  expect_frag(dst, 11, 7, 0, "model.layers.0.mlp.experts.down_proj.weight", 3, BOX(4, 0, 16), BOX(4, 64, 16), 0);
  expect_frag(dst, 9, 5, 0, "model.layers.0.mlp.gate.weight", 2, BOX(0, 0), BOX(8, 64), 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void rejects_impossible_configs(void **state) {
  (void)state;
  ml_model m = small_dense();
  reshard_layout_t *L = NULL;
  ml_megatron tp4 = {.tp = 4, .pp = 1, .dp = 1, .ep = 1}; /* 2 query groups */
  assert_int_equal(ml_megatron_layout(&m, &tp4, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
  ml_vllm tp3 = {.tp = 3, .dp = 1, .ep = 1};
  assert_int_equal(ml_vllm_layout(&m, &tp3, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  ml_model e = small_moe();
  ml_megatron ep3 = {.tp = 2, .pp = 1, .dp = 3, .ep = 3}; /* 8 experts */
  assert_int_equal(ml_megatron_layout(&e, &ep3, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  ml_vllm ep8 = {.tp = 2, .dp = 2, .ep = 8}; /* 8 > tp*dp */
  assert_int_equal(ml_vllm_layout(&e, &ep8, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layout_shapes),
      cmocka_unit_test(framework_arrangements),
      cmocka_unit_test(rejects_impossible_configs),
      cmocka_unit_test(llama_tp2pp2_to_tp2dp2),
      cmocka_unit_test(tp2pp2dp2_to_tp4_kv_replication),
      cmocka_unit_test(moe_ep4_to_ep2_tp2_small_staging),
      cmocka_unit_test(colocated_tp2pp2_to_tp2dp2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
